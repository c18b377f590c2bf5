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
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::ids::{Epoch, PrefixKey, SessionId};
use crate::{Command, Directory, Outcome};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::ArtifactView;

use super::read_lease::ReadLease;
use super::replica::Replica;
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
    /// Reads `session` and the prompt's prefix hashes (`block` tokens each) off `d`. The
    /// owned prefix is searched only where an artifact that is a prefix of the prompt can
    /// end (`ArtifactMap::prefix_ends`), longest first, not at every block of the prompt.
    pub fn read(d: &Directory, session: Option<&str>, hashes: &[u64], block: u64) -> Self {
        let s = session.and_then(|s| d.sessions.get(&SessionId(s.to_owned())));
        let artifact = d.artifacts.prefix_ends(hashes).find_map(|end| {
            let i = end as usize - 1;
            let h = hashes.get(i)?;
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

    /// Reads the local copy of the directory: the embedded node's state, or a remote
    /// cluster's replica.
    fn read_local(&self, f: &mut dyn FnMut(&Directory));

    /// Waits until the local copy holds every write committed before the call (at most
    /// [`CATCH_UP`]); whether it does.
    fn catch_up(&self) -> BoxFuture<'_, bool>;

    /// Whether the local copy can be read without catching up first: it holds a read
    /// sent within its read lease (`read_lease`).
    fn fresh(&self) -> bool;

    /// How long after its commit a move of a session off a live owner holds its first
    /// step's answer: the span other routers read their copies as current for
    /// (`read_lease`). Zero where no other router reads this directory (an embedded node).
    fn read_lease(&self) -> Duration {
        Duration::ZERO
    }

    /// Whether the local copy has read the cluster's state at least once (a remote
    /// cluster's replica starts empty; an embedded node is its own copy). Until then a
    /// lookup consults nothing and no step can be claimed, so an endpoint picker reports
    /// itself not ready (GIE: not ready until the datastore has synced).
    fn synced(&self) -> bool {
        true
    }
}

/// A directory node in this process.
pub struct Embedded(pub Arc<Node>);

impl DirectoryClient for Embedded {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move {
            if let Some(outcome) = self.0.held(&command).await {
                return Ok(outcome);
            }
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

    /// The embedded node is the only one: what it applied is what was committed.
    fn catch_up(&self) -> BoxFuture<'_, bool> {
        Box::pin(async { true })
    }

    fn fresh(&self) -> bool {
        true
    }

    fn read_local(&self, f: &mut dyn FnMut(&Directory)) {
        self.0.machine.read(|s| f(&s.directory));
    }
}

/// How long a write keeps trying the nodes (a leader election takes a few seconds); the
/// request path bounds its own waits tighter (`ownership_claim_timeout_ms`).
pub const COMMIT_PATIENCE: Duration = Duration::from_secs(10);

/// The longest a replica is waited for to apply a read index.
pub const CATCH_UP: Duration = Duration::from_secs(5);

/// How long a replica is given to apply a read index from the node it follows before it
/// follows another (a follower applies a commit within a heartbeat or two).
const MOVE_ON_AFTER: Duration = Duration::from_secs(1);

/// A directory cluster over HTTP: writes go to the last known leader (a 421 names the new
/// one, a dead node moves on to the next); lookups read the router's live [`Replica`].
pub struct Remote {
    http: reqwest::Client,
    urls: Vec<String>,
    leader: AtomicUsize,
    replica: Arc<Replica>,
    lease: ReadLease,
}

impl Remote {
    /// A client for the nodes at `urls` (`http://host:port`), presenting the cluster's
    /// `secret` (when it has one), and its replica, following them on `tracker` until
    /// `cancel`.
    pub fn connect(
        urls: Vec<String>,
        secret: Option<&super::secret::ClusterSecret>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            http: super::secret::client(secret, Duration::from_secs(5)),
            replica: Replica::follow(urls.clone(), secret, tracker, cancel),
            urls,
            leader: AtomicUsize::new(0),
            lease: ReadLease::new(super::read_lease::READ_LEASE),
        }
    }

    /// The same client with reads current for `span` (and moves waiting as long); every
    /// router of a cluster must use the same span.
    pub fn with_read_lease(mut self, span: Duration) -> Self {
        self.lease = ReadLease::new(span);
        self
    }

    /// The live replica lookups read.
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The leader's commit index now, committed through it (an empty batch): once the
    /// replica has applied it, a read of the replica is linearizable (ReadIndex).
    pub async fn read_index(&self) -> Result<u64, DirectoryError> {
        let empty = Command::Batch {
            commands: Vec::new(),
        };
        self.commit(empty).await.map(|(_, index)| index)
    }

    /// Each node's Raft status (`GET /directory/v1/cluster`), or why it did not answer.
    pub async fn nodes(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for url in &self.urls {
            let asked = self
                .http
                .get(format!("{url}/directory/v1/cluster"))
                .timeout(Duration::from_secs(2))
                .send()
                .await;
            let answer = match asked {
                Ok(r) => r.json::<Value>().await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            out.push(match answer {
                Ok(mut v) => {
                    v["url"] = json!(url);
                    v
                }
                Err(e) => json!({"url": url, "error": e}),
            });
        }
        out
    }

    /// Commits `command` at the leader: its outcome and log index.
    pub async fn commit(&self, command: Command) -> Result<(Outcome, u64), DirectoryError> {
        // Every commit is a read index (`read_lease`), from when it was first sent.
        let asked = tokio::time::Instant::now();
        let body = json!({ "command": command });
        let mut last = DirectoryError::Unavailable("no directory urls".into());
        // Through an election: a dead leader's followers still name it for a second or two.
        let deadline = tokio::time::Instant::now() + COMMIT_PATIENCE;
        while tokio::time::Instant::now() < deadline {
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
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let status = resp.status();
            let v: Value = resp
                .json()
                .await
                .map_err(|e| DirectoryError::Protocol(e.to_string()))?;
            if status.is_success() {
                let outcome = serde_json::from_value(v["outcome"].clone())
                    .map_err(|e| DirectoryError::Protocol(e.to_string()))?;
                let index = v["log_index"].as_u64().unwrap_or(0);
                self.lease.note(asked, index);
                return Ok((outcome, index));
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
    }
}

impl DirectoryClient for Remote {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
        Box::pin(async move { self.commit(command).await.map(|(outcome, _)| outcome) })
    }

    /// Read from the replica, in memory. Until it has read the cluster's state once
    /// (start-up), the answer says it consulted nothing.
    fn lookup(&self, session: Option<&str>, hashes: &[u64], block: u64) -> Lookup {
        if !self.replica.synced() {
            return Lookup::default();
        }
        self.replica
            .read(|d| Lookup::read(d, session, hashes, block))
    }

    /// A read index from the leader, then the replica applies up to it (ReadIndex). One at
    /// a time: a caller that waited while another's read was sent after it arrived has
    /// what it asked for.
    fn catch_up(&self) -> BoxFuture<'_, bool> {
        Box::pin(async {
            let arrived = tokio::time::Instant::now();
            let caught_up = async {
                let _turn = self.lease.turn().await;
                if self
                    .lease
                    .current(self.replica.applied())
                    .is_some_and(|sent| sent >= arrived)
                {
                    return true;
                }
                let Ok(index) = self.read_index().await else {
                    return false;
                };
                if self.replica.wait_applied(index, MOVE_ON_AFTER).await {
                    return true;
                }
                // The node it follows does not apply what the leader committed (cut off
                // from the leader, or far behind): follow another.
                self.replica.move_on();
                self.replica.wait_applied(index, CATCH_UP).await
            };
            tokio::time::timeout(CATCH_UP, caught_up)
                .await
                .unwrap_or(false)
        })
    }

    /// Read the cluster's state once, and holds a read sent within the read lease.
    fn fresh(&self) -> bool {
        self.replica.synced() && self.lease.held(self.replica.applied())
    }

    fn read_lease(&self) -> Duration {
        self.lease.span()
    }

    fn synced(&self) -> bool {
        self.replica.synced()
    }

    fn read_local(&self, f: &mut dyn FnMut(&Directory)) {
        self.replica.read(|d| f(d));
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

    /// The lookup before the end index: every block of the prompt probed, longest first.
    fn scan_every_block(d: &Directory, hashes: &[u64], block: u64) -> Option<ArtifactView> {
        hashes.iter().enumerate().rev().find_map(|(i, h)| {
            let owner = d.artifacts.get(&PrefixKey(*h))?.owner?;
            Some(ArtifactView {
                owner: WorkerId(owner.worker.0),
                tokens: (i as u64 + 1) * block,
            })
        })
    }

    proptest::proptest! {
        /// Probing only where a prefix artifact can end finds what probing every block
        /// found, for prompts that share chains with the directory's artifacts (claimed by
        /// two workers at many lengths, with checkpoints or without), prompts that leave a
        /// chain part-way and prompts that share nothing.
        #[test]
        fn probing_artifact_ends_finds_what_scanning_every_block_found(
            claims in proptest::collection::vec(
                (0u64..3, 1usize..64, proptest::bool::ANY, proptest::bool::ANY),
                0..40,
            ),
            prompts in proptest::collection::vec((0u64..4, 0usize..80, 0usize..90), 1..20),
        ) {
            use crate::command::{ArtifactSpec, Envelope};
            use crate::ids::WorkerId as DirWorker;
            // Chain `c`'s block hashes: equal prefixes give equal hashes, as chained hashes do.
            let chain = |c: u64, n: usize| -> Vec<u64> {
                (0..n as u64).map(|i| (c << 32) | (i + 1)).collect()
            };
            let mut d = Directory::new(0);
            let mut index = 0;
            let mut run = |d: &mut Directory, command: Command| {
                index += 1;
                d.apply(index, &Envelope { now_ms: 1, client: None, command })
            };
            let mut leases = Vec::new();
            for w in 0..2 {
                match run(&mut d, Command::GrantLease { worker: DirWorker(w), ttl_ms: 60_000 }) {
                    Outcome::LeaseGranted { lease, .. } => leases.push(lease),
                    other => panic!("{other:?}"),
                }
            }
            for (c, len, second, checkpointed) in claims {
                let hashes = chain(c, len);
                let checkpoints = if checkpointed {
                    crate::command::checkpoints_of(&hashes)
                } else {
                    Vec::new()
                };
                run(&mut d, Command::Claim {
                    key: PrefixKey(hashes[len - 1]),
                    lease: leases[usize::from(second)],
                    spec: ArtifactSpec {
                        parent: None,
                        blocks: (0, len as u32),
                        kv_type: "kv".into(),
                        size_bytes: 0,
                        checkpoints,
                    },
                    expect_epoch: None,
                });
            }
            for (c, len, leave_at) in prompts {
                // Chain `c` up to `leave_at` blocks, then a chain nobody claimed.
                let mut hashes = chain(c, len);
                for (i, h) in hashes.iter_mut().enumerate().skip(leave_at) {
                    *h = (9 << 32) | (i as u64 + 1);
                }
                proptest::prop_assert_eq!(
                    Lookup::read(&d, None, &hashes, 16).artifact,
                    scan_every_block(&d, &hashes, 16)
                );
            }
        }
    }
}
