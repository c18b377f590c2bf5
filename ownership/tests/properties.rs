//! Model-based property tests over random command sequences (proptest; failures shrink to
//! a minimal sequence). After every step: the state invariants hold, epochs never decrease
//! (a forgotten artifact that comes back is owned above every epoch it had) and strictly
//! increase whenever a key's owner changes, and a key whose owner's lease is
//! still live is only ever taken by an explicit release, forget, migration, revocation or
//! epoch CAS.
//! At the end: replaying the log gives the same state, and the snapshot round-trips.
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::collections::BTreeMap;

use ownerserve_ownership::command::ArtifactSpec;
use ownerserve_ownership::ids::{
    ClientId, Epoch, Key, LeaseId, PrefixKey, SessionId, Tier, WorkerId,
};
use ownerserve_ownership::state::Owner;
use ownerserve_ownership::{invariants, Command, Directory, Envelope, Outcome};
use proptest::prelude::*;

/// An epoch argument: the key's current one, or an arbitrary (probably stale) one.
#[derive(Debug, Clone, Copy)]
enum Cas {
    Current,
    Stale(u8),
}

#[derive(Debug, Clone)]
enum Op {
    Grant {
        worker: u8,
        ttl_s: u8,
    },
    KeepAlive {
        slot: u8,
    },
    Revoke {
        slot: u8,
    },
    Tick,
    Claim {
        key: u8,
        slot: u8,
        cas: Option<Cas>,
    },
    Extend {
        key: u8,
        parent: u8,
        cas: Cas,
    },
    Release {
        key: u8,
        cas: Cas,
    },
    /// Forgets an artifact idle for `idle_s` seconds (refused while referenced).
    Forget {
        key: u8,
        cas: Cas,
        idle_s: u8,
    },
    Replicate {
        key: u8,
        worker: u8,
    },
    Migrate {
        key: u8,
        slot: u8,
        cas: Cas,
    },
    SetDecodeOwner {
        session: u8,
        slot: u8,
        prefix: Option<u8>,
        cas: Option<Cas>,
    },
    Fork {
        parent: u8,
        child: u8,
        slot: u8,
        cas: Cas,
    },
    End {
        session: u8,
        cas: Cas,
    },
    Pin {
        session: u8,
        cas: Cas,
        pinned: bool,
    },
    /// Records stored response `id` under a lease.
    Respond {
        id: u8,
        slot: u8,
    },
    /// Re-sends the previous command with the same idempotency key.
    Retry,
    /// Several of the above in one entry.
    Batch(Vec<Op>),
}

fn cas() -> impl Strategy<Value = Cas> {
    prop_oneof![3 => Just(Cas::Current), 1 => (0u8..40).prop_map(Cas::Stale)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        9 => single_op(),
        1 => proptest::collection::vec(single_op(), 2..5).prop_map(Op::Batch),
    ]
}

fn single_op() -> impl Strategy<Value = Op> {
    let k = 0u8..5;
    let slot = 0u8..8;
    prop_oneof![
        3 => (0u8..3, 1u8..8).prop_map(|(worker, ttl_s)| Op::Grant { worker, ttl_s }),
        3 => slot.clone().prop_map(|slot| Op::KeepAlive { slot }),
        1 => slot.clone().prop_map(|slot| Op::Revoke { slot }),
        2 => Just(Op::Tick),
        5 => (k.clone(), slot.clone(), proptest::option::of(cas())).prop_map(|(key, slot, cas)| Op::Claim { key, slot, cas }),
        2 => (k.clone(), k.clone(), cas()).prop_map(|(key, parent, cas)| Op::Extend { key, parent, cas }),
        2 => (k.clone(), cas()).prop_map(|(key, cas)| Op::Release { key, cas }),
        2 => (k.clone(), cas(), 0u8..3).prop_map(|(key, cas, idle_s)| Op::Forget { key, cas, idle_s }),
        2 => (k.clone(), 0u8..3).prop_map(|(key, worker)| Op::Replicate { key, worker }),
        2 => (k.clone(), slot.clone(), cas()).prop_map(|(key, slot, cas)| Op::Migrate { key, slot, cas }),
        3 => (0u8..4, slot.clone(), proptest::option::of(k.clone()), proptest::option::of(cas()))
            .prop_map(|(session, slot, prefix, cas)| Op::SetDecodeOwner { session, slot, prefix, cas }),
        2 => (0u8..4, 0u8..4, slot.clone(), cas()).prop_map(|(parent, child, slot, cas)| Op::Fork { parent, child, slot, cas }),
        1 => (0u8..4, cas()).prop_map(|(session, cas)| Op::End { session, cas }),
        1 => (0u8..4, cas(), any::<bool>()).prop_map(|(session, cas, pinned)| Op::Pin { session, cas, pinned }),
        2 => (0u8..6, slot.clone()).prop_map(|(id, slot)| Op::Respond { id, slot }),
        1 => Just(Op::Retry),
    ]
}

fn session(n: u8) -> SessionId {
    SessionId(format!("s{n}"))
}

fn spec(parent: Option<PrefixKey>) -> ArtifactSpec {
    ArtifactSpec {
        parent,
        blocks: (0, 16),
        kv_type: "gqa-bf16".into(),
        size_bytes: 1 << 20,
        checkpoints: Vec::new(),
    }
}

/// Turns a generated op into a command against the current state. Lease slots map onto
/// the leases that still exist (mostly live ones), so commands mostly get past the lease
/// check and exercise ownership; slot 7 sometimes names a long-gone lease.
fn command(d: &Directory, granted: &[LeaseId], op: &Op) -> Command {
    let existing: Vec<LeaseId> = d.leases.keys().copied().collect();
    let lease = |slot: u8| {
        let pool = if slot == 7 || existing.is_empty() {
            granted
        } else {
            &existing[..]
        };
        pool.get(slot as usize % pool.len().max(1))
            .copied()
            .unwrap_or(LeaseId(u64::MAX))
    };
    let prefix_epoch = |key: PrefixKey, c: Cas| match c {
        Cas::Current => d.artifacts.get(&key).map_or(Epoch(0), |a| a.epoch),
        Cas::Stale(n) => Epoch(u64::from(n)),
    };
    let session_epoch = |s: &SessionId, c: Cas| match c {
        Cas::Current => d.sessions.get(s).map_or(Epoch(0), |x| x.epoch),
        Cas::Stale(n) => Epoch(u64::from(n)),
    };
    match *op {
        Op::Grant { worker, ttl_s } => Command::GrantLease {
            worker: WorkerId(u32::from(worker)),
            ttl_ms: u64::from(ttl_s) * 1000,
        },
        Op::KeepAlive { slot } => Command::KeepAlive { lease: lease(slot) },
        Op::Revoke { slot } => Command::RevokeLease { lease: lease(slot) },
        Op::Tick | Op::Retry => Command::Tick,
        Op::Claim { key, slot, cas } => {
            let key = PrefixKey(u64::from(key));
            Command::Claim {
                key,
                lease: lease(slot),
                spec: spec(None),
                expect_epoch: cas.map(|c| prefix_epoch(key, c)),
            }
        }
        Op::Extend { key, parent, cas } => {
            let parent = PrefixKey(u64::from(parent));
            Command::Extend {
                key: PrefixKey(u64::from(key)),
                spec: spec(Some(parent)),
                parent_epoch: prefix_epoch(parent, cas),
            }
        }
        Op::Release { key, cas } => {
            let key = PrefixKey(u64::from(key));
            Command::Release {
                key,
                epoch: prefix_epoch(key, cas),
            }
        }
        Op::Forget { key, cas, idle_s } => {
            let key = PrefixKey(u64::from(key));
            Command::ForgetArtifact {
                key,
                epoch: prefix_epoch(key, cas),
                idle_ms: u64::from(idle_s) * 1000,
            }
        }
        Op::Replicate { key, worker } => Command::ReplicateReadOnly {
            key: PrefixKey(u64::from(key)),
            worker: WorkerId(u32::from(worker)),
            tier: Tier::Cpu,
        },
        Op::Migrate { key, slot, cas } => {
            let key = PrefixKey(u64::from(key));
            Command::Migrate {
                key,
                from_epoch: prefix_epoch(key, cas),
                to_lease: lease(slot),
            }
        }
        Op::SetDecodeOwner {
            session: s,
            slot,
            prefix,
            cas,
        } => Command::SetDecodeOwner {
            session: session(s),
            lease: lease(slot),
            prefix: prefix.map(|p| PrefixKey(u64::from(p))),
            tail_tokens: 10,
            predicted_tool_gap_ms: None,
            expect_epoch: cas.map(|c| session_epoch(&session(s), c)),
        },
        Op::Fork {
            parent,
            child,
            slot,
            cas,
        } => Command::Fork {
            parent: session(parent),
            child: session(child),
            lease: lease(slot),
            parent_epoch: session_epoch(&session(parent), cas),
        },
        Op::End { session: s, cas } => Command::EndSession {
            session: session(s),
            epoch: session_epoch(&session(s), cas),
        },
        Op::Pin {
            session: s,
            cas,
            pinned,
        } => Command::PinSession {
            session: session(s),
            epoch: session_epoch(&session(s), cas),
            pinned,
        },
        Op::Respond { id, slot } => Command::RecordResponse {
            id: format!("resp_{id}"),
            lease: lease(slot),
            ttl_ms: 4_000,
        },
        Op::Batch(ref ops) => Command::Batch {
            commands: ops.iter().map(|o| command(d, granted, o)).collect(),
        },
    }
}

/// Owner and epoch of every key.
fn owners(d: &Directory) -> BTreeMap<Key, (Option<Owner>, Epoch)> {
    let mut m: BTreeMap<Key, (Option<Owner>, Epoch)> = d
        .artifacts
        .iter()
        .map(|(k, a)| (Key::Prefix(*k), (a.owner, a.epoch)))
        .collect();
    m.extend(
        d.sessions
            .iter()
            .map(|(k, s)| (Key::Session(k.clone()), (s.owner, s.epoch))),
    );
    m
}

/// The key and epoch a fenced command presents, if it is fenced.
fn fence(cmd: &Command) -> Option<(Key, Epoch)> {
    match cmd {
        Command::Release { key, epoch } | Command::ForgetArtifact { key, epoch, .. } => {
            Some((Key::Prefix(*key), *epoch))
        }
        Command::Migrate {
            key, from_epoch, ..
        } => Some((Key::Prefix(*key), *from_epoch)),
        Command::Extend {
            spec, parent_epoch, ..
        } => spec.parent.map(|p| (Key::Prefix(p), *parent_epoch)),
        Command::Claim {
            key,
            expect_epoch: Some(e),
            ..
        } => Some((Key::Prefix(*key), *e)),
        Command::SetDecodeOwner {
            session,
            expect_epoch: Some(e),
            ..
        } => Some((Key::Session(session.clone()), *e)),
        Command::Fork {
            parent,
            parent_epoch,
            ..
        } => Some((Key::Session(parent.clone()), *parent_epoch)),
        Command::EndSession { session, epoch } => Some((Key::Session(session.clone()), *epoch)),
        Command::PinSession { session, epoch, .. } => Some((Key::Session(session.clone()), *epoch)),
        _ => None,
    }
}

/// The artifacts `cmd` forgot, by its `outcome`.
fn forgotten_by(cmd: &Command, outcome: &Outcome) -> Vec<Key> {
    match (cmd, outcome) {
        (Command::ForgetArtifact { key, .. }, Outcome::Forgotten) => vec![Key::Prefix(*key)],
        (Command::Batch { commands }, Outcome::Batch { outcomes }) => commands
            .iter()
            .zip(outcomes)
            .flat_map(|(c, o)| forgotten_by(c, o))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `cmd` may legitimately take `key` from a live owner holding `lease`.
fn may_take(cmd: &Command, key: &Key, lease: LeaseId) -> bool {
    match (cmd, key) {
        (Command::Batch { commands }, _) => commands.iter().any(|c| may_take(c, key, lease)),
        (Command::RevokeLease { lease: l }, _) => *l == lease,
        (
            Command::Release { key: k, .. }
            | Command::Migrate { key: k, .. }
            | Command::ForgetArtifact { key: k, .. },
            Key::Prefix(p),
        ) => k == p,
        (
            Command::Claim {
                key: k,
                expect_epoch: Some(_),
                ..
            },
            Key::Prefix(p),
        ) => k == p,
        (
            Command::SetDecodeOwner {
                session,
                expect_epoch: Some(_),
                ..
            },
            Key::Session(s),
        ) => session == s,
        (Command::EndSession { session, .. }, Key::Session(s)) => session == s,
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_histories_keep_every_safety_property(ops in proptest::collection::vec((0u64..600, op()), 1..120)) {
        let mut d = Directory::new(300);
        let mut log: Vec<(u64, Envelope)> = Vec::new();
        let mut leases: Vec<LeaseId> = Vec::new();
        let mut now_ms = 1_000;
        let mut seq = 0u64;
        let mut high_water: BTreeMap<Key, Epoch> = BTreeMap::new();
        let mut forgotten: BTreeMap<Key, Epoch> = BTreeMap::new();
        for (index, (advance, op)) in (1u64..).zip(&ops) {
            now_ms += advance;
            let env = match (op, log.last()) {
                (Op::Retry, Some((_, last))) => Envelope { now_ms, ..last.clone() },
                _ => {
                    seq += 1;
                    Envelope { now_ms, client: Some((ClientId(1), seq)), command: command(&d, &leases, op) }
                }
            };
            let before = owners(&d);
            let live_after: Vec<LeaseId> = d
                .leases
                .iter()
                .filter(|(_, l)| l.expires_at_ms + d.grace_ms > d.now_ms.max(now_ms))
                .map(|(id, _)| *id)
                .collect();
            let replayed = matches!(op, Op::Retry) && log.last().is_some();
            let outcome = d.apply(index, &env);
            // Fencing: a stale epoch is refused and leaves the key as it was.
            if let Some((key, given)) = fence(&env.command).filter(|_| !replayed) {
                if let Some((owner, current)) = before.get(&key).filter(|(_, e)| *e != given) {
                    prop_assert!(matches!(outcome, Outcome::Rejected(_)), "stale {:?} accepted: {:?}", env.command, outcome);
                    let now = owners(&d);
                    prop_assert_eq!(now.get(&key), Some(&(*owner, *current)));
                }
            }
            match &outcome {
                Outcome::LeaseGranted { lease, .. } => leases.push(*lease),
                Outcome::Batch { outcomes } => leases.extend(outcomes.iter().filter_map(|o| match o {
                    Outcome::LeaseGranted { lease, .. } => Some(*lease),
                    _ => None,
                })),
                _ => {}
            }
            prop_assert_eq!(invariants::check(&d), vec![], "after {:?}", op);
            let after = owners(&d);
            // A forgotten artifact (or ended session) starts afresh if it comes back; an
            // owner it then gets is fenced above every epoch it had before.
            // (Forgotten by this entry, or gone after it: a batch may forget a key and
            // create it again.)
            // (A retry is answered from the dedup table: it forgets nothing again.)
            let forgot = if replayed { Vec::new() } else { forgotten_by(&env.command, &outcome) };
            let gone: Vec<Key> = high_water
                .keys()
                .filter(|k| !after.contains_key(*k) || forgot.contains(*k))
                .cloned()
                .collect();
            for key in gone {
                if let Some(e) = high_water.remove(&key) {
                    let top = forgotten.entry(key).or_insert(e);
                    *top = (*top).max(e);
                }
            }
            for (key, (owner, epoch)) in &after {
                if let Some(prev) = high_water.get(key) {
                    prop_assert!(epoch >= prev, "{:?} epoch went back from {:?} to {:?}", key, prev, epoch);
                }
                if let (Some(o), Some(old)) = (owner, forgotten.get(key)) {
                    prop_assert!(o.epoch > *old, "{:?} came back owned under {:?}, not above its old {:?}", key, o.epoch, old);
                }
                if let Some((old_owner, old_epoch)) = before.get(key).filter(|_| !forgot.contains(key)) {
                    if old_owner != owner {
                        prop_assert!(epoch > old_epoch, "{:?} changed owner without a new epoch", key);
                    }
                }
                high_water.insert(key.clone(), *epoch);
            }
            for (key, (old_owner, _)) in &before {
                let Some(o) = old_owner else { continue };
                if !live_after.contains(&o.lease) || may_take(&env.command, key, o.lease) {
                    continue;
                }
                let now_owner = after.get(key).and_then(|(x, _)| *x);
                prop_assert_eq!(now_owner, Some(*o), "{:?} was taken from a live owner by {:?}", key, env.command);
            }
            log.push((index, env));
        }
        // Replaying the same log gives the same state (no hidden clock or randomness).
        let mut replay = Directory::new(300);
        for (index, env) in &log {
            replay.apply(*index, env);
        }
        prop_assert_eq!(&replay, &d);
        // And the snapshot round-trips exactly.
        let back: Directory = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        prop_assert_eq!(back, d);
    }
}
