//! The tokio runtime's live tasks, read at scrape time: every server's background work is
//! tasks, so a task that never ends (a leak) shows as a count that only grows
//! (`ownerserve bench soak` watches it).

use prometheus::{IntGauge, Registry};

use crate::exposition::int_gauge;

/// `ownerserve_runtime_alive_tasks`.
#[derive(Debug, Clone)]
pub struct RuntimeMetrics {
    alive_tasks: IntGauge,
}

impl RuntimeMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            alive_tasks: int_gauge(
                registry,
                "ownerserve_runtime_alive_tasks",
                "Tasks alive on this process's tokio runtime (spawned and not yet ended).",
            )?,
        })
    }

    /// Reads the runtime this is called on (none: the gauge keeps its value).
    pub fn refresh(&self) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let alive = handle.metrics().num_alive_tasks();
            self.alive_tasks
                .set(i64::try_from(alive).unwrap_or(i64::MAX));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_gauge_counts_the_tasks_alive() {
        let registry = Registry::new();
        let m = RuntimeMetrics::register(&registry).unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let tracker = tokio_util::task::TaskTracker::new();
        tracker.spawn(async move {
            let _ = rx.await;
        });
        m.refresh();
        assert!(m.alive_tasks.get() >= 1);
        drop(tx);
        tracker.close();
        tracker.wait().await;
        assert!(crate::exposition::render(&registry).contains("ownerserve_runtime_alive_tasks "));
    }
}
