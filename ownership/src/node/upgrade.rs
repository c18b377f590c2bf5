//! Rolling upgrades: the directory's version (`crate::version`) is raised once the whole
//! cluster can apply it. The leader asks every member (voters and learners: all apply the
//! log) which version its release knows (`GET /directory/v1/cluster`, `version.knows`; a
//! 0.1.0 node does not say, so 1), at most once per [`ASK_EVERY`], and commits
//! `Command::SetVersion` when all know a newer one than the directory runs: at once in a
//! new cluster, at the end of a roll in an upgraded one. Until then the commands of the
//! newer version are held: answered without being proposed ([`Node::held`]), since a
//! member that cannot decode an entry stops taking the log there, and two such members
//! stop the cluster.

use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::version::Version;
use crate::{Command, Outcome, Rejection};

use super::Node;

/// How long the members' answer is trusted before they are asked again.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// The oldest version the members' releases knew when last asked.
#[derive(Debug, Default)]
pub struct MembersKnow(Mutex<Option<(Instant, Version)>>);

impl MembersKnow {
    fn fresh(&self) -> Option<Version> {
        let last = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        last.filter(|(at, _)| at.elapsed() < ASK_EVERY)
            .map(|(_, v)| v)
    }

    fn store(&self, known: Version) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), known));
    }
}

/// The version a member's `GET /directory/v1/cluster` answer says its release knows.
pub(super) fn knows(answer: &Value) -> Version {
    answer["version"]["knows"]
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .map_or(Version::FIRST, Version)
}

impl Node {
    /// The directory version this node's state runs.
    pub fn version(&self) -> Version {
        self.machine.read(|s| s.directory.version)
    }

    /// What `command` is answered without being proposed: on the leader, a refusal when
    /// it needs a newer version than the directory runs even after raising it as far as
    /// the members allow (`None`: propose it; a follower's proposal goes to the leader,
    /// which decides).
    pub async fn held(&self, command: &Command) -> Option<Outcome> {
        let needs = command.needs();
        if needs <= self.version() || self.raft.current_leader().await != Some(self.id) {
            return None;
        }
        let runs = self.raise_version().await;
        (needs > runs).then(|| Rejection::NeedsVersion { needs, runs }.into())
    }

    /// The directory version it runs and the newest this release knows, as
    /// `GET /directory/v1/cluster` and `/admin/v1/cluster` show them (`knows` is what a
    /// leader asks its members).
    pub fn versions(&self) -> Value {
        serde_json::json!({"runs": self.version(), "knows": Version::CURRENT})
    }

    /// The oldest version the members' releases know (this node's is
    /// [`Version::CURRENT`]), asked at most once per [`ASK_EVERY`]; `None` when one did not
    /// answer.
    async fn members_know(&self) -> Option<Version> {
        if let Some(known) = self.members_know.fresh() {
            return Some(known);
        }
        let members: Vec<(u64, String)> = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow();
            m.membership_config
                .membership()
                .nodes()
                .map(|(id, n)| (*id, n.addr.clone()))
                .collect()
        };
        let mut oldest = Version::CURRENT;
        for (id, addr) in members {
            if id == self.id {
                continue;
            }
            let asked = self
                .forwarder
                .get(format!("http://{addr}/directory/v1/cluster"))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .ok()?;
            let answer: Value = asked.error_for_status().ok()?.json().await.ok()?;
            oldest = oldest.min(knows(&answer));
        }
        self.members_know.store(oldest);
        Some(oldest)
    }

    /// While this node leads a directory behind [`Version::CURRENT`]: commits
    /// `SetVersion` once every member's release knows a newer version. The version it
    /// runs after.
    pub(super) async fn raise_version(&self) -> Version {
        let runs = self.version();
        if runs >= Version::CURRENT || self.raft.current_leader().await != Some(self.id) {
            return runs;
        }
        let Some(known) = self.members_know().await else {
            return runs;
        };
        if known <= runs {
            tracing::debug!(%runs, %known, "directory version held: a member runs an older release");
            return runs;
        }
        match self
            .propose(Command::SetVersion { version: known }, None)
            .await
        {
            Ok(resp) => {
                tracing::info!(from = %runs, to = %known, outcome = ?resp.data, "directory version raised: every member runs a release that knows it");
                self.version()
            }
            Err(e) => {
                tracing::debug!(error = %e, "directory version not raised");
                runs
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_member_that_does_not_say_its_version_knows_version_1() {
        assert_eq!(knows(&json!({"id": 2, "leader": 1})), Version::FIRST);
        assert_eq!(
            knows(&json!({"version": {"knows": 2, "runs": 1}})),
            Version(2)
        );
    }
}
