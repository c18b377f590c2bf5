//! `ownerserve directory`: its flags, and running one node until Ctrl-C: the Raft RPCs,
//! the directory API, the operator API and `/metrics` on one listener.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use openraft::BasicNode;
use tokio_util::sync::CancellationToken;

use ownerserve_edge::auth::{Origin, Tokens};
use ownerserve_edge::exposition;
use ownerserve_edge::http_metrics::HttpMetrics;
use ownerserve_edge::process::{bind, cancel_on_signal, say};
use ownerserve_edge::runtime_metrics::RuntimeMetrics;

use super::metrics::DirectoryMetrics;
use super::secret::{self, ClusterSecret};
use super::{admin, api, rpc, Node, NodeError, NodeSettings};
use crate::raft::NodeId;

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
    /// comma-separated list to `--peers`. HOST is an IP address or a DNS name (a
    /// StatefulSet's `ownerserve-directory-0.ownerserve-directory`), resolved at each
    /// connection, so a peer that comes back on another pod IP is found again.
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
    /// The secret every node and router of the cluster shares (at least 16 characters):
    /// the Raft RPCs and the directory API refuse requests without it.
    #[arg(long, env = "OWNERSERVE_CLUSTER_SECRET", hide_env_values = true)]
    cluster_secret: Option<String>,
    /// Run without a cluster secret: anyone who reaches the port can vote, append to the
    /// log and write the directory. Only for a network you trust completely.
    #[arg(long, conflicts_with = "cluster_secret")]
    no_cluster_secret: bool,
    /// Serve `POST /test/v1/partition` (admin token) to cut this node off from peers.
    /// For fault tests only.
    #[arg(long)]
    fault_injection: bool,
    /// Stop when standard input closes: a parent that started this node with a pipe
    /// (`ownerserve up --ha`) takes it down when it exits, even when it is killed.
    #[arg(long, hide = true)]
    exit_with_stdin: bool,
}

/// Cluster members from `--peer` values (`ID=HOST:PORT`), as `ownerserve directory` and
/// `ownerserve ctl directory restore` read them.
pub fn parse_peers(peers: &[String]) -> Result<BTreeMap<NodeId, BasicNode>, NodeError> {
    peers
        .iter()
        .map(|p| {
            let peer = || p.clone();
            let (id, addr) = p
                .split_once('=')
                .ok_or_else(|| NodeError::PeerShape { peer: peer() })?;
            let id: NodeId = id.parse().map_err(|source| NodeError::PeerId {
                peer: peer(),
                source,
            })?;
            if !host_port(addr) {
                return Err(NodeError::PeerAddr { peer: peer() });
            }
            Ok((id, BasicNode::new(addr)))
        })
        .collect()
}

/// Whether `addr` is `IP:PORT` (`[v6]:PORT` too) or `NAME:PORT` with NAME a DNS name
/// (letters, digits, `-` in dot-separated labels of at most 63 characters, not starting or
/// ending with `-`).
fn host_port(addr: &str) -> bool {
    if addr.parse::<SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = addr.rsplit_once(':') else {
        return false;
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    port.parse::<u16>().is_ok_and(|p| p > 0)
        && host.len() <= 253
        && host.split('.').all(label)
        && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
}

/// Runs a directory node until Ctrl-C.
pub async fn run(args: DirectoryArgs) -> Result<(), NodeError> {
    if args.id == 0 {
        return Err(NodeError::ZeroId);
    }
    let nodes = parse_peers(&args.peers)?;
    let cluster_secret = match (&args.cluster_secret, args.no_cluster_secret) {
        (Some(s), _) => Some(ClusterSecret::new(s).map_err(NodeError::ClusterSecret)?),
        (None, true) => {
            tracing::warn!("no cluster secret: anyone who reaches this node can vote, append to its log and write the directory");
            None
        }
        (None, false) => return Err(NodeError::NoClusterSecret),
    };
    let (tokens, origin) = Tokens::resolve(args.admin_token.clone(), args.read_token.clone())
        .map_err(NodeError::Token)?;
    if args.init && !nodes.contains_key(&args.id) {
        return Err(NodeError::InitWithoutSelf { id: args.id });
    }
    let listener = bind(args.listen).await?;
    let shutdown = CancellationToken::new();
    let tracker = tokio_util::task::TaskTracker::new();
    cancel_on_signal(shutdown.clone(), &tracker)?;
    if args.exit_with_stdin {
        let stop = shutdown.clone();
        tracker.spawn(async move {
            let mut sink = tokio::io::sink();
            // Ends at EOF (the parent is gone) or on a read error alike.
            let _ = tokio::io::copy(&mut tokio::io::stdin(), &mut sink).await;
            stop.cancel();
        });
    }
    let registry = prometheus::Registry::new();
    let http_metrics = Arc::new(HttpMetrics::register(&registry)?);
    let runtime = RuntimeMetrics::register(&registry)?;
    let node = Node::start(
        NodeSettings {
            id: args.id,
            data_dir: args.data_dir.clone(),
            nodes,
            init: args.init,
            grace_ms: args.grace_ms,
            tick_ms: args.tick_ms,
            metrics: DirectoryMetrics::register(&registry)?,
            cluster_secret,
        },
        &tracker,
        &shutdown,
    )
    .await?;
    if origin == Origin::Generated {
        say(&format!(
            "admin token (for /admin/v1, `Authorization: Bearer ...`): {}",
            tokens.admin()
        ));
    }
    say(&format!(
        "ownerserve directory node {} listening on http://{}",
        args.id,
        listener.local_addr().map_err(NodeError::Serve)?
    ));
    let tokens = Arc::new(tokens);
    let mut app = app(node.clone(), tokens.clone(), Arc::new(registry), runtime);
    if args.fault_injection {
        app = app.merge(rpc::fault_routes(node.clone(), tokens));
    }
    let app = app.layer(ownerserve_edge::tracked::layer(http_metrics));
    let limits = ownerserve_edge::serve::ConnLimits::default();
    let served = ownerserve_edge::serve::serve(listener, app, limits, shutdown.clone()).await;
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    node.raft.shutdown().await.ok();
    served.map_err(NodeError::Serve)
}

/// Every route of a node: Raft RPCs, the directory API, the operator API (bearer tokens)
/// and `/metrics`.
fn app(
    node: Arc<Node>,
    tokens: Arc<Tokens>,
    registry: Arc<prometheus::Registry>,
    runtime: RuntimeMetrics,
) -> Router {
    let metrics =
        Router::new()
            .route("/metrics", get(metrics))
            .with_state((node.clone(), registry, runtime));
    let mut cluster = rpc::routes(node.clone()).merge(api::routes(node.clone()));
    if let Some(s) = &node.secret {
        cluster = cluster.route_layer(axum::middleware::from_fn_with_state(
            s.clone(),
            secret::require,
        ));
    }
    cluster.merge(admin::routes(node, tokens)).merge(metrics)
}

/// `GET /metrics`: the node's directory, Raft and runtime metrics, read now.
async fn metrics(
    State((n, registry, runtime)): State<(Arc<Node>, Arc<prometheus::Registry>, RuntimeMetrics)>,
) -> Response {
    n.metrics.refresh(&n);
    runtime.refresh();
    (
        [(header::CONTENT_TYPE, exposition::CONTENT_TYPE)],
        exposition::render(&registry),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
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
        // A StatefulSet's stable names, and IPv6.
        let named = parse_peers(&[
            "1=ownerserve-directory-0.ownerserve-directory:7000".to_string(),
            "2=localhost:7002".to_string(),
            "3=[::1]:7003".to_string(),
        ])
        .unwrap();
        assert_eq!(
            named[&1].addr,
            "ownerserve-directory-0.ownerserve-directory:7000"
        );
        for bad in [
            "2=host:0",
            "2=host:99999",
            "2=-host:7000",
            "2=ho_st:7000",
            "2=a..b:7000",
            "2=300.1.1.1:7000",
            "2=host",
            "2=:7000",
        ] {
            assert!(parse_peers(&[bad.to_string()]).is_err(), "{bad}");
        }
        for (peer, message) in [
            ("2", "--peer `2`: expected ID=HOST:PORT"),
            ("x=127.0.0.1:7002", "--peer `x=127.0.0.1:7002`: bad id"),
        ] {
            let bad = parse_peers(&[peer.to_string()]).unwrap_err();
            assert_eq!(bad.to_string(), message);
        }
    }
}
