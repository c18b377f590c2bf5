//! Round-robin over the healthy workers that can serve a whole request.

use super::{full_request_candidates, Decision, Policy, PolicyError, RouteRequest, WorkerView};

/// Cycles through candidates in registry order, skipping unhealthy ones.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Policy for RoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn choose(
        &mut self,
        _req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let n = full_request_candidates(workers).count();
        if n == 0 {
            return Err(PolicyError::NoHealthyWorker);
        }
        let pick = full_request_candidates(workers)
            .nth(self.next % n)
            .ok_or(PolicyError::NoHealthyWorker)?;
        self.next = self.next.wrapping_add(1);
        Ok(Decision::single(pick.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};

    fn w(id: u32, role: Role, healthy: bool) -> WorkerView {
        WorkerView {
            healthy,
            ..WorkerView::idle(WorkerId(id), role)
        }
    }

    fn picks(p: &mut RoundRobin, ws: &[WorkerView], n: usize) -> Vec<u32> {
        let req = RouteRequest {
            model: "m",
            ..Default::default()
        };
        (0..n)
            .map(|_| p.choose(&req, ws).unwrap().worker.0)
            .collect()
    }

    #[test]
    fn cycles_over_healthy_decode_and_hybrid_workers() {
        let ws = [
            w(0, Role::Prefill, true),
            w(1, Role::Decode, true),
            w(2, Role::Decode, false),
            w(3, Role::Hybrid, true),
        ];
        assert_eq!(picks(&mut RoundRobin::default(), &ws, 4), vec![1, 3, 1, 3]);
    }

    #[test]
    fn falls_back_to_prefill_workers_when_nothing_else_is_healthy() {
        let ws = [w(0, Role::Prefill, true), w(1, Role::Decode, false)];
        assert_eq!(picks(&mut RoundRobin::default(), &ws, 2), vec![0, 0]);
    }

    #[test]
    fn no_healthy_worker_is_an_error() {
        let ws = [w(0, Role::Decode, false)];
        let req = RouteRequest {
            model: "m",
            ..Default::default()
        };
        assert_eq!(
            RoundRobin::default().choose(&req, &ws),
            Err(PolicyError::NoHealthyWorker)
        );
    }
}
