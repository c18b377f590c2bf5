//! Raft RPCs over HTTP: `POST http://<node>/raft/{append,vote,snapshot}` with JSON bodies,
//! answered with JSON `Result<Response, RaftError>`. A refused connection is reported as
//! `Unreachable` (openraft backs off); anything else as a network error.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{NodeId, TypeConfig};

/// Peers this node must not reach: a fault layer for partition tests. Empty (and never
/// changed) unless a node is started with fault injection enabled.
#[derive(Clone, Default)]
pub struct Faults {
    blocked: Arc<RwLock<BTreeSet<NodeId>>>,
}

impl Faults {
    /// Replaces the set of unreachable peers.
    pub fn block(&self, peers: BTreeSet<NodeId>) {
        *self.blocked.write().unwrap_or_else(|e| e.into_inner()) = peers;
    }

    fn is_blocked(&self, peer: NodeId) -> bool {
        self.blocked
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&peer)
    }
}

/// Makes a client per peer; all share one connection pool and the fault layer.
#[derive(Clone, Default)]
pub struct HttpNetworkFactory {
    client: reqwest::Client,
    pub faults: Faults,
}

impl HttpNetworkFactory {
    /// A factory whose clients send `headers` with every RPC (the cluster secret).
    pub fn with_headers(headers: reqwest::header::HeaderMap) -> Self {
        Self {
            client: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap_or_default(),
            faults: Faults::default(),
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for HttpNetworkFactory {
    type Network = HttpNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> HttpNetwork {
        HttpNetwork {
            target,
            addr: node.addr.clone(),
            client: self.client.clone(),
            faults: self.faults.clone(),
        }
    }
}

/// The RPC client for one peer.
pub struct HttpNetwork {
    target: NodeId,
    addr: String,
    client: reqwest::Client,
    faults: Faults,
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl HttpNetwork {
    async fn call<Req, Resp, E>(
        &self,
        path: &str,
        req: &Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        if self.faults.is_blocked(self.target) {
            let cut = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "partitioned");
            return Err(RPCError::Unreachable(Unreachable::new(&cut)));
        }
        let url = format!("http://{}/raft/{path}", self.addr);
        let resp = self
            .client
            .post(url)
            // openraft times AppendEntries out after one heartbeat interval; the follower's
            // fsync under load needs all of it.
            .timeout(option.hard_ttl())
            .json(req)
            .send()
            .await
            .map_err(|e| {
                if e.is_connect() {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })?;
        let result: Result<Resp, RaftError<NodeId, E>> = resp
            .json()
            .await
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for HttpNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.call("append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call("snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call("vote", &rpc, &option).await
    }
}
