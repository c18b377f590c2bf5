//! How a router talks to the ownership directory: the [`DirectoryClient`] trait, with an
//! embedded single node ([`Embedded`]) and a remote cluster ([`Remote`]) behind it, and
//! what it reads per step ([`Lookup`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use serde_json::{json, Value};

use crate::ids::{Epoch, PrefixKey, SessionId};
use crate::{Command, Directory, Outcome};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::ArtifactView;

use super::Node;

/// A boxed future, so the trait can be used as `dyn DirectoryClient`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The directory did not take a command. A state-machine refusal (a stale epoch, a lease
/// that expired) is not an error here: it is the command's [`Outcome::Rejected`].
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    /// The node asked is not the leader; `leader_addr` names the one it knows, if any.
    #[error("not the leader (leader: {})", leader_addr.as_deref().unwrap_or("unknown"))]
    NotLeader {
        leader_id: Option<u64>,
        leader_addr: Option<String>,
    },
    /// No node could be reached.
    #[error("cannot reach the directory at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The cluster has no leader right now, or Raft refused the write.
    #[error("the directory has no leader right now: {0}")]
    Unavailable(String),
    /// An answer that does not parse, or no outcome for a command.
    #[error("the directory answered something unexpected: {0}")]
    Protocol(String),
}

impl DirectoryError {
    /// Whether the same command may succeed if sent again (to the named leader, another
    /// node, or after an election); a protocol error will not go away by itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            DirectoryError::NotLeader { .. }
            | DirectoryError::Unreachable { .. }
            | DirectoryError::Unavailable(_) => true,
            DirectoryError::Protocol(_) => false,
        }
    }
}

/// What the directory says about one step: the session's owner and epoch, and the
/// prompt's longest owned prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Lookup {
    /// The session's decode owner.
    pub owner: Option<WorkerId>,
    /// The session's fencing epoch (kept when a demoted session has no owner).
    pub epoch: Option<Epoch>,
    /// The longest owned prefix artifact of the prompt.
    pub artifact: Option<ArtifactView>,
    /// Its key and epoch, for replicate and migrate commands.
    pub artifact_key: Option<(PrefixKey, Epoch)>,
    /// Whether an answer came from a directory at all.
    pub consulted: bool,
}

impl Lookup {
    /// Reads `session` and the prompt's prefix hashes (`block` tokens each) off `d`.
    pub fn read(d: &Directory, session: Option<&str>, hashes: &[u64], block: u64) -> Self {
        let s = session.and_then(|s| d.sessions.get(&SessionId(s.to_owned())));
        let artifact = hashes.iter().enumerate().rev().find_map(|(i, h)| {
            let a = d.artifacts.get(&PrefixKey(*h))?;
            let owner = a.owner?;
            Some((
                ArtifactView {
                    owner: WorkerId(owner.worker.0),
                    tokens: (i as u64 + 1) * block,
                },
                (PrefixKey(*h), a.epoch),
            ))
        });
        Self {
            owner: s.and_then(|s| s.owner).map(|o| WorkerId(o.worker.0)),
            epoch: s.map(|s| s.epoch),
            artifact: artifact.map(|a| a.0),
            artifact_key: artifact.map(|a| a.1),
            consulted: true,
        }
    }
}

/// Commits commands to the directory.
pub trait DirectoryClient: Send + Sync {
    /// Commits `command` (the leader stamps its time) and returns its outcome.
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>>;

    /// What the directory knows about a step, read locally without a Raft round trip (a
    /// routing hint: writes are fenced by epochs).
    fn lookup(&self, session: Option<&str>, hashes: &[u64], block: u64) -> Lookup;
}

/// A directory node in this process.
pub struct Embedded(pub Arc<Node>);

impl DirectoryClient for Embedded {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move {
            let resp = self.0.propose(command, None).await.map_err(|e| match e {
                RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
                    DirectoryError::NotLeader {
                        leader_id: f.leader_id,
                        leader_addr: f.leader_node.map(|n| n.addr),
                    }
                }
                e => DirectoryError::Unavailable(e.to_string()),
            })?;
            resp.data
                .ok_or_else(|| DirectoryError::Protocol("no outcome for a command".into()))
        })
    }

    fn lookup(&self, session: Option<&str>, hashes: &[u64], block: u64) -> Lookup {
        self.0
            .machine
            .read(|s| Lookup::read(&s.directory, session, hashes, block))
    }
}

/// A directory cluster over HTTP: writes go to the last known leader; a 421 names the new
/// one, a dead node moves on to the next.
pub struct Remote {
    http: reqwest::Client,
    urls: Vec<String>,
    leader: AtomicUsize,
}

impl Remote {
    /// A client for the nodes at `urls` (`http://host:port`), presenting the cluster's
    /// `secret` (when it has one).
    pub fn new(urls: Vec<String>, secret: Option<&super::secret::ClusterSecret>) -> Self {
        Self {
            http: super::secret::client(secret, Duration::from_secs(5)),
            urls,
            leader: AtomicUsize::new(0),
        }
    }
}

impl DirectoryClient for Remote {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move {
            let body = json!({ "command": command });
            let mut last = DirectoryError::Unavailable("no directory urls".into());
            for _ in 0..(3 * self.urls.len().max(1)) {
                let i = self.leader.load(Ordering::Relaxed) % self.urls.len().max(1);
                let Some(url) = self.urls.get(i) else { break };
                let sent = self
                    .http
                    .post(format!("{url}/directory/v1/commands"))
                    .json(&body)
                    .send()
                    .await;
                let resp = match sent {
                    Ok(r) => r,
                    Err(e) => {
                        last = DirectoryError::Unreachable {
                            url: url.clone(),
                            reason: e.to_string(),
                        };
                        self.leader.store(i + 1, Ordering::Relaxed);
                        continue;
                    }
                };
                let status = resp.status();
                let v: Value = resp
                    .json()
                    .await
                    .map_err(|e| DirectoryError::Protocol(e.to_string()))?;
                if status.is_success() {
                    return serde_json::from_value(v["outcome"].clone())
                        .map_err(|e| DirectoryError::Protocol(e.to_string()));
                }
                let leader_addr = v["leader_addr"].as_str().map(str::to_owned);
                last = if status == reqwest::StatusCode::MISDIRECTED_REQUEST {
                    DirectoryError::NotLeader {
                        leader_id: v["leader_id"].as_u64(),
                        leader_addr: leader_addr.clone(),
                    }
                } else {
                    let message = v["error"]["message"].as_str().unwrap_or("error");
                    DirectoryError::Unavailable(message.to_owned())
                };
                // Follow the redirect to the leader, if it is one of ours.
                let leader = leader_addr
                    .as_deref()
                    .and_then(|a| self.urls.iter().position(|u| u.ends_with(a)));
                self.leader
                    .store(leader.unwrap_or(i + 1), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(last)
        })
    }

    /// The remote cluster is not read per request yet: this answers an empty, unconsulted
    /// lookup, so the planner sees no owner (issue 17 gives every router a live replica to
    /// read).
    fn lookup(&self, _session: Option<&str>, _hashes: &[u64], _block: u64) -> Lookup {
        Lookup::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_protocol_error_is_final() {
        let not_leader = DirectoryError::NotLeader {
            leader_id: Some(2),
            leader_addr: Some("127.0.0.1:7002".into()),
        };
        assert!(not_leader.is_retryable());
        assert_eq!(
            not_leader.to_string(),
            "not the leader (leader: 127.0.0.1:7002)"
        );
        let unreachable = DirectoryError::Unreachable {
            url: "http://127.0.0.1:1".into(),
            reason: "connection refused".into(),
        };
        assert!(unreachable.is_retryable());
        assert!(DirectoryError::Unavailable("election".into()).is_retryable());
        assert!(!DirectoryError::Protocol("no outcome".into()).is_retryable());
    }
}
