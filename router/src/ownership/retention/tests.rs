//! The sweep's selection against directory states built by applying commands, and what
//! committing it does (duplicates from another router refused, harmlessly).

use super::*;
use ownerserve_ownership::command::ArtifactSpec;
use ownerserve_ownership::ids::{LeaseId, PrefixKey, SessionId, WorkerId};
use ownerserve_ownership::state::LapsedOwner;
use ownerserve_ownership::{invariants, Envelope};

const MINUTE: Duration = Duration::from_secs(60);

struct Dir {
    d: Directory,
    index: u64,
}

impl Dir {
    fn run(&mut self, now_ms: u64, command: Command) -> Outcome {
        self.index += 1;
        let env = Envelope {
            now_ms,
            client: None,
            command,
        };
        let out = self.d.apply(self.index, &env);
        assert_eq!(invariants::check(&self.d), vec![]);
        out
    }

    fn claim(&mut self, now_ms: u64, key: u64, lease: LeaseId) {
        let out = self.run(
            now_ms,
            Command::Claim {
                key: PrefixKey(key),
                lease,
                spec: ArtifactSpec {
                    parent: None,
                    blocks: (0, 1),
                    kv_type: "kv".into(),
                    size_bytes: 0,
                    checkpoints: vec![],
                },
                expect_epoch: None,
            },
        );
        assert!(matches!(out, Outcome::Owned { .. }), "{out:?}");
    }

    fn session(&mut self, now_ms: u64, name: &str, prefix: Option<u64>, lease: LeaseId) {
        self.run(
            now_ms,
            Command::SetDecodeOwner {
                session: SessionId(name.into()),
                lease,
                prefix: prefix.map(PrefixKey),
                tail_tokens: 1,
                predicted_tool_gap_ms: None,
                expect_epoch: None,
            },
        );
    }

    fn demote(&mut self, now_ms: u64, name: &str) {
        let epoch = self.d.sessions[&SessionId(name.into())].epoch;
        let out = self.run(
            now_ms,
            Command::DemoteSession {
                session: SessionId(name.into()),
                epoch,
                idle_ms: None,
            },
        );
        assert_eq!(out, Outcome::Released);
    }
}

/// At 61 s: `a` owned on `P1`; `b` demoted at 1 s on `P2`; `c` demoted at 50 s; `P3`
/// unreferenced since 1 s; `P4` unreferenced since 50 s.
fn directory() -> Dir {
    let mut dir = Dir {
        d: Directory::new(500),
        index: 0,
    };
    let Outcome::LeaseGranted { lease, .. } = dir.run(
        1_000,
        Command::GrantLease {
            worker: WorkerId(0),
            ttl_ms: 1_000_000,
        },
    ) else {
        panic!("no lease")
    };
    for key in [1, 2, 3] {
        dir.claim(1_000, key, lease);
    }
    dir.session(1_000, "a", Some(1), lease);
    dir.session(1_000, "b", Some(2), lease);
    dir.demote(1_000, "b");
    dir.claim(50_000, 4, lease);
    dir.session(50_000, "c", None, lease);
    dir.demote(50_000, "c");
    dir.run(61_000, Command::Tick);
    dir
}

fn both(keep: Duration) -> Retention {
    Retention {
        artifact: keep,
        session: keep,
    }
}

fn end(d: &Directory, name: &str) -> Command {
    let session = SessionId(name.into());
    Command::EndSession {
        epoch: d.sessions[&session].epoch,
        session,
    }
}

fn forget(d: &Directory, key: u64) -> Command {
    Command::ForgetArtifact {
        key: PrefixKey(key),
        epoch: d.artifacts[&PrefixKey(key)].epoch,
        idle_ms: 60_000,
    }
}

#[test]
fn a_sweep_ends_idle_demoted_sessions_and_forgets_idle_unreferenced_artifacts() {
    let mut dir = directory();
    let due = due(&dir.d, both(MINUTE), MAX_PER_SWEEP);
    // Not `a` (owned), not `c` or `P4` (idle 11 s), not `P1`/`P2` (sessions on them).
    assert_eq!(due, vec![end(&dir.d, "b"), forget(&dir.d, 3)]);

    let batch = Command::Batch { commands: due };
    let Outcome::Batch { outcomes } = dir.run(61_000, batch.clone()) else {
        panic!("not a batch")
    };
    assert_eq!(
        Swept::of(&outcomes),
        Swept {
            artifacts: 1,
            sessions: 1,
            refused: 0
        }
    );
    assert!(!dir.d.sessions.contains_key(&SessionId("b".into())));
    assert!(!dir.d.artifacts.contains_key(&PrefixKey(3)));
    // `b` ended released `P2`: the next sweep forgets it.
    assert_eq!(
        super::due(&dir.d, both(MINUTE), MAX_PER_SWEEP),
        vec![forget(&dir.d, 2)]
    );
    // Another router's sweep, from a copy that had not applied ours: refused, harmless.
    let Outcome::Batch { outcomes } = dir.run(61_000, batch) else {
        panic!("not a batch")
    };
    assert_eq!(
        Swept::of(&outcomes),
        Swept {
            artifacts: 0,
            sessions: 0,
            refused: 2
        }
    );
    // Later, `c` and `P4` are due too, and `a`, owned, never.
    dir.run(200_000, Command::Tick);
    let due = super::due(&dir.d, both(MINUTE), MAX_PER_SWEEP);
    assert_eq!(
        due,
        vec![end(&dir.d, "c"), forget(&dir.d, 2), forget(&dir.d, 4)]
    );
}

#[test]
fn a_sweep_is_bounded_and_each_part_can_be_turned_off() {
    let dir = directory();
    assert_eq!(due(&dir.d, both(MINUTE), 1), vec![end(&dir.d, "b")]);
    let sessions_only = Retention {
        artifact: Duration::ZERO,
        session: MINUTE,
    };
    assert_eq!(
        due(&dir.d, sessions_only, MAX_PER_SWEEP),
        vec![end(&dir.d, "b")]
    );
    let artifacts_only = Retention {
        artifact: MINUTE,
        session: Duration::ZERO,
    };
    assert_eq!(
        due(&dir.d, artifacts_only, MAX_PER_SWEEP),
        vec![forget(&dir.d, 3)]
    );
    assert!(due(&dir.d, both(Duration::ZERO), MAX_PER_SWEEP).is_empty());
    // A shorter retention takes the more recent ones too.
    assert_eq!(
        due(&dir.d, both(Duration::from_secs(11)), MAX_PER_SWEEP).len(),
        4
    );
}

#[test]
fn a_session_waiting_for_its_lapsed_worker_is_kept_and_artifacts_wait_for_version_3() {
    let mut dir = directory();
    dir.d.lapsed.insert(
        SessionId("b".into()),
        LapsedOwner {
            worker: WorkerId(0),
            until_ms: u64::MAX,
        },
    );
    assert_eq!(
        due(&dir.d, both(MINUTE), MAX_PER_SWEEP),
        vec![forget(&dir.d, 3)]
    );
    dir.d.version = Version(2);
    assert!(
        due(&dir.d, both(MINUTE), MAX_PER_SWEEP).is_empty(),
        "a directory before version 3 cannot forget"
    );
}

#[test]
fn the_sweep_runs_every_10_s_or_half_the_shorter_retention() {
    assert_eq!(period(both(Duration::ZERO)), None);
    assert_eq!(period(both(Duration::from_secs(600))), Some(SWEEP_EVERY));
    let short = Retention {
        artifact: Duration::ZERO,
        session: Duration::from_secs(1),
    };
    assert_eq!(period(short), Some(Duration::from_millis(500)));
    assert_eq!(
        period(both(Duration::from_millis(10))),
        Some(Duration::from_millis(100))
    );
}

#[test]
fn the_epoch_fences_a_session_resumed_since_the_copy_was_read() {
    let mut dir = directory();
    let stale = due(&dir.d, both(MINUTE), MAX_PER_SWEEP);
    let lease = *dir.d.leases.keys().next().unwrap();
    dir.session(61_000, "b", Some(2), lease);
    let Outcome::Batch { outcomes } = dir.run(61_000, Command::Batch { commands: stale }) else {
        panic!("not a batch")
    };
    assert!(matches!(
        outcomes[0],
        Outcome::Rejected(ownerserve_ownership::Rejection::StaleEpoch { .. })
    ));
    assert!(dir.d.sessions[&SessionId("b".into())].owner.is_some());
}
