//! What the soak samples every few seconds: each process's resident memory, open file
//! descriptors and threads (from `/proc`), and the live tokio tasks of the processes that
//! export them (`ownerserve_runtime_alive_tasks` on `/metrics`: routers and directory
//! nodes) with their live heap (`ownerserve_heap_allocated_bytes`): RSS that grows while
//! the live heap stays is the allocator's, not a leak.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::topology::Part;
use crate::proc_stats::{open_fds, rss_kb, threads};

/// The gauge of live tokio tasks on a server's `/metrics`.
pub const TASKS_METRIC: &str = "ownerserve_runtime_alive_tasks";

/// The gauge of the live heap's bytes on a server's `/metrics`.
pub const HEAP_METRIC: &str = "ownerserve_heap_allocated_bytes";

/// One process at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcSample {
    /// Seconds since the soak began.
    pub at_s: f64,
    pub part: Part,
    pub rss_kb: u64,
    pub fds: u64,
    pub threads: u64,
    pub tasks: Option<u64>,
    /// Live heap, KiB (where the process exports it).
    pub heap_kb: Option<u64>,
}

/// The running processes: pid and `/metrics` URL (if any) per part, kept current by the
/// fault driver.
pub type Pids = Arc<Mutex<BTreeMap<Part, (u32, Option<String>)>>>;

/// A gauge's value in a Prometheus exposition (the first sample of `name`).
pub fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with([' ', '{']))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Samples every running process once.
pub async fn sample(http: &reqwest::Client, pids: &Pids, at_s: f64) -> Vec<ProcSample> {
    let now: Vec<(Part, (u32, Option<String>))> = pids
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .map(|(p, v)| (*p, v.clone()))
        .collect();
    let mut out = Vec::new();
    for (part, (pid, metrics)) in now {
        let (Some(rss_kb), Some(fds), Some(threads)) = (rss_kb(pid), open_fds(pid), threads(pid))
        else {
            continue;
        };
        let (mut tasks, mut heap_kb) = (None, None);
        if let Some(url) = metrics {
            if let Ok(r) = http.get(url).send().await {
                if let Ok(text) = r.text().await {
                    tasks = gauge(&text, TASKS_METRIC).map(|v| v as u64);
                    heap_kb = gauge(&text, HEAP_METRIC)
                        .filter(|&b| b > 0.0)
                        .map(|b| b as u64 / 1024);
                }
            }
        }
        out.push(ProcSample {
            at_s,
            part,
            rss_kb,
            fds,
            threads,
            tasks,
            heap_kb,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_is_read_by_its_exact_name() {
        let text =
            "# HELP x\nownerserve_runtime_alive_tasks_total 9\nownerserve_runtime_alive_tasks 42\n";
        assert_eq!(gauge(text, TASKS_METRIC), Some(42.0));
        assert_eq!(gauge(text, "missing"), None);
    }
}
