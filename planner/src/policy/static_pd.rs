//! `static_pd`: classic disaggregation. Every request is prefilled on a prefill worker and
//! its full KV shipped to a decode worker, whatever either already caches. Fleets without
//! both kinds of worker serve requests whole on the least loaded worker.

use super::{
    full_request_candidates, least_busy, live_owner, Decision, Dispatch, LeastLoaded, Policy,
    PolicyError, RouteRequest, WorkerView,
};
use crate::ids::Role;

/// Always splits prefill from decode.
#[derive(Debug, Default)]
pub struct StaticPd {
    fallback: LeastLoaded,
}

impl Policy for StaticPd {
    fn name(&self) -> &'static str {
        "static_pd"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        let prefill = least_busy(
            workers
                .iter()
                .filter(|w| w.takes_work() && w.role == Role::Prefill),
        );
        // A session keeps decoding where it did (its KV is there); others take the least busy.
        let decode = live_owner(req, workers).or_else(|| {
            least_busy(full_request_candidates(workers).filter(|w| w.role != Role::Prefill))
        });
        match (prefill, decode) {
            (Some(p), Some(d)) if p.id != d.id => Ok(Decision {
                worker: d.id,
                dispatch: Dispatch::Disaggregated { prefill: p.id },
                plan: None,
            }),
            _ => self.fallback.choose(req, workers),
        }
    }

    fn needs_directory(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;

    #[test]
    fn every_request_is_split_even_a_tiny_one() {
        let ws = [
            WorkerView {
                active_prefill_tokens: 100,
                ..WorkerView::idle(WorkerId(0), Role::Prefill)
            },
            WorkerView::idle(WorkerId(1), Role::Prefill),
            WorkerView {
                cached_blocks: 100,
                host_cached_blocks: 0,
                pulls_kv: true,
                ..WorkerView::idle(WorkerId(2), Role::Decode)
            },
        ];
        let r = RouteRequest {
            prompt_tokens: 3,
            block_size: 16,
            ..Default::default()
        };
        let d = StaticPd::default().choose(&r, &ws).unwrap();
        assert_eq!(d.worker, WorkerId(2));
        assert_eq!(
            d.dispatch,
            Dispatch::Disaggregated {
                prefill: WorkerId(1)
            }
        );
    }

    #[test]
    fn without_prefill_workers_requests_run_whole() {
        let ws = [
            WorkerView::idle(WorkerId(0), Role::Decode),
            WorkerView::idle(WorkerId(1), Role::Hybrid),
        ];
        let d = StaticPd::default()
            .choose(&RouteRequest::default(), &ws)
            .unwrap();
        assert_eq!(d.dispatch, Dispatch::Single);
    }
}
