//! `ownerserve directory`: one node of the replicated ownership directory. It runs openraft
//! over the redb log and the pure state machine (`ownerserve_ownership`), serves the Raft
//! RPCs and the directory API over HTTP, and, while leader, proposes a `Tick` every
//! `tick_ms` so expired leases cascade.
//!
//! API (JSON): `POST /directory/v1/commands` `{client?: [id, seq], command}` → `{outcome,
//! log_index}` (a follower forwards it to the leader once; if it cannot, it answers 421
//! with the leader's address); `GET /directory/v1/state`
//! (linearizable: ReadIndex through the leader); `GET /directory/v1/cluster`; and the
//! operator API under `/admin/v1` (bearer tokens; see `admin`).

pub mod admin;
mod http;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use openraft::{BasicNode, Config};
use tokio_util::sync::CancellationToken;

use ownerserve_ownership::raft::log_store::LogStore;
use ownerserve_ownership::raft::network::HttpNetworkFactory;
use ownerserve_ownership::raft::state_machine::StateMachineStore;
use ownerserve_ownership::raft::{NodeId, Raft};
use ownerserve_ownership::{Command, Envelope};

use crate::metrics::directory::{command_names, DirectoryMetrics};
use crate::metrics::http::HttpMetrics;
use crate::process::{bind, cancel_on_signal, say};

/// Flags of `ownerserve directory`.
#[derive(Debug, clap::Args)]
pub struct DirectoryArgs {
    /// This node's id (unique in the cluster, ≥ 1).
    #[arg(long, env = "OWNERSERVE_DIRECTORY_ID")]
    id: NodeId,
    /// Address to listen on for Raft RPCs and the directory API.
    #[arg(long, env = "OWNERSERVE_DIRECTORY_LISTEN")]
    listen: SocketAddr,
    /// Folder for the Raft log and snapshots (created if missing).
    #[arg(long, env = "OWNERSERVE_DIRECTORY_DATA_DIR")]
    data_dir: PathBuf,
    /// Cluster members `ID=HOST:PORT`, this node included: repeat `--peer`, or give a
    /// comma-separated list to `--peers`.
    #[arg(
        long = "peer",
        visible_alias = "peers",
        value_delimiter = ',',
        env = "OWNERSERVE_DIRECTORY_PEERS"
    )]
    peers: Vec<String>,
    /// Initialise the cluster with the given peers (safe to repeat on restart).
    #[arg(long)]
    init: bool,
    /// Slack added to every lease expiry, covering clock offset between leaders.
    #[arg(long, default_value_t = 500)]
    grace_ms: u64,
    /// How often the leader proposes a `Tick`.
    #[arg(long, default_value_t = 250)]
    tick_ms: u64,
    /// Admin bearer token for /admin/v1 (generated and printed when none is set).
    #[arg(long, env = "OWNERSERVE_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Read-only bearer token for /admin/v1.
    #[arg(long, env = "OWNERSERVE_READ_TOKEN", hide_env_values = true)]
    read_token: Option<String>,
    /// Serve `POST /test/v1/partition` (admin token) to cut this node off from peers.
    /// For fault tests only.
    #[arg(long)]
    fault_injection: bool,
}

/// Wall-clock milliseconds, stamped by the leader into each entry.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn parse_peers(peers: &[String]) -> anyhow::Result<BTreeMap<NodeId, BasicNode>> {
    peers
        .iter()
        .map(|p| {
            let (id, addr) = p
                .split_once('=')
                .with_context(|| format!("--peer `{p}`: expected ID=HOST:PORT"))?;
            let id: NodeId = id
                .parse()
                .with_context(|| format!("--peer `{p}`: bad id"))?;
            addr.parse::<SocketAddr>()
                .with_context(|| format!("--peer `{p}`: bad address"))?;
            Ok((id, BasicNode::new(addr)))
        })
        .collect()
}

/// A running node's handles.
pub struct Node {
    pub id: NodeId,
    pub raft: Raft,
    pub machine: StateMachineStore,
    pub nodes: BTreeMap<NodeId, BasicNode>,
    /// The network's fault layer (only driven when fault injection is enabled).
    pub faults: ownerserve_ownership::raft::network::Faults,
    /// Client for forwarding writes that reach a follower to the leader.
    pub forwarder: reqwest::Client,
    /// The node's metrics (registered in its process's registry).
    pub metrics: DirectoryMetrics,
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
    /// (tests/e2e_linearizability.rs caught the stale read).
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
        client: Option<(ownerserve_ownership::ids::ClientId, u64)>,
    ) -> Result<
        openraft::raft::ClientWriteResponse<ownerserve_ownership::raft::TypeConfig>,
        openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, BasicNode>>,
    > {
        let names = command_names(&command);
        let started = std::time::Instant::now();
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
}

impl Node {
    /// Opens the log and snapshot under `data_dir`, starts Raft, initialises the cluster if
    /// asked, and starts the leader's `Tick` loop (owned by `tracker`, ends with `cancel`).
    pub async fn start(
        s: NodeSettings,
        tracker: &tokio_util::task::TaskTracker,
        cancel: &CancellationToken,
    ) -> anyhow::Result<Arc<Node>> {
        std::fs::create_dir_all(&s.data_dir)
            .with_context(|| format!("cannot create {}", s.data_dir.display()))?;
        let log =
            LogStore::open(&s.data_dir.join("log.redb")).context("cannot open the raft log")?;
        let machine = StateMachineStore::open(Some(&s.data_dir), s.grace_ms)
            .context("cannot load the snapshot")?;
        let config = Config {
            cluster_name: "ownerserve-directory".into(),
            // The heartbeat is also openraft's AppendEntries timeout: it must cover a
            // follower's fsync on a busy machine, or batches are resent and tail latency grows.
            heartbeat_interval: 250,
            election_timeout_min: 1_000,
            election_timeout_max: 2_000,
            ..Default::default()
        }
        .validate()?;
        let network = HttpNetworkFactory::default();
        let faults = network.faults.clone();
        let raft = Raft::new(s.id, Arc::new(config), network, log, machine.clone())
            .await
            .context("cannot start raft")?;
        let node = Arc::new(Node {
            id: s.id,
            raft,
            machine,
            nodes: s.nodes.clone(),
            faults,
            forwarder: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            metrics: s.metrics,
        });
        let single = s.nodes.len() == 1 && s.nodes.contains_key(&s.id);
        if s.init {
            match node.raft.initialize(s.nodes).await {
                Ok(()) => {}
                // Already initialised (a restart): fine.
                Err(openraft::error::RaftError::APIError(
                    openraft::error::InitializeError::NotAllowed(_),
                )) => {}
                Err(e) => return Err(e).context("cannot initialise the cluster"),
            }
        }
        if single {
            // A one-node cluster (embedded in the router) elects itself; wait for that so the
            // first requests find a working directory.
            node.raft
                .wait(Some(Duration::from_secs(10)))
                .current_leader(s.id, "single node elects itself")
                .await
                .context("the embedded directory did not elect itself")?;
        }
        let (ticking, cancel) = (node.clone(), cancel.clone());
        let every = Duration::from_millis(s.tick_ms.max(10));
        tracker.spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    () = cancel.cancelled() => return,
                }
                if ticking.raft.current_leader().await == Some(ticking.id) {
                    if let Err(e) = ticking.propose(Command::Tick, None).await {
                        tracing::debug!(error = %e, "tick not committed");
                    }
                }
            }
        });
        Ok(node)
    }
}

/// Runs a directory node until Ctrl-C.
pub async fn run(args: DirectoryArgs) -> anyhow::Result<()> {
    if args.id == 0 {
        bail!("--id must be at least 1");
    }
    let nodes = parse_peers(&args.peers)?;
    let (tokens, origin) =
        crate::auth::Tokens::resolve(args.admin_token.clone(), args.read_token.clone())?;
    if args.init && !nodes.contains_key(&args.id) {
        bail!("--init needs this node ({}) among the --peer list", args.id);
    }
    let listener = bind(args.listen).await?;
    let shutdown = CancellationToken::new();
    let tracker = tokio_util::task::TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &tracker)?;
    let registry = prometheus::Registry::new();
    let http_metrics = std::sync::Arc::new(HttpMetrics::register(&registry)?);
    let node = Node::start(
        NodeSettings {
            id: args.id,
            data_dir: args.data_dir.clone(),
            nodes,
            init: args.init,
            grace_ms: args.grace_ms,
            tick_ms: args.tick_ms,
            metrics: DirectoryMetrics::register(&registry)?,
        },
        &tracker,
        &shutdown,
    )
    .await?;
    if origin == crate::auth::Origin::Generated {
        say(&format!(
            "admin token (for /admin/v1, `Authorization: Bearer ...`): {}",
            tokens.admin()
        ));
    }
    say(&format!(
        "ownerserve directory node {} listening on http://{}",
        args.id,
        listener.local_addr()?
    ));
    let tokens = Arc::new(tokens);
    let mut app = http::app(node.clone(), tokens.clone(), Arc::new(registry));
    if args.fault_injection {
        app = app.merge(http::fault_routes(node.clone(), tokens));
    }
    let app = app.layer(axum::middleware::from_fn_with_state(
        http_metrics,
        crate::request_id::track,
    ));
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await;
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    node.raft.shutdown().await.ok();
    served.context("directory server failed")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        args: DirectoryArgs,
    }

    #[test]
    fn peers_come_repeated_or_comma_separated_and_bad_ones_are_named() {
        let flags = Flags::try_parse_from([
            "directory",
            "--id=1",
            "--listen=127.0.0.1:7001",
            "--data-dir=d",
            "--peers=1=127.0.0.1:7001,2=127.0.0.1:7002",
            "--peer=3=127.0.0.1:7003",
        ])
        .unwrap();
        let nodes = parse_peers(&flags.args.peers).unwrap();
        assert_eq!(nodes.keys().copied().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(nodes[&2].addr, "127.0.0.1:7002");
        let bad = parse_peers(&["2=nowhere".to_string()]).unwrap_err();
        assert!(
            format!("{bad:#}").contains("`2=nowhere`: bad address"),
            "{bad:#}"
        );
    }
}
