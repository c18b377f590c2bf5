//! The warm-up share (SMG's idea): a worker that has just joined, or come back after being
//! down, takes new work only up to a share of what its warm peers carry, growing to the
//! whole of it over the warm-up, so a fresh engine gets traffic without a thundering herd
//! of every new prompt the planner finds it cheapest for (an empty engine is, for all of
//! them, until its first requests show).

use crate::policy::WorkerView;

/// Holds back the warming workers among `views`: `warmed[i]` is how far `views[i]` is
/// through its warm-up (0 just up, 1 or more warm). A warming worker with requests in flight
/// at or above `warmed` × the mean in flight of the warm workers of its role (at least one
/// request) takes no new work for this step (`draining` in its view), unless it already
/// holds some of the step's prompt. With no warm worker of its role, nothing is held back
/// (a fleet starting up is all new).
pub fn hold_back_warming(views: &mut [WorkerView], warmed: &[f64]) {
    if warmed.iter().all(|w| *w >= 1.0) {
        return;
    }
    let mean_of_warm = |role| {
        let (n, sum) = views
            .iter()
            .zip(warmed)
            .filter(|(v, w)| v.role == role && **w >= 1.0 && v.takes_work())
            .fold((0u32, 0u64), |(n, s), (v, _)| {
                (n + 1, s + u64::from(v.in_flight))
            });
        (n > 0).then(|| sum as f64 / f64::from(n))
    };
    let held: Vec<usize> = views
        .iter()
        .zip(warmed)
        .enumerate()
        .filter(|(_, (v, w))| **w < 1.0 && v.cached_blocks == 0 && v.host_cached_blocks == 0)
        .filter(|(_, (v, w))| {
            mean_of_warm(v.role)
                .is_some_and(|mean| f64::from(v.in_flight) >= (w.max(0.0) * mean).max(1.0))
        })
        .map(|(i, _)| i)
        .collect();
    for i in held {
        views[i].draining = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};

    fn views(in_flight: &[u32]) -> Vec<WorkerView> {
        in_flight
            .iter()
            .enumerate()
            .map(|(i, n)| WorkerView {
                in_flight: *n,
                ..WorkerView::idle(WorkerId(i as u32), Role::Hybrid)
            })
            .collect()
    }

    fn taking(v: &[WorkerView]) -> Vec<bool> {
        v.iter().map(WorkerView::takes_work).collect()
    }

    #[test]
    fn a_fresh_worker_takes_a_growing_share_of_what_its_warm_peers_carry() {
        // Warm peers carry 10 each; the new one, a quarter through, takes up to 2.5.
        let mut v = views(&[10, 10, 2]);
        hold_back_warming(&mut v, &[1.0, 1.0, 0.25]);
        assert_eq!(taking(&v), [true, true, true]);
        let mut v = views(&[10, 10, 3]);
        hold_back_warming(&mut v, &[1.0, 1.0, 0.25]);
        assert_eq!(taking(&v), [true, true, false]);
        // Halfway, it may carry 5; at least one request from the start.
        let mut v = views(&[10, 10, 4]);
        hold_back_warming(&mut v, &[1.0, 1.0, 0.5]);
        assert_eq!(taking(&v), [true, true, true]);
        let mut v = views(&[0, 0, 0]);
        hold_back_warming(&mut v, &[1.0, 1.0, 0.0]);
        assert_eq!(taking(&v), [true, true, true]);
    }

    #[test]
    fn a_step_with_cache_there_goes_and_a_fleet_all_new_is_not_held() {
        let mut v = views(&[10, 10, 9]);
        v[2].cached_blocks = 4;
        hold_back_warming(&mut v, &[1.0, 1.0, 0.1]);
        assert_eq!(taking(&v), [true, true, true]);
        let mut v = views(&[3, 5]);
        hold_back_warming(&mut v, &[0.2, 0.3]);
        assert_eq!(taking(&v), [true, true]);
    }
}
