use super::*;
use crate::command::ArtifactSpec;
use crate::ids::{ClientId, Owner, PrefixKey, SessionId, Tier};
use crate::invariants;
use crate::state::DirectoryStats;

const W0: WorkerId = WorkerId(0);
const W1: WorkerId = WorkerId(1);
const P: PrefixKey = PrefixKey(0xabc);

/// Drives a directory with increasing log indices, checking invariants after each entry.
struct Log {
    d: Directory,
    index: u64,
    now_ms: u64,
}

impl Log {
    fn new() -> Self {
        Self {
            d: Directory::new(500),
            index: 0,
            now_ms: 1_000,
        }
    }

    fn at(&mut self, now_ms: u64) -> &mut Self {
        self.now_ms = now_ms;
        self
    }

    fn run(&mut self, command: Command) -> Outcome {
        self.index += 1;
        let out = self.d.apply(
            self.index,
            &Envelope {
                now_ms: self.now_ms,
                client: None,
                command,
            },
        );
        assert_eq!(
            invariants::check(&self.d),
            vec![],
            "after entry {}",
            self.index
        );
        out
    }

    fn lease(&mut self, worker: WorkerId, ttl_ms: u64) -> LeaseId {
        match self.run(Command::GrantLease { worker, ttl_ms }) {
            Outcome::LeaseGranted { lease, .. } => lease,
            other => panic!("{other:?}"),
        }
    }
}

fn spec() -> ArtifactSpec {
    ArtifactSpec {
        parent: None,
        blocks: (0, 64),
        kv_type: "gqa-bf16".into(),
        size_bytes: 64 * 16 * 131_072,
        checkpoints: Vec::new(),
    }
}

fn claim(key: PrefixKey, lease: LeaseId) -> Command {
    Command::Claim {
        key,
        lease,
        spec: spec(),
        expect_epoch: None,
    }
}

#[test]
fn the_first_claim_owns_with_its_index_as_epoch_and_later_claims_become_replicas() {
    let mut log = Log::new();
    let a = log.lease(W0, 10_000);
    let b = log.lease(W1, 10_000);
    assert_eq!(
        log.run(claim(P, a)),
        Outcome::Owned {
            worker: W0,
            epoch: Epoch::of(3, 0)
        }
    );
    assert_eq!(
        log.run(claim(P, a)),
        Outcome::Owned {
            worker: W0,
            epoch: Epoch::of(3, 0)
        },
        "idempotent"
    );
    let held = log.run(claim(P, b));
    assert_eq!(
        held,
        Outcome::Held {
            owner: Owner {
                worker: W0,
                lease: a,
                epoch: Epoch::of(3, 0)
            }
        }
    );
    assert_eq!(
        log.d.artifacts[&P].locations.len(),
        2,
        "the loser's copy is a replica"
    );
}

#[test]
fn an_expired_owner_is_replaced_under_a_higher_epoch_and_its_writes_are_fenced() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 60_000);
    let Outcome::Owned { epoch: old, .. } = log.run(claim(P, a)) else {
        panic!()
    };
    // Past TTL + grace, before any tick: the dead owner's claim no longer stands.
    log.at(2_600);
    let Outcome::Owned { epoch: new, worker } = log.run(claim(P, b)) else {
        panic!()
    };
    assert_eq!(worker, W1);
    assert!(new > old);
    // The paused old owner comes back with its old epoch: refused.
    assert_eq!(
        log.run(Command::Release { key: P, epoch: old }),
        Outcome::Rejected(Rejection::StaleEpoch {
            current: new,
            given: old
        })
    );
    assert_eq!(
        log.run(Command::KeepAlive { lease: a }),
        Outcome::Rejected(Rejection::LeaseExpired(a))
    );
}

/// The leader proposes a `Tick` only once this time has come: before it, a tick would
/// change nothing; at it, the tick ends the lease.
#[test]
fn the_next_expiry_is_the_first_lease_end_with_grace_and_a_tick_at_it_ends_that_lease() {
    let mut log = Log::new();
    assert_eq!(log.d.next_expiry_ms(), None, "nothing can expire");
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 5_000);
    // Granted at 1,000 with 500 ms of grace.
    assert_eq!(log.d.next_expiry_ms(), Some(2_500));
    log.at(2_499);
    assert_eq!(log.run(Command::Tick), Outcome::Ticked { expired: vec![] });
    log.at(2_500);
    assert_eq!(log.run(Command::Tick), Outcome::Ticked { expired: vec![a] });
    assert_eq!(log.d.next_expiry_ms(), Some(6_500));
    log.run(Command::RevokeLease { lease: b });
    assert_eq!(log.d.next_expiry_ms(), None);
}

#[test]
fn keep_alive_renews_every_key_and_tick_expires_the_rest() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    log.run(claim(P, a));
    log.run(claim(PrefixKey(2), a));
    log.at(1_800);
    assert_eq!(
        log.run(Command::KeepAlive { lease: a }),
        Outcome::LeaseRenewed {
            expires_at_ms: 2_800
        }
    );
    log.at(3_000);
    assert_eq!(
        log.run(Command::Tick),
        Outcome::Ticked { expired: vec![] },
        "within grace"
    );
    log.at(3_300);
    assert_eq!(log.run(Command::Tick), Outcome::Ticked { expired: vec![a] });
    assert!(log
        .d
        .artifacts
        .values()
        .all(|x| x.owner.is_none() && x.needs_recompute));
}

#[test]
fn expiry_passes_ownership_to_a_live_replica_holder_or_marks_recompute() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 60_000);
    let Outcome::Owned { epoch: e0, .. } = log.run(claim(P, a)) else {
        panic!()
    };
    log.run(Command::ReplicateReadOnly {
        key: P,
        worker: W1,
        tier: Tier::Cpu,
    });
    log.run(claim(PrefixKey(9), a));
    log.at(5_000);
    log.run(Command::Tick);
    let art = &log.d.artifacts[&P];
    let owner = art.owner.unwrap();
    assert_eq!((owner.worker, owner.lease), (W1, b));
    assert!(owner.epoch > e0);
    assert!(
        art.locations.iter().all(|l| l.worker == W1),
        "the dead worker's copies are gone"
    );
    assert!(log.d.artifacts[&PrefixKey(9)].needs_recompute);
}

#[test]
fn migration_waits_for_the_copy_and_is_a_cas_on_the_epoch() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let b = log.lease(W1, 60_000);
    let Outcome::Owned { epoch, .. } = log.run(claim(P, a)) else {
        panic!()
    };
    let migrate = |from_epoch| Command::Migrate {
        key: P,
        from_epoch,
        to_lease: b,
    };
    assert_eq!(
        log.run(migrate(epoch)),
        Outcome::Rejected(Rejection::NotReady { key: P, worker: W1 })
    );
    log.run(Command::ReplicateReadOnly {
        key: P,
        worker: W1,
        tier: Tier::Gpu,
    });
    let Outcome::Owned {
        worker,
        epoch: moved,
    } = log.run(migrate(epoch))
    else {
        panic!()
    };
    assert_eq!(worker, W1);
    assert!(matches!(
        log.run(migrate(epoch)),
        Outcome::Rejected(Rejection::StaleEpoch { .. })
    ));
    assert!(!log.d.leases[&a].keys.contains(&Key::Prefix(P)));
    assert_eq!(
        log.run(Command::Release {
            key: P,
            epoch: moved
        }),
        Outcome::Released
    );
}

#[test]
fn extend_seals_the_next_artifact_under_the_same_owner_fenced_by_the_parent() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let Outcome::Owned { epoch, .. } = log.run(claim(P, a)) else {
        panic!()
    };
    let next = ArtifactSpec {
        parent: Some(P),
        blocks: (64, 80),
        ..spec()
    };
    let extend = |parent_epoch| Command::Extend {
        key: PrefixKey(7),
        spec: next.clone(),
        parent_epoch,
    };
    assert!(matches!(
        log.run(extend(Epoch(1))),
        Outcome::Rejected(Rejection::StaleEpoch { .. })
    ));
    assert!(matches!(
        log.run(extend(epoch)),
        Outcome::Owned { worker: W0, .. }
    ));
    assert_eq!(log.d.artifacts[&PrefixKey(7)].parent, Some(P));
}

#[test]
fn forks_share_the_prefix_and_count_references() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 60_000);
    log.run(claim(P, a));
    let s = |n: &str| SessionId(n.into());
    let Outcome::Owned { epoch, .. } = log.run(Command::SetDecodeOwner {
        session: s("root"),
        lease: a,
        prefix: Some(P),
        tail_tokens: 100,
        predicted_tool_gap_ms: Some(30_000),
        expect_epoch: None,
    }) else {
        panic!()
    };
    for child in ["fork-1", "fork-2"] {
        let fork = Command::Fork {
            parent: s("root"),
            child: s(child),
            lease: b,
            parent_epoch: epoch,
        };
        assert!(matches!(log.run(fork), Outcome::Owned { worker: W1, .. }));
    }
    assert_eq!(log.d.artifacts[&P].ref_count, 3);
    let e2 = log.d.sessions[&s("fork-2")].epoch;
    assert_eq!(
        log.run(Command::EndSession {
            session: s("fork-2"),
            epoch: e2
        }),
        Outcome::SessionEnded
    );
    assert_eq!(log.d.artifacts[&P].ref_count, 2);
    // The root's decode owner dies with nothing else holding the prefix: the session waits
    // unowned for its worker to come back, then ends and releases its reference; the fork
    // on the live worker stays.
    log.at(5_000);
    log.run(Command::Tick);
    assert_eq!(log.d.sessions[&s("root")].owner, None);
    log.at(5_000 + 3 * 1_000);
    log.run(Command::Tick);
    assert!(!log.d.sessions.contains_key(&s("root")));
    assert!(log.d.lapsed.is_empty());
    assert_eq!(log.d.artifacts[&P].ref_count, 1);
}

fn owned_session(log: &mut Log, name: &str, lease: LeaseId) -> Epoch {
    match log.run(Command::SetDecodeOwner {
        session: SessionId(name.into()),
        lease,
        prefix: None,
        tail_tokens: 10,
        predicted_tool_gap_ms: None,
        expect_epoch: None,
    }) {
        Outcome::Owned { epoch, .. } => epoch,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_worker_back_within_its_grace_takes_back_the_sessions_nobody_claimed() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 60_000);
    let kept = owned_session(&mut log, "kept", a);
    owned_session(&mut log, "claimed", a);
    // W0's host is too busy to renew: its lease lapses.
    log.at(3_000);
    log.run(Command::Tick);
    let id = |n: &str| SessionId(n.into());
    assert_eq!(log.d.sessions[&id("kept")].owner, None);
    // A stale write under the old epoch is fenced.
    assert!(matches!(
        log.run(Command::SetDecodeOwner {
            session: id("kept"),
            lease: b,
            prefix: None,
            tail_tokens: 10,
            predicted_tool_gap_ms: None,
            expect_epoch: Some(kept),
        }),
        Outcome::Rejected(Rejection::StaleEpoch { .. })
    ));
    // Another router claims one of them on W1 meanwhile.
    owned_session(&mut log, "claimed", b);
    // W0 is granted a lease again: it takes back what nobody claimed, under a new epoch.
    log.at(4_000);
    let again = log.lease(W0, 1_000);
    let s = &log.d.sessions[&id("kept")];
    let owner = s.owner.unwrap();
    assert_eq!((owner.worker, owner.lease), (W0, again));
    assert!(s.epoch > kept);
    assert_eq!(log.d.sessions[&id("claimed")].owner.unwrap().worker, W1);
    assert!(log.d.lapsed.is_empty());
}

#[test]
fn a_worker_granted_again_before_its_old_lease_ends_keeps_its_sessions() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let kept = owned_session(&mut log, "s", a);
    // Its renewal came too late (the lease had lapsed), so it was granted a new one, and
    // only then did a tick end the old one.
    log.at(3_000);
    let again = log.lease(W0, 1_000);
    log.run(Command::Tick);
    let s = &log.d.sessions[&SessionId("s".into())];
    assert_eq!(s.owner.map(|o| (o.worker, o.lease)), Some((W0, again)));
    assert!(s.epoch > kept);
}

#[test]
fn a_worker_back_too_late_finds_its_sessions_ended() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    owned_session(&mut log, "s", a);
    log.at(3_000);
    log.run(Command::Tick);
    // Past three TTLs after the lapse the session ends; the worker's new lease has none.
    log.at(3_000 + 3 * 1_000);
    log.run(Command::Tick);
    let again = log.lease(W0, 1_000);
    assert!(log.d.sessions.is_empty());
    assert!(log.d.leases[&again].keys.is_empty());
}

#[test]
fn retries_get_the_first_outcome_and_time_never_goes_back() {
    let mut d = Directory::new(0);
    let env = |now_ms, seq| Envelope {
        now_ms,
        client: Some((ClientId(7), seq)),
        command: Command::GrantLease {
            worker: W0,
            ttl_ms: 100,
        },
    };
    let first = d.apply(1, &env(1_000, 1));
    assert_eq!(
        d.apply(2, &env(1_000, 1)),
        first,
        "a retry is not applied twice"
    );
    assert_eq!(d.leases.len(), 1);
    assert_eq!(
        d.apply(3, &env(1_000, 0)),
        Outcome::Rejected(Rejection::StaleRetry { given: 0, last: 1 })
    );
    d.apply(4, &env(500, 2));
    assert_eq!(
        d.now_ms, 1_000,
        "an older leader stamp does not move time back"
    );
}

#[test]
fn snapshots_round_trip_exactly() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    log.run(claim(P, a));
    log.run(Command::ReplicateReadOnly {
        key: P,
        worker: W1,
        tier: Tier::Disk,
    });
    let json = serde_json::to_string(&log.d).unwrap();
    let back: Directory = serde_json::from_str(&json).unwrap();
    assert_eq!(back, log.d);
}

#[test]
fn a_batch_applies_in_order_with_an_epoch_per_command() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let b = log.lease(W1, 60_000);
    let out = log.run(Command::Batch {
        commands: vec![
            claim(P, a),
            Command::ReplicateReadOnly {
                key: P,
                worker: W1,
                tier: Tier::Gpu,
            },
            Command::Migrate {
                key: P,
                from_epoch: Epoch::of(3, 0),
                to_lease: b,
            },
            Command::Release {
                key: P,
                epoch: Epoch::of(3, 0),
            },
        ],
    });
    assert_eq!(
        out,
        Outcome::Batch {
            outcomes: vec![
                Outcome::Owned {
                    worker: W0,
                    epoch: Epoch::of(3, 0)
                },
                Outcome::Replicated,
                Outcome::Owned {
                    worker: W1,
                    epoch: Epoch::of(3, 2)
                },
                // The key changed owner earlier in the same entry: fenced.
                Outcome::Rejected(Rejection::StaleEpoch {
                    current: Epoch::of(3, 2),
                    given: Epoch::of(3, 0)
                }),
            ]
        }
    );
    let nested = log.run(Command::Batch {
        commands: vec![Command::Batch { commands: vec![] }],
    });
    assert_eq!(
        nested,
        Outcome::Rejected(Rejection::BadBatch {
            max: crate::command::MAX_BATCH
        })
    );
}

#[test]
fn a_pinned_session_stays_on_its_worker_until_unpinned() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let b = log.lease(W1, 60_000);
    let s = SessionId("s".into());
    let set = |lease, expect_epoch| Command::SetDecodeOwner {
        session: s.clone(),
        lease,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch,
    };
    let Outcome::Owned { epoch, .. } = log.run(set(a, None)) else {
        panic!()
    };
    let pin = |pinned| Command::PinSession {
        session: s.clone(),
        epoch,
        pinned,
    };
    assert!(matches!(
        log.run(pin(true)),
        Outcome::Owned { worker: W0, .. }
    ));
    assert_eq!(
        log.run(set(b, Some(epoch))),
        Outcome::Rejected(Rejection::Pinned(s.clone()))
    );
    assert!(
        matches!(log.run(set(a, None)), Outcome::Owned { worker: W0, .. }),
        "its own worker may update it"
    );
    log.run(pin(false));
    assert!(matches!(
        log.run(set(b, Some(epoch))),
        Outcome::Owned { worker: W1, .. }
    ));
}

#[test]
fn a_demoted_session_keeps_its_artifact_and_resumes_on_any_worker() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let b = log.lease(W1, 60_000);
    log.run(Command::Claim {
        key: P,
        lease: a,
        spec: spec(),
        expect_epoch: None,
    });
    let s = SessionId("s".into());
    let set = |lease| Command::SetDecodeOwner {
        session: s.clone(),
        lease,
        prefix: Some(P),
        tail_tokens: 9,
        predicted_tool_gap_ms: Some(100),
        expect_epoch: None,
    };
    let Outcome::Owned { epoch, .. } = log.run(set(a)) else {
        panic!()
    };
    let demote = |epoch| Command::DemoteSession {
        session: s.clone(),
        epoch,
        idle_ms: None,
    };
    assert!(matches!(
        log.run(demote(Epoch(epoch.0 + 1))),
        Outcome::Rejected(Rejection::StaleEpoch { .. })
    ));
    assert_eq!(log.run(demote(epoch)), Outcome::Released);
    let session = &log.d.sessions[&s];
    assert_eq!(
        (session.owner, session.prefix, session.tail_tokens),
        (None, Some(P), 0)
    );
    assert_eq!(log.d.artifacts[&P].ref_count, 1, "the artifact is kept");
    assert!(log.d.artifacts[&P].owner.is_some());
    assert!(!log.d.leases[&a].keys.contains(&Key::Session(s.clone())));
    // Without an owner, any worker may take the session up (no epoch needed).
    assert!(matches!(log.run(set(b)), Outcome::Owned { worker: W1, .. }));
}

/// A router sees only the steps sent to it: its demotion of a session it finds idle is
/// refused while the directory saw the session written (by any router) within the window.
#[test]
fn a_demotion_is_refused_while_the_session_was_written_within_its_idle_window() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let s = SessionId("s".into());
    let set = Command::SetDecodeOwner {
        session: s.clone(),
        lease: a,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch: None,
    };
    let Outcome::Owned { epoch, .. } = log.at(10_000).run(set.clone()) else {
        panic!()
    };
    let demote = Command::DemoteSession {
        session: s.clone(),
        epoch,
        idle_ms: Some(1_500),
    };
    // Another router's step 1.2 s later writes it again, with the same epoch.
    assert!(matches!(log.at(11_200).run(set), Outcome::Owned { .. }));
    assert_eq!(
        log.at(12_000).run(demote.clone()),
        Outcome::Rejected(Rejection::RecentlyWritten {
            session: s.clone(),
            since_ms: 800,
            idle_ms: 1_500
        })
    );
    assert!(log.d.sessions[&s].owner.is_some(), "refused: still owned");
    assert_eq!(log.at(12_700).run(demote), Outcome::Released);
    assert!(log.d.sessions[&s].owner.is_none());
}

#[test]
fn stats_count_forks_migrations_session_moves_and_lease_ends() {
    let mut log = Log::new();
    let a = log.lease(W0, 1_000);
    let b = log.lease(W1, 60_000);
    let c = log.lease(WorkerId(2), 60_000);
    let Outcome::Owned { epoch, .. } = log.run(claim(P, a)) else {
        panic!()
    };
    log.run(Command::ReplicateReadOnly {
        key: P,
        worker: W1,
        tier: Tier::Gpu,
    });
    log.run(Command::Migrate {
        key: P,
        from_epoch: epoch,
        to_lease: b,
    });
    let s = |n: &str| SessionId(n.into());
    let owner = |lease, expect_epoch| Command::SetDecodeOwner {
        session: s("root"),
        lease,
        prefix: Some(P),
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch,
    };
    let Outcome::Owned { epoch, .. } = log.run(owner(a, None)) else {
        panic!()
    };
    // Recording the same owner again moves nothing; moving to another worker does.
    let Outcome::Owned { epoch, .. } = log.run(owner(a, Some(epoch))) else {
        panic!()
    };
    let Outcome::Owned { epoch, .. } = log.run(owner(b, Some(epoch))) else {
        panic!()
    };
    log.run(Command::Fork {
        parent: s("root"),
        child: s("child"),
        lease: b,
        parent_epoch: epoch,
    });
    // A refused fork counts nothing.
    log.run(Command::Fork {
        parent: s("root"),
        child: s("child"),
        lease: b,
        parent_epoch: epoch,
    });
    log.run(Command::RevokeLease { lease: c });
    log.at(5_000);
    log.run(Command::Tick);
    assert_eq!(
        log.d.stats,
        DirectoryStats {
            forks: 1,
            prefix_migrations: 1,
            session_moves: 1,
            lease_expiries: 1,
            lease_revocations: 1,
        }
    );
}

#[test]
fn a_stored_response_stays_with_its_worker_then_is_lost_with_it_and_expires() {
    let mut log = Log::new();
    let a = log.lease(W0, 3_000);
    let record = |id: &str, lease| Command::RecordResponse {
        id: id.into(),
        lease,
        ttl_ms: 10_000,
    };
    assert_eq!(
        log.run(record("resp_1", a)),
        Outcome::ResponseRecorded {
            worker: W0,
            expires_at_ms: 11_000
        }
    );
    assert_eq!(
        log.run(record("", a)),
        Rejection::BadResponseId { max: 256 }.into()
    );
    assert_eq!(
        log.run(record("r", LeaseId(999))),
        Rejection::UnknownLease(LeaseId(999)).into()
    );
    // A second lease of the same worker (two routers raced): the response follows it.
    let b = log.lease(W0, 6_000);
    log.run(Command::RevokeLease { lease: a });
    let r = &log.d.responses["resp_1"];
    assert_eq!((r.worker, r.lease, r.lost), (W0, b, false));
    // The worker's last lease lapses: the response waits for the worker (three TTLs),
    // still routed to it, and expires in its time.
    log.at(8_000).run(Command::Tick);
    let r = &log.d.responses["resp_1"];
    assert_eq!(
        (r.lost, r.lapsed_until_ms),
        (false, Some(8_000 + 3 * 6_000))
    );
    log.at(11_000).run(Command::Tick);
    assert!(log.d.responses.is_empty());
    // Snapshots written before responses existed still load.
    let mut old = serde_json::to_value(&log.d).unwrap();
    old.as_object_mut().unwrap().remove("responses");
    let back: Directory = serde_json::from_value(old).unwrap();
    assert_eq!(back, log.d);
}

#[test]
fn a_worker_back_in_time_takes_its_responses_back_else_they_are_lost() {
    let mut log = Log::new();
    let record = |id: &str, lease| Command::RecordResponse {
        id: id.into(),
        lease,
        ttl_ms: 60_000,
    };
    let a = log.lease(W0, 1_000);
    log.run(record("r", a));
    // A host too busy to renew: the lease lapses, the response waits.
    log.at(5_000).run(Command::Tick);
    assert_eq!(log.d.responses["r"].lapsed_until_ms, Some(8_000));
    assert_eq!(log.d.next_expiry_ms(), Some(8_000));
    // Granted again in time: it is the worker's again, under the new lease.
    let b = log.at(6_000).lease(W0, 1_000);
    let r = &log.d.responses["r"];
    assert_eq!((r.lease, r.lapsed_until_ms, r.lost), (b, None, false));
    // Lapsed again, and not back in time: lost, and said so until it expires.
    log.at(9_000).run(Command::Tick);
    assert_eq!(log.d.responses["r"].lapsed_until_ms, Some(12_000));
    log.at(12_000).run(Command::Tick);
    let r = &log.d.responses["r"];
    assert_eq!((r.lapsed_until_ms, r.lost), (None, true));
    let c = log.lease(W0, 1_000);
    assert!(
        log.d.responses["r"].lost,
        "a lost response is not taken back"
    );
    // A revoked lease (the worker left) loses its responses at once.
    log.run(record("s", c));
    log.run(Command::RevokeLease { lease: c });
    assert!(log.d.responses["s"].lost);
    // The lapse index survives a snapshot.
    let d = log.lease(W1, 1_000);
    log.run(record("t", d));
    log.at(20_000).run(Command::Tick);
    let text = serde_json::to_string(&log.d).unwrap();
    let mut back: Directory = serde_json::from_str(&text).unwrap();
    assert_eq!(back, log.d);
    assert_eq!(back.next_expiry_ms(), Some(23_000));
    back.responses.expire(23_000);
    assert!(back.responses["t"].lost);
}

#[test]
fn a_session_is_labelled_with_its_root_and_parent_without_moving() {
    let mut log = Log::new();
    let a = log.lease(W0, 3_000);
    let s = |x: &str| SessionId(x.into());
    let label = |session: &str, root: &str, parent: Option<&str>| Command::LabelSession {
        session: s(session),
        root: Some(s(root)),
        parent: parent.map(s),
    };
    assert_eq!(
        log.run(label("kid", "root", Some("root"))),
        Rejection::UnknownSession(s("kid")).into()
    );
    log.run(Command::SetDecodeOwner {
        session: s("kid"),
        lease: a,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch: None,
    });
    let before = log.d.sessions[&s("kid")].clone();
    assert_eq!(
        log.run(label("kid", "root", Some("mid"))),
        Outcome::Labelled
    );
    let after = &log.d.sessions[&s("kid")];
    assert_eq!(
        (after.root.clone(), after.agent_parent.clone()),
        (Some(s("root")), Some(s("mid")))
    );
    assert_eq!((after.owner, after.epoch), (before.owner, before.epoch));
    log.run(label("kid", "kid", None));
    assert_eq!(log.d.sessions[&s("kid")].root, None, "its own root");
}

/// A directory where `P` is owned by `W0` under a 60 s lease and built on by session `s`,
/// claimed at 1 s; the lease and `P`'s epoch.
fn referenced_prefix(log: &mut Log) -> (LeaseId, Epoch) {
    let a = log.lease(W0, 60_000);
    let Outcome::Owned { epoch, .. } = log.run(claim(P, a)) else {
        panic!("not claimed")
    };
    log.run(Command::SetDecodeOwner {
        session: SessionId("s".into()),
        lease: a,
        prefix: Some(P),
        tail_tokens: 3,
        predicted_tool_gap_ms: None,
        expect_epoch: None,
    });
    (a, epoch)
}

fn forget(epoch: Epoch, idle_ms: u64) -> Command {
    Command::ForgetArtifact {
        key: P,
        epoch,
        idle_ms,
    }
}

#[test]
fn an_unreferenced_idle_artifact_is_forgotten_and_its_owners_lease_lets_go() {
    let mut log = Log::new();
    let (a, epoch) = referenced_prefix(&mut log);
    assert_eq!(
        log.at(30_000).run(forget(epoch, 10_000)),
        Outcome::Rejected(Rejection::Referenced { key: P, refs: 1 }),
        "a session is built on it"
    );
    let s = SessionId("s".into());
    let session_epoch = log.d.sessions[&s].epoch;
    log.run(Command::EndSession {
        session: s,
        epoch: session_epoch,
    });
    assert_eq!(log.d.artifacts[&P].ref_count, 0);
    assert_eq!(
        log.run(forget(Epoch(epoch.0 + 1), 10_000)),
        Outcome::Rejected(Rejection::StaleEpoch {
            current: epoch,
            given: Epoch(epoch.0 + 1)
        })
    );
    assert_eq!(
        log.run(forget(epoch, 60_000)),
        Outcome::Rejected(Rejection::RecentlyAccessed {
            key: P,
            since_ms: 29_000,
            idle_ms: 60_000
        }),
        "accessed (claimed) at 1 s, 29 s ago by the directory's clock"
    );
    assert!(log.d.artifacts.contains_key(&P));
    assert!(log.d.leases[&a].keys.contains(&Key::Prefix(P)));

    assert_eq!(log.run(forget(epoch, 29_000)), Outcome::Forgotten);
    assert!(!log.d.artifacts.contains_key(&P));
    assert!(
        !log.d.leases[&a].keys.contains(&Key::Prefix(P)),
        "its owner's lease no longer lists it"
    );
    assert_eq!(log.d.artifacts.prefix_ends(&[P.0]).count(), 0, "unindexed");
    // A duplicate (another router's sweep) is refused, harmlessly.
    assert_eq!(
        log.run(forget(epoch, 29_000)),
        Outcome::Rejected(Rejection::UnknownPrefix(P))
    );
    // Claimed again, it is created afresh under a newer epoch.
    let Outcome::Owned { epoch: again, .. } = log.run(claim(P, a)) else {
        panic!("not claimed again")
    };
    assert!(again > epoch);
    assert!(log.d.leases[&a].keys.contains(&Key::Prefix(P)));
}

#[test]
fn an_unowned_artifact_is_forgotten_and_an_extension_of_it_stays() {
    let mut log = Log::new();
    let a = log.lease(W0, 60_000);
    let Outcome::Owned { epoch, .. } = log.run(claim(P, a)) else {
        panic!("not claimed")
    };
    let child = PrefixKey(7);
    log.run(Command::Extend {
        key: child,
        spec: ArtifactSpec {
            parent: Some(P),
            blocks: (64, 128),
            ..spec()
        },
        parent_epoch: epoch,
    });
    let Outcome::Released = log.run(Command::Release { key: P, epoch }) else {
        panic!("not released")
    };
    let released = log.d.artifacts[&P].epoch;
    assert_eq!(log.d.artifacts[&P].owner, None);
    assert_eq!(
        log.at(5_000).run(forget(released, 1_000)),
        Outcome::Forgotten
    );
    // The extension names a parent that is gone: it stays, and extending from the
    // forgotten parent is refused as for one never claimed.
    assert_eq!(log.d.artifacts[&child].parent, Some(P));
    assert_eq!(
        log.run(Command::Extend {
            key: PrefixKey(8),
            spec: ArtifactSpec {
                parent: Some(P),
                blocks: (64, 128),
                ..spec()
            },
            parent_epoch: released,
        }),
        Outcome::Rejected(Rejection::UnknownPrefix(P))
    );
}

#[test]
fn forgetting_an_artifact_waits_for_version_3_alone_or_in_a_batch() {
    let mut log = Log::new();
    log.d.version = crate::version::Version(2);
    let (a, epoch) = referenced_prefix(&mut log);
    let s = SessionId("s".into());
    let session_epoch = log.d.sessions[&s].epoch;
    log.run(Command::EndSession {
        session: s,
        epoch: session_epoch,
    });
    let refused = Outcome::Rejected(Rejection::NeedsVersion {
        needs: crate::version::Version(3),
        runs: crate::version::Version(2),
    });
    assert_eq!(forget(epoch, 0).needs(), crate::version::Version::RETENTION);
    assert_eq!(log.at(10_000).run(forget(epoch, 0)), refused);
    assert_eq!(
        log.run(Command::Batch {
            commands: vec![Command::KeepAlive { lease: a }, forget(epoch, 0)]
        }),
        Outcome::Batch {
            outcomes: vec![
                Outcome::LeaseRenewed {
                    expires_at_ms: 70_000
                },
                refused
            ]
        }
    );
    assert!(log.d.artifacts.contains_key(&P));
    log.run(Command::SetVersion {
        version: crate::version::Version(3),
    });
    assert_eq!(log.run(forget(epoch, 0)), Outcome::Forgotten);
}
