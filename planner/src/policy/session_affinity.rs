//! Session affinity: requests of one session (the `x-session-id` header, OpenAI `user`, or
//! `metadata.session_id`) stick to the worker that served the session last, until the
//! session has been idle for the TTL or that worker is unhealthy. New sessions and requests
//! without one go to the least loaded worker.

use std::collections::HashMap;

use super::{
    full_request_candidates, Decision, LeastLoaded, Policy, PolicyError, RouteRequest, WorkerView,
};
use crate::ids::WorkerId;

/// Sweep expired sessions every this many requests.
const SWEEP_EVERY: u64 = 1024;

/// The session-affinity policy.
#[derive(Debug)]
pub struct SessionAffinity {
    ttl_ms: u64,
    sticky: HashMap<String, (WorkerId, u64)>,
    fallback: LeastLoaded,
    calls: u64,
}

impl SessionAffinity {
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            ttl_ms,
            sticky: HashMap::new(),
            fallback: LeastLoaded::default(),
            calls: 0,
        }
    }

    /// Sessions currently pinned.
    pub fn sessions(&self) -> usize {
        self.sticky.len()
    }
}

impl Policy for SessionAffinity {
    fn name(&self) -> &'static str {
        "session_affinity"
    }

    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError> {
        self.calls += 1;
        if self.calls.is_multiple_of(SWEEP_EVERY) {
            let now = req.now_ms;
            self.sticky.retain(|_, (_, expires)| *expires > now);
        }
        let Some(session) = req.session else {
            return self.fallback.choose(req, workers);
        };
        let expires = req.now_ms.saturating_add(self.ttl_ms);
        if let Some((worker, until)) = self.sticky.get_mut(session) {
            let usable =
                *until > req.now_ms && full_request_candidates(workers).any(|w| w.id == *worker);
            if usable {
                *until = expires;
                return Ok(Decision::single(*worker));
            }
        }
        let decision = self.fallback.choose(req, workers)?;
        self.sticky
            .insert(session.to_owned(), (decision.worker, expires));
        Ok(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Role;

    fn req(session: Option<&str>, now_ms: u64) -> RouteRequest<'_> {
        RouteRequest {
            model: "m",
            session,
            now_ms,
            ..Default::default()
        }
    }

    #[test]
    fn sessions_stick_until_idle_past_the_ttl_or_the_worker_is_down() {
        let mut ws = [
            WorkerView::idle(WorkerId(0), Role::Decode),
            WorkerView::idle(WorkerId(1), Role::Decode),
        ];
        let mut p = SessionAffinity::new(1000);
        let first = p.choose(&req(Some("a"), 0), &ws).unwrap().worker;
        // Load elsewhere would make least-loaded move it; affinity keeps it.
        ws[first.0 as usize].in_flight = 10;
        for t in [100, 900, 1800] {
            assert_eq!(p.choose(&req(Some("a"), t), &ws).unwrap().worker, first);
        }
        // Idle for longer than the TTL: re-placed on the least loaded worker.
        let other = WorkerId(1 - first.0);
        assert_eq!(p.choose(&req(Some("a"), 5000), &ws).unwrap().worker, other);
        // Its worker goes down: re-placed.
        ws[other.0 as usize].healthy = false;
        assert_eq!(p.choose(&req(Some("a"), 5100), &ws).unwrap().worker, first);
        assert_eq!(p.sessions(), 1);
        // No session: least loaded.
        assert!(p.choose(&req(None, 5200), &ws).is_ok());
    }
}
