//! Fewest in-flight requests wins; ties rotate so equal workers share load.

use super::{full_request_candidates, Decision, Policy, PolicyError, RouteRequest, WorkerView};

/// Picks the candidate with the fewest requests in flight from this router.
#[derive(Debug, Default)]
pub struct LeastLoaded {
    tie_break: usize,
}

impl Policy for LeastLoaded {
    fn name(&self) -> &'static str {
        "least_loaded"
    }

    fn choose(
        &mut self,
        _req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let min = full_request_candidates(workers)
            .map(|w| w.in_flight)
            .min()
            .ok_or(PolicyError::NoHealthyWorker)?;
        let tied = full_request_candidates(workers)
            .filter(|w| w.in_flight == min)
            .count();
        let pick = full_request_candidates(workers)
            .filter(|w| w.in_flight == min)
            .nth(self.tie_break % tied)
            .ok_or(PolicyError::NoHealthyWorker)?;
        self.tie_break = self.tie_break.wrapping_add(1);
        Ok(Decision::single(pick.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};

    #[test]
    fn picks_the_least_busy_and_rotates_ties() {
        let ws = |loads: [u32; 3]| {
            loads
                .iter()
                .enumerate()
                .map(|(i, &l)| WorkerView {
                    in_flight: l,
                    ..WorkerView::idle(WorkerId(i as u32), Role::Decode)
                })
                .collect::<Vec<_>>()
        };
        let req = RouteRequest {
            model: "m",
            ..Default::default()
        };
        let mut p = LeastLoaded::default();
        assert_eq!(p.choose(&req, &ws([3, 1, 2])).unwrap().worker, WorkerId(1));
        let tied = ws([1, 1, 5]);
        let a = p.choose(&req, &tied).unwrap().worker;
        let b = p.choose(&req, &tied).unwrap().worker;
        assert_ne!(a, b);
    }
}
