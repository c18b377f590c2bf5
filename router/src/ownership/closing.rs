//! Sessions their clients closed (`x-ownerserve-session-control: close`), to be ended in
//! the directory. A close is the client's word that the session is over: unlike a lapse
//! (demoted, its prefix kept for a cheap resume), it is ended with `Command::EndSession`,
//! which removes the session and releases its reference to its prefix artifact. The
//! artifact itself stays for whatever else holds it: a fork's child took its own
//! reference and names its parent only as a label, so it outlives the parent; a
//! Responses chain is kept by its response records, not by a session. The owner drops
//! the session's unsealed tail, as for a demotion (`demotion`).
//!
//! The closing step's record (its owner, prefix and tail) is committed after the step
//! ends, batched with others (`ownership_sync`), so it can land after the sweep first
//! sees the close, and a record landing after the end brings the session back. A closed
//! session is therefore watched for [`WATCH_MS`]: each sweep ends it whenever this
//! router's replica shows it under an epoch not ended yet, still on the worker that
//! served its last step (or on none). A session that steps again meanwhile is live and no
//! longer watched.

use std::collections::HashMap;

use ownerserve_ownership::ids::{Epoch, SessionId};
use ownerserve_ownership::Command;
use ownerserve_planner::ids::WorkerId;

use super::sessions::Lapsed;

/// How long a closed session is watched for a late record bringing it back, ms: longer
/// than a record waits in the sync's queue behind a directory that is slow to commit.
pub const WATCH_MS: u64 = 30_000;

/// A closed session being ended.
#[derive(Debug)]
struct Watched {
    /// The worker that served its last step.
    owner: WorkerId,
    /// Its block hashes past its sealed prefix, for the owner to drop (taken once ended).
    tail: Vec<u64>,
    /// When it was closed, ms.
    closed_ms: u64,
    /// The last epoch it was ended at.
    ended: Option<Epoch>,
}

/// The closed sessions being ended, by session.
#[derive(Debug, Default)]
pub struct Closing {
    watched: HashMap<String, Watched>,
}

/// What the directory shows of a session: its decode owner and epoch (`None` when it has
/// no such session).
pub type Shown = (Option<WorkerId>, Option<Epoch>);

impl Closing {
    /// Watches `closed`, closed at `now_ms`, until it is ended for good.
    pub fn watch(&mut self, closed: Lapsed, now_ms: u64) {
        self.watched.insert(
            closed.session,
            Watched {
                owner: closed.owner,
                tail: closed.tail,
                closed_ms: now_ms,
                ended: None,
            },
        );
    }

    /// How many sessions are watched.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.watched.len()
    }

    /// The `EndSession` commands due at `now_ms`, given what the directory shows of each
    /// watched session (`shown`) and whether it is live again (`stepping`: it started a
    /// step since its close). Sessions watched past [`WATCH_MS`], or live again, are
    /// forgotten.
    pub fn due(
        &mut self,
        now_ms: u64,
        stepping: impl Fn(&str) -> bool,
        shown: impl Fn(&str) -> Shown,
    ) -> Vec<Command> {
        self.watched.retain(|session, w| {
            now_ms.saturating_sub(w.closed_ms) < WATCH_MS && !stepping(session)
        });
        self.watched
            .iter()
            .filter_map(|(session, w)| {
                let (owner, epoch) = shown(session);
                let epoch = epoch.filter(|&e| Some(e) != w.ended)?;
                // Moved to another worker since: a step it took elsewhere, not ours to end.
                if owner.is_some_and(|o| o != w.owner) {
                    return None;
                }
                Some(Command::EndSession {
                    session: SessionId(session.clone()),
                    epoch,
                })
            })
            .collect()
    }

    /// `session` was ended at `epoch`. The first time, its owner and tail to drop there.
    pub fn ended(&mut self, session: &str, epoch: Epoch) -> Option<(WorkerId, Vec<u64>)> {
        let w = self.watched.get_mut(session)?;
        w.ended = Some(epoch);
        let tail = std::mem::take(&mut w.tail);
        (!tail.is_empty()).then_some((w.owner, tail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_ownership::ids::{PrefixKey, WorkerId as DirWorkerId};
    use ownerserve_ownership::{Directory, Envelope, Outcome};

    fn closed(session: &str, owner: u32) -> Lapsed {
        Lapsed {
            session: session.to_owned(),
            owner: WorkerId(owner),
            tail: vec![7, 8],
            lease_ms: 0,
        }
    }

    struct Dir {
        d: Directory,
        index: u64,
    }

    impl Dir {
        fn run(&mut self, command: Command) -> Outcome {
            self.index += 1;
            let env = Envelope {
                now_ms: self.index,
                client: None,
                command,
            };
            self.d.apply(self.index, &env)
        }

        fn shown(&self, session: &str) -> Shown {
            let s = self.d.sessions.get(&SessionId(session.to_owned()));
            (
                s.and_then(|s| s.owner).map(|o| WorkerId(o.worker.0)),
                s.map(|s| s.epoch),
            )
        }
    }

    #[test]
    fn a_closed_session_is_ended_in_the_directory_and_its_prefix_released() {
        let mut dir = Dir {
            d: Directory::new(500),
            index: 0,
        };
        let Outcome::LeaseGranted { lease, .. } = dir.run(Command::GrantLease {
            worker: DirWorkerId(3),
            ttl_ms: 60_000,
        }) else {
            panic!("no lease")
        };
        let prefix = PrefixKey(42);
        dir.run(Command::Claim {
            key: prefix,
            lease,
            spec: ownerserve_ownership::command::ArtifactSpec {
                parent: None,
                blocks: (0, 1),
                kv_type: "kv".into(),
                size_bytes: 0,
                checkpoints: vec![],
            },
            expect_epoch: None,
        });
        let record = |session: &str| Command::SetDecodeOwner {
            session: SessionId(session.to_owned()),
            lease,
            prefix: Some(prefix),
            tail_tokens: 3,
            predicted_tool_gap_ms: None,
            expect_epoch: None,
        };
        dir.run(record("s"));
        let Outcome::Owned { epoch, .. } = dir.run(Command::Fork {
            parent: SessionId("s".into()),
            child: SessionId("s-sub".into()),
            lease,
            parent_epoch: dir.d.sessions[&SessionId("s".into())].epoch,
        }) else {
            panic!("not forked")
        };
        assert_eq!(dir.d.artifacts[&prefix].ref_count, 2);

        let mut closing = Closing::default();
        closing.watch(closed("s", 3), 0);
        let due = closing.due(10, |_| false, |s| dir.shown(s));
        assert_eq!(due.len(), 1);
        for c in due {
            assert_eq!(dir.run(c), Outcome::SessionEnded);
        }
        assert!(!dir.d.sessions.contains_key(&SessionId("s".into())));
        assert_eq!(
            dir.d.artifacts[&prefix].ref_count, 1,
            "its prefix reference released; the fork's stays"
        );
        let child = &dir.d.sessions[&SessionId("s-sub".into())];
        assert_eq!(child.epoch, epoch, "the fork's child lives on");
        assert!(ownerserve_ownership::invariants::check(&dir.d).is_empty());
        let ended_at = dir.shown("s").1;
        assert_eq!(ended_at, None);
        assert_eq!(
            closing.ended("s", Epoch(0)),
            Some((WorkerId(3), vec![7, 8])),
            "its owner drops the tail, once"
        );
        assert_eq!(closing.ended("s", Epoch(0)), None);
        assert!(closing.due(20, |_| false, |s| dir.shown(s)).is_empty());

        // The closing step's record lands late and brings it back: ended again.
        dir.run(record("s"));
        let due = closing.due(30, |_| false, |s| dir.shown(s));
        assert_eq!(due.len(), 1);
        for c in due {
            assert_eq!(dir.run(c), Outcome::SessionEnded);
        }
        assert_eq!(dir.d.sessions.len(), 1, "only the fork's child");
        // Watched no longer after WATCH_MS.
        closing.due(WATCH_MS, |_| false, |s| dir.shown(s));
        assert_eq!(closing.len(), 0);
    }

    #[test]
    fn a_session_moved_or_stepping_again_is_not_ended() {
        let mut closing = Closing::default();
        closing.watch(closed("moved", 1), 0);
        closing.watch(closed("back", 1), 0);
        closing.watch(closed("demoted", 1), 0);
        let shown = |s: &str| match s {
            "moved" => (Some(WorkerId(2)), Some(Epoch(9))),
            "back" => (Some(WorkerId(1)), Some(Epoch(9))),
            _ => (None, Some(Epoch(5))),
        };
        let due = closing.due(10, |s| s == "back", shown);
        assert_eq!(
            due,
            [Command::EndSession {
                session: SessionId("demoted".into()),
                epoch: Epoch(5),
            }]
        );
        assert_eq!(closing.len(), 2, "the session stepping again is live");
        closing.ended("demoted", Epoch(5));
        assert!(
            closing.due(20, |_| false, shown).is_empty(),
            "ended at that epoch already"
        );
    }
}
