//! `ownerserve epp` (feature `kubernetes`): the Gateway API Inference Extension endpoint
//! picker. An Envoy ext_proc gRPC server (`envoy.service.ext_proc.v3.ExternalProcessor`)
//! that answers each request's `x-gateway-destination-endpoint` with the session's owner
//! (then fallbacks), from the same identity → view → plan → claim path as the proxy; with
//! gRPC health (`liveness`, `readiness`, the ext_proc service) beside it. It runs the whole
//! router state (workers, discovery, the directory client, the operator API on the
//! router's port), so several EPP replicas sharing a directory agree on every owner: all
//! of them are ready at once.
//!
//! # Layout
//! - this file: the flags, the servers and their health;
//! - `exchange`: one ext_proc stream, message by message (buffered and full-duplex bodies);
//! - `pick`: the decision, through the proxy's stages; the served endpoint's record;
//! - `protocol`: the EPP protocol's keys and the ext_proc messages built and read.

mod exchange;
pub mod pick;
pub mod protocol;

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::state::AppState;

/// The ext_proc service's name, as gRPC health reports it.
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// `ownerserve epp`'s own flags (the router's config, flags and discovery come beside).
#[derive(Debug, Clone, clap::Args)]
pub struct EppFlags {
    /// The ext_proc gRPC port (GIE's convention: 9002).
    #[arg(
        long = "grpc-port",
        env = "OWNERSERVE_EPP_GRPC_PORT",
        default_value_t = 9002
    )]
    pub grpc_port: u16,
    /// The gRPC health port (GIE's convention: 9003); health is also served on the
    /// ext_proc port.
    #[arg(
        long = "grpc-health-port",
        env = "OWNERSERVE_EPP_HEALTH_PORT",
        default_value_t = 9003
    )]
    pub health_port: u16,
    /// Endpoints after the decision's in `x-gateway-destination-endpoint` (the gateway
    /// retries them in order). 0 for gateways whose load balancer reads one address
    /// (Envoy's `ORIGINAL_DST` with `use_http_header`).
    #[arg(long, env = "OWNERSERVE_EPP_FALLBACKS", default_value_t = 2)]
    pub fallbacks: usize,
}

/// The ext_proc service.
struct Picker {
    st: Arc<AppState>,
    fallbacks: usize,
}

type Answers = Pin<Box<dyn futures_util::Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Answers>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let mut exchange = exchange::Exchange::new(self.st.clone(), self.fallbacks);
        self.st.tasks.spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                for answer in exchange.on(message).await {
                    if tx.send(Ok(answer)).await.is_err() {
                        break;
                    }
                }
            }
            exchange.finish();
        });
        let answers =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|a| (a, rx)) },
            );
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Serves ext_proc (with health) on `grpc` and health alone on `health` until `shutdown`.
pub async fn serve(
    st: Arc<AppState>,
    grpc: TcpListener,
    health: TcpListener,
    fallbacks: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    st.tasks
        .spawn(report_readiness(st.clone(), reporter, shutdown.clone()));
    let picker = ExternalProcessorServer::new(Picker {
        st: st.clone(),
        fallbacks,
    });
    let main = tonic::transport::Server::builder()
        .add_service(picker)
        .add_service(health_service.clone())
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(grpc),
            shutdown.clone().cancelled_owned(),
        );
    let side = tonic::transport::Server::builder()
        .add_service(health_service)
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(health),
            shutdown.clone().cancelled_owned(),
        );
    let (a, b) = tokio::join!(main, side);
    a?;
    b?;
    Ok(())
}

/// Readiness (and the ext_proc service's status): serving while some worker is healthy,
/// which is when a pick can succeed, once the local copy of the directory has synced (before
/// that no pick could be claimed). Every replica is ready at once: the directory, not a
/// leader election, keeps their picks consistent.
async fn report_readiness(st: Arc<AppState>, reporter: HealthReporter, cancel: CancellationToken) {
    let mut last = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = cancel.cancelled() => return,
        }
        let synced = st.ownership.as_ref().is_none_or(|s| s.client().synced());
        let ready = synced && st.registry.all().iter().any(|w| w.is_healthy());
        if last == Some(ready) {
            continue;
        }
        last = Some(ready);
        let status = if ready {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        for service in ["readiness", EXT_PROC_SERVICE, ""] {
            reporter.set_service_status(service, status).await;
        }
    }
}

/// Binds the two gRPC listeners on `host`.
pub async fn bind(
    host: std::net::IpAddr,
    f: &EppFlags,
) -> anyhow::Result<(TcpListener, TcpListener)> {
    let grpc = TcpListener::bind(SocketAddr::new(host, f.grpc_port)).await?;
    let health = TcpListener::bind(SocketAddr::new(host, f.health_port)).await?;
    Ok((grpc, health))
}

/// Runs the router's state and HTTP API on `listener` (the operator API, `/metrics`, the
/// proxy too) and the endpoint picker on `grpc` and `health`, until `shutdown` fires.
pub async fn run(
    listener: TcpListener,
    (grpc, health): (TcpListener, TcpListener),
    cfg: crate::config::RouterConfig,
    fallbacks: usize,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tracker = tokio_util::task::TaskTracker::new();
    let state = AppState::start(cfg, &tracker, &shutdown).await?;
    let limits = state.cfg.conn_limits;
    let app = crate::server::app(state.clone());
    let http = ownerserve_edge::serve::serve(listener, app, limits, shutdown.clone());
    let picker = serve(state.clone(), grpc, health, fallbacks, shutdown.clone());
    let (served, picked) = tokio::join!(http, async {
        let r = picker.await;
        shutdown.cancel();
        r
    });
    shutdown.cancel();
    tracker.close();
    tracker.wait().await;
    if let Some(node) = &state.directory {
        node.raft.shutdown().await.ok();
    }
    served?;
    picked
}
