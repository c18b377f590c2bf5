//! How the router talks to the ownership directory: the [`DirectoryClient`] trait, with an
//! embedded single node ([`Embedded`]) and a remote cluster ([`Remote`]) behind it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use ownerserve_ownership::{Command, Outcome};

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

/// Commits commands to the directory.
pub trait DirectoryClient: Send + Sync {
    /// Commits `command` (the leader stamps its time) and returns its outcome.
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>>;
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
