//! The tokio runtime's live tasks, read at scrape time: every server's background work is
//! tasks, so a task that never ends (a leak) shows as a count that only grows
//! (`ownerserve bench soak` watches it). Beside them, the allocator's live and resident
//! bytes, where the binary installed a [`HeapProbe`]: resident far above live is memory the
//! allocator keeps, live that only grows is the program's.

use std::sync::OnceLock;

use prometheus::{IntGauge, Registry};

use crate::exposition::int_gauge;

/// The allocator's bytes: `(allocated, resident)`, or `None` where it cannot tell.
pub type HeapProbe = fn() -> Option<(u64, u64)>;

static HEAP_PROBE: OnceLock<HeapProbe> = OnceLock::new();

/// Installs the process's heap probe (the binary's, which knows its allocator); a second
/// call is ignored.
pub fn install_heap_probe(probe: HeapProbe) {
    let _ = HEAP_PROBE.set(probe);
}

/// The process's heap now, `(allocated, resident)` bytes, by its installed probe (`None`
/// without one).
pub fn heap_now() -> Option<(u64, u64)> {
    HEAP_PROBE.get().and_then(|probe| probe())
}

/// `ownerserve_runtime_alive_tasks`, `ownerserve_heap_allocated_bytes`,
/// `ownerserve_heap_resident_bytes`.
#[derive(Debug, Clone)]
pub struct RuntimeMetrics {
    alive_tasks: IntGauge,
    heap_allocated: IntGauge,
    heap_resident: IntGauge,
}

impl RuntimeMetrics {
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        Ok(Self {
            alive_tasks: int_gauge(
                registry,
                "ownerserve_runtime_alive_tasks",
                "Tasks alive on this process's tokio runtime (spawned and not yet ended).",
            )?,
            heap_allocated: int_gauge(
                registry,
                "ownerserve_heap_allocated_bytes",
                "Bytes the process holds allocated (live), by its allocator's count; 0 where unknown.",
            )?,
            heap_resident: int_gauge(
                registry,
                "ownerserve_heap_resident_bytes",
                "Bytes of the allocator's pages resident in memory (live, free but not yet returned, and its own metadata); 0 where unknown.",
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
        if let Some((allocated, resident)) = heap_now() {
            self.heap_allocated
                .set(i64::try_from(allocated).unwrap_or(i64::MAX));
            self.heap_resident
                .set(i64::try_from(resident).unwrap_or(i64::MAX));
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

    #[test]
    fn the_heap_gauges_read_the_installed_probe() {
        let registry = Registry::new();
        let m = RuntimeMetrics::register(&registry).unwrap();
        m.refresh();
        assert_eq!(m.heap_allocated.get(), 0, "no probe, no figure");
        install_heap_probe(|| Some((5 << 20, 7 << 20)));
        m.refresh();
        assert_eq!(m.heap_allocated.get(), 5 << 20);
        assert_eq!(m.heap_resident.get(), 7 << 20);
    }
}
