//! How the router talks to the ownership directory: the [`DirectoryClient`] trait, with an
//! embedded single node ([`Embedded`]) and a remote cluster ([`Remote`]) behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use ownerserve_ownership::ids::{Epoch, PrefixKey, SessionId};
use ownerserve_ownership::{Command, Directory, Outcome};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::ArtifactView;

use crate::directory::Node;

/// A boxed future, so the trait can be used as `dyn DirectoryClient`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The directory did not take a command.
#[derive(Debug, thiserror::Error)]
pub enum DirectoryError {
    #[error("the directory has no leader right now: {0}")]
    Unavailable(String),
    #[error("the directory answered something unexpected: {0}")]
    Protocol(String),
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
    /// routing hint: writes are fenced by epochs). A remote cluster is not read per
    /// request; it answers an empty, unconsulted lookup.
    fn lookup(&self, _session: Option<&str>, _hashes: &[u64], _block: u64) -> Lookup {
        Lookup::default()
    }
}

/// A directory node in this process.
pub struct Embedded(pub Arc<Node>);

impl DirectoryClient for Embedded {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move {
            let resp = self
                .0
                .propose(command, None)
                .await
                .map_err(|e| DirectoryError::Unavailable(e.to_string()))?;
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
    /// A client for the nodes at `urls` (`http://host:port`).
    pub fn new(urls: Vec<String>) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            urls,
            leader: AtomicUsize::new(0),
        }
    }
}

impl DirectoryClient for Remote {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move {
            let body = json!({ "command": command });
            let mut last = String::from("no directory urls");
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
                        last = e.to_string();
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
                last = v["error"]["message"].as_str().unwrap_or("error").to_owned();
                // Follow the redirect to the leader, if it is one of ours.
                let leader = v["leader_addr"]
                    .as_str()
                    .and_then(|a| self.urls.iter().position(|u| u.ends_with(a)));
                self.leader
                    .store(leader.unwrap_or(i + 1), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(DirectoryError::Unavailable(last))
        })
    }
}
