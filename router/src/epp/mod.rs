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

use crate::server::state::AppState;

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
    /// On SIGTERM (Kubernetes deleting the pod), how long the picker goes on answering new
    /// streams while its gRPC health already says NOT_SERVING, so every gateway's health
    /// check (and the endpoints controller) takes it out of rotation before it stops
    /// accepting; then it finishes the streams in flight (bounded by the router's drain)
    /// and exits. Keep it under the pod's `terminationGracePeriodSeconds`.
    #[arg(
        long = "shutdown-delay-ms",
        env = "OWNERSERVE_EPP_SHUTDOWN_DELAY_MS",
        default_value_t = 5000
    )]
    pub shutdown_delay_ms: u64,
}

impl EppFlags {
    /// How long the picker answers after SIGTERM, NOT_SERVING.
    pub fn shutdown_delay(&self) -> Duration {
        Duration::from_millis(self.shutdown_delay_ms)
    }
}

/// How the picker stops: `signal` (SIGTERM) turns its health NOT_SERVING, `delay` later it
/// stops accepting and finishes the streams in flight, `drain` at most.
#[derive(Clone)]
pub struct Stopping {
    pub signal: CancellationToken,
    pub delay: Duration,
    pub drain: Duration,
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

/// Serves ext_proc (with health) on `grpc` and health alone on `health` until `stop`
/// fires, then drains: NOT_SERVING at once, new streams still answered for `stop.delay`
/// (gateways take the replica out of rotation meanwhile), then the listener closes, the
/// streams in flight finish (`stop.drain` at most: a gateway that keeps one open does not
/// hold the exit), and health goes down last.
pub async fn serve(
    st: Arc<AppState>,
    grpc: TcpListener,
    health: TcpListener,
    fallbacks: usize,
    stop: Stopping,
) -> anyhow::Result<()> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    st.tasks
        .spawn(report_readiness(st.clone(), reporter, stop.signal.clone()));
    let picker = ExternalProcessorServer::new(Picker {
        st: st.clone(),
        fallbacks,
    });
    let closing = {
        let (signal, delay) = (stop.signal.clone(), stop.delay);
        async move {
            signal.cancelled().await;
            tokio::time::sleep(delay).await;
        }
    };
    let main = tonic::transport::Server::builder()
        .add_service(picker)
        .add_service(health_service.clone())
        .serve_with_incoming_shutdown(incoming(grpc), closing);
    let main = async {
        let bound = async {
            stop.signal.cancelled().await;
            tokio::time::sleep(stop.delay + stop.drain).await;
        };
        tokio::select! {
            served = main => served,
            () = bound => {
                tracing::warn!(after = ?stop.drain, "ext_proc streams still open at shutdown were cut");
                Ok(())
            }
        }
    };
    let health_down = CancellationToken::new();
    let side = tonic::transport::Server::builder()
        .add_service(health_service)
        .serve_with_incoming_shutdown(incoming(health), health_down.clone().cancelled_owned());
    let (a, b) = tokio::join!(
        async {
            let served = main.await;
            health_down.cancel();
            served
        },
        side
    );
    a?;
    b?;
    Ok(())
}

/// Accepted connections with Nagle off: an ext_proc exchange is small messages each way,
/// and with Nagle on, each answer waited for the gateway's delayed ACK (about 40 ms).
fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Readiness (and the ext_proc service's status): serving while some worker is healthy,
/// which is when a pick can succeed, once the local copy of the directory has synced (before
/// that no pick could be claimed). Every replica is ready at once: the directory, not a
/// leader election, keeps their picks consistent. From `stopping` on: NOT_SERVING for good.
async fn report_readiness(
    st: Arc<AppState>,
    reporter: HealthReporter,
    stopping: CancellationToken,
) {
    let mut last = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stopping.cancelled() => {
                for service in ["readiness", EXT_PROC_SERVICE, ""] {
                    reporter.set_service_status(service, ServingStatus::NotServing).await;
                }
                tracing::info!("stopping: ext_proc reports NOT_SERVING, draining");
                return;
            }
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
/// proxy too) and the endpoint picker on `grpc` and `health`. When `shutdown` fires
/// (SIGTERM) the picker drains first (`flags.shutdown_delay`, then its streams in flight),
/// while the state it picks with (workers, the directory client, the records' sync) and
/// the HTTP API keep running; then they stop.
pub async fn run(
    listener: TcpListener,
    (grpc, health): (TcpListener, TcpListener),
    cfg: crate::config::RouterConfig,
    flags: &EppFlags,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let tracker = tokio_util::task::TaskTracker::new();
    let state_stop = CancellationToken::new();
    let state = AppState::start(cfg, &tracker, &state_stop).await?;
    let limits = state.cfg.conn_limits;
    let app = crate::server::app(state.clone());
    let http = ownerserve_edge::serve::serve(listener, app, limits, state_stop.clone());
    let stop = Stopping {
        signal: shutdown.clone(),
        delay: flags.shutdown_delay(),
        drain: limits.drain,
    };
    let picker = serve(state.clone(), grpc, health, flags.fallbacks, stop);
    let (served, picked) = tokio::join!(http, async {
        let r = picker.await;
        state_stop.cancel();
        r
    });
    state_stop.cancel();
    tracker.close();
    tracker.wait().await;
    if let Some(node) = &state.directory {
        node.raft.shutdown().await.ok();
    }
    served?;
    picked
}
