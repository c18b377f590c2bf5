//! The tasks each worker runs in the router (its health probe, its `/metrics` scrape, its
//! KV-event subscriber), started for a worker that joins at run time; they end when the
//! router shuts down or the worker is retired. Configured workers get theirs from
//! `server` at startup.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::DiscoverySetup;
use crate::fleet::health::{self, HealthSettings};
use crate::fleet::kv::{self, KvRouting};
use crate::fleet::registry::{Registry, Worker};
use crate::upstream::HttpClient;

/// What a joining worker's tasks need.
#[derive(Clone)]
pub struct WorkerTasks {
    pub client: HttpClient,
    pub health: HealthSettings,
    /// The scrape interval and timeout (`None`: no scrapes).
    pub scrape: Option<(Duration, Duration)>,
    pub kv: Arc<KvRouting>,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
}

impl WorkerTasks {
    /// Starts `w`'s tasks, probing it at once so it is routed to as soon as it answers.
    pub fn start(&self, w: &Arc<Worker>) {
        let (client, worker, s) = (self.client.clone(), w.clone(), self.health.clone());
        self.tracker
            .spawn(async move { health::check(&client, &worker, &s).await });
        health::spawn_one(
            &self.client,
            w,
            self.health.clone(),
            &self.tracker,
            &self.shutdown,
        );
        if let Some(every) = self.scrape {
            kv::spawn_scraper(w, &self.client, every, &self.tracker, &self.shutdown);
        }
        kv::subscribe_joined(&self.kv, w, &self.tracker, &self.shutdown);
    }
}

/// Starts Kubernetes discovery into `registry`, each joining worker's tasks with it.
#[cfg(feature = "kubernetes")]
pub fn discover(
    setup: DiscoverySetup,
    registry: &Arc<Registry>,
    tasks: WorkerTasks,
) -> anyhow::Result<()> {
    let (tracker, shutdown) = (tasks.tracker.clone(), tasks.shutdown.clone());
    let on_join: crate::fleet::discovery::watch::OnJoin = Arc::new(move |w| tasks.start(w));
    tracker.spawn(crate::fleet::discovery::run(
        setup,
        registry.clone(),
        on_join,
        shutdown,
    ));
    Ok(())
}

/// Without the `kubernetes` feature a config with discovery does not validate.
#[cfg(not(feature = "kubernetes"))]
pub fn discover(
    _setup: DiscoverySetup,
    _registry: &Arc<Registry>,
    _tasks: WorkerTasks,
) -> anyhow::Result<()> {
    anyhow::bail!("this binary was built without the `kubernetes` feature")
}
