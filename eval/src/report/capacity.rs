//! Sessions held at an SLO: the most concurrent sessions a policy serves on a cluster while
//! the p99 TTFT of their steps stays within the SLO, found by doubling then bisecting the
//! session count of a scaled workload.

use crate::sim::{percentile, Cluster, RunResult, SimOptions};
use crate::workload::{Workload, WorkloadError};

use super::{run_one, ReportError};

/// How to search.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapacitySearch {
    /// p99 TTFT must stay at or below this, seconds.
    pub slo_s: f64,
    /// Largest session count tried.
    pub max_sessions: usize,
}

/// Whether a run met the SLO (every step served, p99 TTFT within it).
pub fn meets(r: &RunResult, slo_s: f64) -> bool {
    r.rejected() == 0 && percentile(&r.ttfts(), 0.99) <= slo_s
}

/// The most sessions (to within ~6%) `policy` holds on `cluster` under the SLO; 0 if even
/// one session misses it. `workload(n)` builds the workload with `n` sessions.
pub fn max_sessions(
    workload: &dyn Fn(usize) -> Result<Workload, WorkloadError>,
    cluster: &Cluster,
    policy: &str,
    search: CapacitySearch,
    opts: &SimOptions,
) -> Result<usize, ReportError> {
    let ok = |n: usize| -> Result<bool, ReportError> {
        let wl = workload(n)?;
        Ok(meets(
            &run_one(policy, &wl, cluster, opts, &|_| {})?,
            search.slo_s,
        ))
    };
    let (mut good, mut bad) = (0usize, None);
    let mut n = 8usize.min(search.max_sessions.max(1));
    while bad.is_none() {
        if ok(n)? {
            good = n;
            if n >= search.max_sessions {
                return Ok(n);
            }
            n = (n * 2).min(search.max_sessions);
        } else {
            bad = Some(n);
        }
    }
    let mut bad = bad.unwrap_or(n);
    if good == 0 {
        // Below the first probe: bisect from one session.
        if !ok(1)? {
            return Ok(0);
        }
        good = 1;
    }
    while bad - good > (good / 16).max(1) {
        let mid = good + (bad - good) / 2;
        if ok(mid)? {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Ok(good)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::WorkloadSpec;
    use ownerserve_shim::sim::config::SimSettings;

    #[test]
    fn the_search_brackets_the_slo() {
        let cluster = Cluster::parse("1h", &SimSettings::default()).expect("cluster");
        let build = |n: usize| {
            let mut wl = WorkloadSpec {
                workload: "swe-smith".into(),
                sessions: Some(n),
                rate: 50.0,
                ..WorkloadSpec::default()
            }
            .build()?;
            for s in &mut wl.sessions {
                s.steps.truncate(3);
            }
            Ok(wl)
        };
        let opts = SimOptions::default();
        let search = |slo_s| CapacitySearch {
            slo_s,
            max_sessions: 16,
        };
        let none = max_sessions(&build, &cluster, "round_robin", search(1e-6), &opts);
        assert_eq!(none.expect("runs"), 0);
        let all = max_sessions(&build, &cluster, "round_robin", search(1e6), &opts);
        assert_eq!(all.expect("runs"), 16);
        let some = max_sessions(&build, &cluster, "round_robin", search(0.5), &opts).expect("runs");
        assert!(some < 16, "{some}");
        // The answer meets the SLO and (unless it is 0) one more session's worth does not
        // by much: it is a real boundary, not a default.
        if some > 0 {
            let wl = build(some).expect("builds");
            let r = run_one("round_robin", &wl, &cluster, &opts, &|_| {}).expect("runs");
            assert!(meets(&r, 0.5));
        }
    }
}
