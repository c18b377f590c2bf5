//! Why a directory node could not start or stopped.

use std::path::PathBuf;

use crate::raft::NodeId;

/// openraft's refusal to initialise a cluster.
pub type InitError = openraft::error::RaftError<
    NodeId,
    openraft::error::InitializeError<NodeId, openraft::BasicNode>,
>;

/// A node that cannot start or serve.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot create {}", path.display())]
    DataDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the raft log")]
    Log(#[source] crate::raft::log_store::LogOpenError),
    #[error("cannot load the snapshot")]
    Snapshot(#[source] crate::raft::state_machine::OpenError),
    // openraft's errors are large and small functions return this type too: boxed.
    #[error("invalid raft settings")]
    RaftConfig(#[source] Box<openraft::ConfigError>),
    #[error("cannot start raft")]
    Raft(#[source] Box<openraft::error::Fatal<NodeId>>),
    #[error("cannot initialise the cluster")]
    Init(#[source] Box<InitError>),
    #[error("the embedded directory did not elect itself")]
    Election(#[source] openraft::metrics::WaitError),
    #[error("--id must be at least 1")]
    ZeroId,
    #[error(
        "set --cluster-secret (or OWNERSERVE_CLUSTER_SECRET), the same on every node and router of the cluster; --no-cluster-secret runs the Raft and directory endpoints open to anyone who reaches the port"
    )]
    NoClusterSecret,
    #[error("--cluster-secret")]
    ClusterSecret(#[source] super::secret::SecretError),
    #[error("--init needs this node ({id}) among the --peer list")]
    InitWithoutSelf { id: NodeId },
    #[error("--peer `{peer}`: expected ID=HOST:PORT")]
    PeerShape { peer: String },
    #[error("--peer `{peer}`: bad id")]
    PeerId {
        peer: String,
        #[source]
        source: std::num::ParseIntError,
    },
    #[error("--peer `{peer}`: bad address (HOST:PORT, HOST an IP address or a DNS name)")]
    PeerAddr { peer: String },
    #[error("cannot register the node's metrics")]
    Metrics(#[from] prometheus::Error),
    #[error("cannot make an admin token")]
    Token(#[source] std::io::Error),
    #[error(transparent)]
    Process(#[from] ownerserve_edge::process::ProcessError),
    #[error("directory server failed")]
    Serve(#[source] std::io::Error),
}
