//! The directory's version: which rules [`Directory::apply`](crate::Directory::apply)
//! follows. A release that changes what a command does, or adds one, raises
//! [`Version::CURRENT`]. The version a cluster applies is part of its replicated state
//! (`Directory::version`) and changes only through the log (`Command::SetVersion`), so
//! every node, whatever release it runs, applies each entry by the same rules, and a node
//! that replays the log from the start passes through the same versions at the same
//! entries. Each command says the version it needs (`Command::needs`).
//!
//! During a rolling upgrade the new nodes keep applying the old version's rules; the
//! commands only the new version knows are held (refused before they reach the log, which
//! an old node could not decode). Once every member of the cluster runs a release that
//! knows the new version, the leader commits `SetVersion` (the node's `upgrade` module).
//!
//! | version | release | rules |
//! |---|---|---|
//! | 1 | 0.1.0 (a state without a version) | a lapsed lease's sessions that nothing else holds end, its stored responses are lost |
//! | 2 | 0.2.0 | they wait for their worker (`Directory::lapsed`, `StoredResponse::lapsed_until_ms`); tenant budgets (`SpendTokens`, `HoldTenantSession`, `ReleaseTenantSession`) |
//! | 3 | after 0.2.0 | an unreferenced, idle prefix artifact can be forgotten (`ForgetArtifact`) |

use serde::{Deserialize, Serialize};

/// A version of the directory's rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub u32);

impl Version {
    /// 0.1.0's rules: what a state without a version follows.
    pub const FIRST: Version = Version(1);
    /// The lease grace rule (a lapsed lease's sessions and stored responses wait for their
    /// worker) and tenant budgets.
    pub const LAPSED_OWNERS_AND_TENANTS: Version = Version(2);
    /// Forgetting prefix artifacts (`Command::ForgetArtifact`).
    pub const RETENTION: Version = Version(3);
    /// The newest version this release knows.
    pub const CURRENT: Version = Version(3);

    /// [`Version::FIRST`], for serde: a state written before versions were.
    pub fn first() -> Version {
        Version::FIRST
    }
}

impl Default for Version {
    /// A directory made by this release follows its rules.
    fn default() -> Self {
        Version::CURRENT
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// An entry that raises the directory to a version this release does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the directory is raised to version {found}; this release knows versions up to {known}: run a newer release")]
pub struct TooNew {
    pub found: Version,
    pub known: Version,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaseId, SessionId, WorkerId};
    use crate::{Command, Directory, Envelope, Outcome, Rejection};

    /// Applies `command` at the next index, stamped `now_ms`.
    fn run(d: &mut Directory, now_ms: u64, command: Command) -> Outcome {
        let index = d.applied + 1;
        d.apply(
            index,
            &Envelope {
                now_ms,
                client: None,
                command,
            },
        )
    }

    /// A directory at `version` whose worker 0 owns session `s` under a 1 s lease.
    fn owned_at(version: Version) -> (Directory, LeaseId) {
        let mut d = Directory {
            version,
            ..Directory::new(0)
        };
        let lease = match run(
            &mut d,
            1_000,
            Command::GrantLease {
                worker: WorkerId(0),
                ttl_ms: 1_000,
            },
        ) {
            Outcome::LeaseGranted { lease, .. } => lease,
            other => panic!("{other:?}"),
        };
        let claimed = run(
            &mut d,
            1_000,
            Command::SetDecodeOwner {
                session: SessionId("s".into()),
                lease,
                prefix: None,
                tail_tokens: 1,
                predicted_tool_gap_ms: None,
                expect_epoch: None,
            },
        );
        assert!(matches!(claimed, Outcome::Owned { .. }), "{claimed:?}");
        (d, lease)
    }

    #[test]
    fn at_version_1_a_lapsed_lease_loses_its_sessions_and_responses_as_0_1_0_did() {
        let lapse = |version| {
            let (mut d, lease) = owned_at(version);
            let record = Command::RecordResponse {
                id: "r".into(),
                lease,
                ttl_ms: 60_000,
            };
            run(&mut d, 1_000, record);
            run(&mut d, 3_000, Command::Tick);
            d
        };
        let d = lapse(Version::FIRST);
        assert!(d.sessions.is_empty());
        assert!(d.lapsed.is_empty());
        assert!(d.responses["r"].lost);
        // The same entries at version 2 keep both for their worker.
        let d = lapse(Version(2));
        assert_eq!(d.sessions[&SessionId("s".into())].owner, None);
        assert!(d.lapsed.contains_key(&SessionId("s".into())));
        let r = &d.responses["r"];
        assert!(!r.lost && r.lapsed_until_ms.is_some(), "{r:?}");
    }

    #[test]
    fn tenant_commands_wait_for_version_2_which_set_version_raises_and_never_lowers() {
        let (mut d, _) = owned_at(Version::FIRST);
        let spend = || Command::SpendTokens {
            tenant: "t".into(),
            tokens: 1,
            per_minute: 60,
        };
        assert_eq!(
            run(&mut d, 1_000, spend()),
            Outcome::Rejected(Rejection::NeedsVersion {
                needs: Version(2),
                runs: Version(1)
            })
        );
        assert!(d.tenants.is_empty());
        assert_eq!(
            run(
                &mut d,
                1_000,
                Command::SetVersion {
                    version: Version(2)
                }
            ),
            Outcome::VersionSet {
                version: Version(2)
            }
        );
        assert!(matches!(
            run(&mut d, 1_000, spend()),
            Outcome::TokensGranted { .. }
        ));
        run(
            &mut d,
            1_000,
            Command::SetVersion {
                version: Version(1),
            },
        );
        assert_eq!(d.version, Version(2));
    }

    #[test]
    fn a_state_without_a_version_follows_version_1() {
        let mut json = serde_json::to_value(Directory::new(500)).unwrap();
        json.as_object_mut().unwrap().remove("version");
        let d: Directory = serde_json::from_value(json).unwrap();
        assert_eq!(d.version, Version::FIRST);
        assert_eq!(Directory::new(500).version, Version::CURRENT);
    }

    #[test]
    fn tenant_commands_need_version_2_alone_or_in_a_batch() {
        let spend = Command::SpendTokens {
            tenant: "t".into(),
            tokens: 1,
            per_minute: 10,
        };
        assert_eq!(spend.needs(), Version(2));
        assert_eq!(Command::Tick.needs(), Version(1));
        let batch = Command::Batch {
            commands: vec![
                Command::Tick,
                Command::ReleaseTenantSession {
                    tenant: "t".into(),
                    session: SessionId("s".into()),
                },
            ],
        };
        assert_eq!(batch.needs(), Version(2));
        let empty = Command::Batch {
            commands: Vec::new(),
        };
        assert_eq!(empty.needs(), Version::FIRST);
    }

    #[test]
    fn a_version_newer_than_this_release_is_refused_even_inside_a_batch() {
        assert_eq!(
            Command::SetVersion {
                version: Version::CURRENT
            }
            .check_known_version(),
            Ok(())
        );
        let newer = Command::SetVersion {
            version: Version(Version::CURRENT.0 + 1),
        };
        let err = Command::Batch {
            commands: vec![Command::Tick, newer],
        }
        .check_known_version()
        .unwrap_err();
        assert_eq!(err.found, Version(Version::CURRENT.0 + 1));
        assert!(err.to_string().contains("run a newer release"), "{err}");
    }
}
