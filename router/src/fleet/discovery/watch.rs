//! The watch: a kube-runtime pod watcher (server-side label selector, managed fields
//! stripped, default backoff) feeding a reflector store, and the reconcile loop that reads
//! the whole store after each burst of events (coalesced) and on a periodic resync. The
//! watcher re-lists by itself after a `410 Gone` or a severed watch; the store swaps in the
//! new list whole, so a pod that vanished while nobody watched is retired on that pass.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::utils::Backoff;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::inference_pool::InferencePoolSpec;
use super::pod_worker::{workers_of, PodMapping, PodWorker};
use super::reconcile::Joined;
use crate::config::{DiscoverySetup, PodSource};
use crate::fleet::registry::{Registry, Worker};

/// Why discovery could not start (it retries after its resync period).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("kubernetes client: {0}")]
    Client(#[from] kube::Error),
    #[error("kubernetes config: {0}")]
    Config(String),
    #[error("InferencePool `{name}`: {why}")]
    Pool { name: String, why: String },
}

/// Called with each worker that joins, to start its probe and scrape tasks.
pub type OnJoin = Arc<dyn Fn(&Arc<Worker>) + Send + Sync>;

/// Discovers workers into `registry` until `cancel` fires; a watch that cannot start
/// (no API server, no pool) is tried again after the resync period.
pub async fn run(
    setup: DiscoverySetup,
    registry: Arc<Registry>,
    on_join: OnJoin,
    cancel: CancellationToken,
) {
    let mut joined = Joined::default();
    loop {
        let watched = watch(&setup, &registry, &on_join, &mut joined, &cancel);
        tokio::select! {
            () = cancel.cancelled() => return,
            r = watched => match r {
                Ok(()) => return,
                Err(e) => tracing::warn!(error = %e, "kubernetes discovery failed; retrying"),
            },
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(setup.resync) => {}
        }
    }
}

/// The client for the configured API server, or the inferred one (in-cluster, kubeconfig).
async fn client(setup: &DiscoverySetup) -> Result<Client, DiscoveryError> {
    match &setup.api_server {
        Some(url) => {
            let uri = url
                .parse()
                .map_err(|e| DiscoveryError::Config(format!("api_server `{url}`: {e}")))?;
            Ok(Client::try_from(kube::Config::new(uri))?)
        }
        None => Ok(Client::try_default().await?),
    }
}

/// The selector and mapping to watch with: the configured ones, or the pool's.
async fn selection(
    setup: &DiscoverySetup,
    client: &Client,
) -> Result<(String, PodMapping), DiscoveryError> {
    let mapping = |ports: Vec<u16>| PodMapping {
        target_ports: ports,
        role_label: setup.role_label.clone(),
        engine_label: setup.engine_label.clone(),
        default_engine: setup.default_engine,
        kv_events_annotation: setup.kv_events_annotation.clone(),
    };
    match &setup.source {
        PodSource::Selector { selector, ports } => Ok((selector.clone(), mapping(ports.clone()))),
        PodSource::InferencePool(name) => {
            let spec = pool_spec(client, &setup.namespace, name).await?;
            Ok((spec.label_selector(), mapping(spec.ports())))
        }
    }
}

/// A named `InferencePool`'s spec.
async fn pool_spec(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<InferencePoolSpec, DiscoveryError> {
    let gvk = GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "inferencepools");
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let pool = api.get(name).await?;
    let bad = |why: String| DiscoveryError::Pool {
        name: name.to_owned(),
        why,
    };
    let spec = pool
        .data
        .get("spec")
        .cloned()
        .ok_or_else(|| bad("no spec".into()))?;
    let spec: InferencePoolSpec =
        serde_json::from_value(spec).map_err(|e| bad(format!("unreadable spec: {e}")))?;
    if spec.selector.match_labels.is_empty() || spec.target_ports.is_empty() {
        return Err(bad("no selector labels or no target ports".into()));
    }
    Ok(spec)
}

/// One watch, until its stream ends or `cancel` fires.
async fn watch(
    setup: &DiscoverySetup,
    registry: &Registry,
    on_join: &OnJoin,
    joined: &mut Joined,
    cancel: &CancellationToken,
) -> Result<(), DiscoveryError> {
    let client = client(setup).await?;
    let (selector, mapping) = selection(setup, &client).await?;
    tracing::info!(namespace = %setup.namespace, %selector, ports = ?mapping.target_ports, "watching pods");
    let api: Api<Pod> = Api::namespaced(client, &setup.namespace);
    let (reader, writer) = reflector::store::<Pod>();
    let changed = Notify::new();
    let events = watcher(api, watcher::Config::default().labels(&selector))
        .modify(|pod| pod.managed_fields_mut().clear())
        .backoff(RetryBackoff::default())
        .reflect(writer);
    let pump = async {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                tracing::debug!(error = %e, "pod watch error (the watcher retries)");
            }
            changed.notify_one();
        }
    };
    let reconcile = async {
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let mut resync = tokio::time::interval(setup.resync);
        loop {
            let desired = desired(&reader.state(), &mapping);
            let n = joined.apply(&desired, registry, on_join.as_ref());
            if n > 0 {
                tracing::debug!(changes = n, "workers reconciled with the pods");
            }
            tokio::select! {
                () = changed.notified() => tokio::time::sleep(setup.coalesce).await,
                _ = resync.tick() => {}
            }
        }
    };
    tokio::select! {
        () = pump => {}
        () = reconcile => {}
        () = cancel.cancelled() => {}
    }
    Ok(())
}

/// The workers the watched pods run, pods that run none skipped (said once at debug).
fn desired(pods: &[Arc<Pod>], mapping: &PodMapping) -> Vec<PodWorker> {
    let mut out = Vec::new();
    for pod in pods {
        match workers_of(pod, mapping) {
            Ok(ws) => out.extend(ws),
            Err(e) => tracing::debug!(reason = %e, "pod runs no worker"),
        }
    }
    out
}

/// The wait before the watcher tries again after an error (a `410 Gone`, a refused
/// connection): 100 ms, doubling to 30 s, back to 100 ms once it succeeds. kube's default
/// starts at 800 ms, which would keep a re-list after `410 Gone` from showing in time.
#[derive(Debug, Clone)]
struct RetryBackoff {
    next: Duration,
}

impl RetryBackoff {
    const FIRST: Duration = Duration::from_millis(100);
    const MAX: Duration = Duration::from_secs(30);
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self { next: Self::FIRST }
    }
}

impl Iterator for RetryBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(Self::MAX);
        Some(now)
    }
}

impl Backoff for RetryBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}
