//! `colocated`: no disaggregation at all. A session stays on its decode owner; a new one
//! goes where most of its prompt is cached, the least busy worker on ties.

use super::{
    full_request_candidates, live_owner, Decision, Policy, PolicyError, RouteRequest, WorkerView,
};

/// Runs every request whole on one worker.
#[derive(Debug, Default)]
pub struct Colocated {
    tie_break: usize,
}

impl Policy for Colocated {
    fn name(&self) -> &'static str {
        "colocated"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        if let Some(owner) = live_owner(req, workers) {
            return Ok(Decision::single(owner.id));
        }
        let key = |w: &WorkerView| {
            (
                std::cmp::Reverse(w.cached_blocks),
                w.active_prefill_tokens,
                w.in_flight,
            )
        };
        let best = full_request_candidates(workers)
            .map(key)
            .min()
            .ok_or(PolicyError::NoHealthyWorker)?;
        let tied: Vec<&WorkerView> = full_request_candidates(workers)
            .filter(|w| key(w) == best)
            .collect();
        self.tie_break = self.tie_break.wrapping_add(1);
        let pick = tied[self.tie_break % tied.len()];
        Ok(Decision::single(pick.id))
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn needs_directory(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};
    use crate::policy::Dispatch;

    #[test]
    fn the_owner_keeps_its_session_and_new_prompts_follow_the_cache() {
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Prefill),
            WorkerView::idle(WorkerId(1), Role::Decode),
            WorkerView {
                cached_blocks: 4,
                host_cached_blocks: 0,
                pulls_kv: true,
                ..WorkerView::idle(WorkerId(2), Role::Decode)
            },
        ];
        let mut p = Colocated::default();
        let d = p.choose(&RouteRequest::default(), &ws).unwrap();
        assert_eq!((d.worker, d.dispatch), (WorkerId(2), Dispatch::Single));
        let owned = RouteRequest {
            decode_owner: Some(WorkerId(1)),
            ..Default::default()
        };
        assert_eq!(p.choose(&owned, &ws).unwrap().worker, WorkerId(1));
    }
}
