//! One node of the replicated ownership directory (feature `node`). It runs openraft over
//! the redb log and the pure state machine, serves the Raft RPCs and the directory API over
//! HTTP, and, while leader, looks every `tick_ms` and proposes a `Tick` when a lease (grace
//! included) or a stored response is due, so expired leases cascade, and raises the
//! directory's version once every member knows a newer one (`upgrade`).
//!
//! # Layout
//! - this file: [`Node`], starting it, proposing commands, linearizable read barriers.
//! - `upgrade`: rolling upgrades (the version raised, newer commands held meanwhile).
//! - `snapshot_schedule`: when the node builds its snapshot (every 5,000 entries, each
//!   voter at its own phase, so members do not all build at once).
//! - `rpc`: the Raft RPC server (and the fault tests' partition route); `api`: the
//!   directory API; [`admin`]: the operator API; `answer`: the error answers both give.
//! - [`client`]: how a router reaches the directory ([`DirectoryClient`]: [`Embedded`] in
//!   process, [`Remote`] over HTTP) and what it reads ([`Lookup`]); [`replica`]: the live
//!   copy a router of a remote cluster reads from, fed by `watch` (a node's applied log as
//!   a stream); [`read_lease`]: how long that copy is read as current, and how long a move
//!   waits before its first step.
//! - [`metrics`]: the node's Prometheus metrics; `error`: [`NodeError`].
//! - `run`: `ownerserve directory` ([`DirectoryArgs`], [`run`]), every route of a node on
//!   one listener; [`secret`]: the cluster secret that guards the Raft RPCs and the
//!   directory API.
//!
//! API (JSON): `POST /directory/v1/commands` `{client?: [id, seq], command}` → `{outcome,
//! log_index}` (a follower forwards it to the leader once; if it cannot, it answers 421
//! with the leader's address); `GET /directory/v1/state`
//! (linearizable: ReadIndex through the leader); `GET /directory/v1/cluster`;
//! `GET /directory/v1/watch?after=N` (the applied log from `N` on, see `watch`); and the
//! operator API under `/admin/v1` (bearer tokens; see `admin`).

pub mod admin;
mod answer;
mod api;
pub mod client;
mod error;
pub mod metrics;
pub mod read_lease;
pub mod replica;
mod rpc;
mod run;
pub mod secret;
mod snapshot_schedule;
mod upgrade;
mod watch;

pub use client::{BoxFuture, DirectoryClient, DirectoryError, Embedded, Lookup, Remote};
pub use error::NodeError;
pub use replica::Replica;
pub use run::{parse_peers, run, DirectoryArgs};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use openraft::{BasicNode, Config};
use tokio_util::sync::CancellationToken;

use crate::raft::log_store::LogStore;
use crate::raft::network::HttpNetworkFactory;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::{NodeId, Raft};
use crate::version::Version;
use crate::{Command, Envelope};

use metrics::{command_names, DirectoryMetrics};

/// Wall-clock milliseconds, stamped by the leader into each entry: the one clock read of
/// the directory, in its shell (the state machine only ever sees this stamp).
#[expect(
    clippy::disallowed_methods,
    clippy::disallowed_types,
    reason = "the node's shell stamps entries; the pure state machine reads no clock"
)]
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A running node's handles.
pub struct Node {
    pub id: NodeId,
    pub raft: Raft,
    pub machine: StateMachineStore,
    pub nodes: BTreeMap<NodeId, BasicNode>,
    /// The network's fault layer (only driven when fault injection is enabled).
    pub faults: crate::raft::network::Faults,
    /// Client for forwarding writes that reach a follower to the leader.
    pub forwarder: reqwest::Client,
    /// What peers and routers must present to reach the Raft RPCs and the directory API
    /// (`None`: they are open, for a trusted network only).
    pub secret: Option<secret::ClusterSecret>,
    /// The node's metrics (registered in its process's registry).
    pub metrics: DirectoryMetrics,
    /// Cancelled when the node stops: its watch streams end then, so the routers following
    /// it move to another node at once and the server's drain does not wait on them.
    pub stopping: CancellationToken,
    /// What the members' releases knew when the leader last asked (`upgrade`).
    members_know: upgrade::MembersKnow,
}

/// Why a read barrier failed.
pub type BarrierError =
    openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, BasicNode>>;

impl Node {
    /// Returns once this node's state machine reflects every write acknowledged before the
    /// call, so a read after it is linearizable. openraft's `ensure_linearizable` is not
    /// enough here: a leader killed and restarted before the others elect a new one resumes
    /// leadership in its old term without knowing the commit index (we do not persist it,
    /// which saves an fsync per commit), and would serve its snapshot's stale state.
    /// Committing an empty batch and reading once it is applied is linearizable regardless
    /// (tests/faults/e2e_linearizability.rs caught the stale read).
    pub async fn read_barrier(&self) -> Result<(), BarrierError> {
        self.propose(
            Command::Batch {
                commands: Vec::new(),
            },
            None,
        )
        .await
        .map(|_| ())
    }

    /// Proposes `command` stamped with the leader's clock.
    pub async fn propose(
        &self,
        command: Command,
        client: Option<(crate::ids::ClientId, u64)>,
    ) -> Result<
        openraft::raft::ClientWriteResponse<crate::raft::TypeConfig>,
        openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, BasicNode>>,
    > {
        let names = command_names(&command);
        // The shell times commands on tokio's clock; the state machine reads none.
        let started = tokio::time::Instant::now();
        let written = self
            .raft
            .client_write(Envelope {
                now_ms: unix_ms(),
                client,
                command,
            })
            .await;
        if let Ok(resp) = &written {
            self.metrics
                .applied(&names, resp.data.as_ref(), started.elapsed());
        }
        written
    }
}

/// openraft's `install_snapshot_timeout` (ms): longer than a million-session directory's
/// install on a busy node (`docs/BENCHMARKS.md`, `bench directory --scale`).
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 60_000;

/// Settings of one node.
pub struct NodeSettings {
    pub id: NodeId,
    pub data_dir: PathBuf,
    pub nodes: BTreeMap<NodeId, BasicNode>,
    /// Initialise the cluster with `nodes` (ignored if already initialised).
    pub init: bool,
    pub grace_ms: u64,
    pub tick_ms: u64,
    /// Where the node counts its commands and reads its state at scrape time.
    pub metrics: DirectoryMetrics,
    /// The cluster secret this node demands and presents to its peers.
    pub cluster_secret: Option<secret::ClusterSecret>,
}

impl Node {
    /// Opens the log and snapshot under `data_dir`, starts Raft, initialises the cluster if
    /// asked, and starts the leader's `Tick` loop (owned by `tracker`, ends with `cancel`).
    pub async fn start(
        s: NodeSettings,
        tracker: &tokio_util::task::TaskTracker,
        cancel: &CancellationToken,
    ) -> Result<Arc<Node>, NodeError> {
        std::fs::create_dir_all(&s.data_dir).map_err(|source| NodeError::DataDir {
            path: s.data_dir.clone(),
            source,
        })?;
        let log = LogStore::open(&s.data_dir.join("log.redb")).map_err(NodeError::Log)?;
        let machine =
            StateMachineStore::open(Some(&s.data_dir), s.grace_ms).map_err(NodeError::Snapshot)?;
        let config = Config {
            cluster_name: "ownerserve-directory".into(),
            // The heartbeat is also openraft's AppendEntries timeout: it must cover a
            // follower's fsync on a busy machine, or batches are resent and tail latency grows.
            heartbeat_interval: 250,
            election_timeout_min: 1_000,
            election_timeout_max: 2_000,
            // Each InstallSnapshot RPC must finish within it, and the last one returns only
            // once the follower has installed the whole state (parsed, written, fsynced). At
            // openraft's 200 ms every send past ~40,000 sessions timed out and started over,
            // so a follower behind the leader's log never caught up (`bench directory
            // --scale`). A follower that dies mid-send only holds its own stream this long.
            install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
            // Built when `snapshot_schedule` asks: openraft's own policy has every member
            // build at the same index, all at once.
            snapshot_policy: openraft::SnapshotPolicy::Never,
            ..Default::default()
        }
        .validate()
        .map_err(|e| NodeError::RaftConfig(Box::new(e)))?;
        let network = HttpNetworkFactory::with_headers(
            s.cluster_secret
                .as_ref()
                .map(secret::ClusterSecret::headers)
                .unwrap_or_default(),
        );
        let faults = network.faults.clone();
        let raft = Raft::new(s.id, Arc::new(config), network, log, machine.clone())
            .await
            .map_err(|e| NodeError::Raft(Box::new(e)))?;
        let node = Arc::new(Node {
            id: s.id,
            raft,
            machine,
            nodes: s.nodes.clone(),
            faults,
            forwarder: secret::client(s.cluster_secret.as_ref(), Duration::from_secs(10)),
            secret: s.cluster_secret,
            metrics: s.metrics,
            stopping: cancel.clone(),
            members_know: upgrade::MembersKnow::default(),
        });
        let single = s.nodes.len() == 1 && s.nodes.contains_key(&s.id);
        if s.init {
            match node.raft.initialize(s.nodes).await {
                Ok(()) => {}
                // Already initialised (a restart): fine.
                Err(openraft::error::RaftError::APIError(
                    openraft::error::InitializeError::NotAllowed(_),
                )) => {}
                Err(e) => return Err(NodeError::Init(Box::new(e))),
            }
        }
        if single {
            // A one-node cluster (embedded in the router) elects itself; wait for that so the
            // first requests find a working directory, at this release's version.
            node.raft
                .wait(Some(Duration::from_secs(10)))
                .current_leader(s.id, "single node elects itself")
                .await
                .map_err(NodeError::Election)?;
            node.raise_version().await;
        }
        tracker.spawn(snapshot_schedule::run(node.clone(), cancel.clone()));
        let (ticking, cancel) = (node.clone(), cancel.clone());
        let every = Duration::from_millis(s.tick_ms.max(10));
        tracker.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = cancel.cancelled() => return,
                }
                // A `Tick` only when something is due: each is a log entry and an fsync, and
                // on a starved machine a queue of idle ticks delays the writes that matter
                // (lease renewals) past their leases.
                let mut due = false;
                ticking.machine.read(|s| {
                    due = s
                        .directory
                        .next_expiry_ms()
                        .is_some_and(|at| at <= unix_ms());
                });
                if due && ticking.raft.current_leader().await == Some(ticking.id) {
                    if let Err(e) = ticking.propose(Command::Tick, None).await {
                        tracing::debug!(error = %e, "tick not committed");
                    }
                }
                // While the directory runs an older version than this release knows (a
                // roll under way, or a new cluster's first entries), the leader asks the
                // members (at most once a second) and raises it once they all know it.
                if ticking.version() < Version::CURRENT {
                    ticking.raise_version().await;
                }
            }
        });
        Ok(node)
    }
}
