//! A worker's health: its checks (active: the probe), its progress on proxied requests
//! (passive), and an operator's drain.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{ServedModel, Worker};

impl Worker {
    /// Whether the last health checks passed.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether an operator is draining it.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts or ends a drain; returns the previous state.
    pub fn set_draining(&self, draining: bool) -> bool {
        let was = self.draining.swap(draining, Ordering::Relaxed);
        if was != draining {
            tracing::info!(worker = %self.spec.name, draining, "drain changed");
        }
        was
    }

    /// Records a passed health check and the models the worker serves.
    pub fn mark_healthy(&self, models: Vec<ServedModel>) {
        self.set_models(models);
        self.consecutive_failures.store(0, Ordering::Relaxed);
        if !self.healthy.swap(true, Ordering::Relaxed) {
            if !self.warm_at_first_up.swap(false, Ordering::Relaxed) {
                // 0 means warm: the first millisecond counts as the second.
                self.up_since_ms
                    .store(self.now_ms().max(1), Ordering::Relaxed);
            }
            tracing::info!(worker = %self.spec.name, "worker is healthy");
        }
    }

    /// How far the worker is through its `warmup` since it last became healthy: 0 just
    /// up, 1 warm (`ownerserve_planner::step::hold_back_warming`). A worker of the starting
    /// fleet is warm from its first check.
    pub fn warmed(&self, warmup: Duration) -> f64 {
        let since = self.up_since_ms.load(Ordering::Relaxed);
        if warmup.is_zero() || since == 0 {
            return 1.0;
        }
        let up_for = self.now_ms().saturating_sub(since);
        (up_for as f64 / warmup.as_millis() as f64).min(1.0)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records a failed check; after `threshold` in a row the worker is marked down. Until
    /// then it is suspect: still routed to, with the failures shown in the admin API.
    pub fn record_failure(&self, threshold: u32, why: &str) {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            self.mark_down(why);
        } else if self.is_healthy() {
            tracing::info!(worker = %self.spec.name, failures = n, reason = why, "worker is suspect");
        }
    }

    /// Failed checks in a row (0 after any success).
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures.load(Ordering::Relaxed)
    }

    /// Passive health: the worker answered a proxied request or sent a frame of one. Its
    /// failed checks so far are forgiven (a worker that serves is up); it does not bring a
    /// worker that is down back up, which only its health probe does.
    pub fn record_progress(&self) {
        let now = self.now_ms();
        // 0 means "never": the first millisecond counts as the second.
        self.last_progress_ms.store(now.max(1), Ordering::Relaxed);
        if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
            self.consecutive_failures.store(0, Ordering::Relaxed);
        }
    }

    /// Whether the worker made progress on a proxied request within the last `window`.
    pub fn progressed_within(&self, window: Duration) -> bool {
        let last = self.last_progress_ms.load(Ordering::Relaxed);
        let now = self.clock.elapsed().as_millis();
        last != 0 && now.saturating_sub(u128::from(last)) <= window.as_millis()
    }

    /// Marks the worker down at once (a refused connection needs no second opinion).
    pub fn mark_down(&self, why: &str) {
        if self.healthy.swap(false, Ordering::Relaxed) {
            tracing::warn!(worker = %self.spec.name, reason = why, "worker is down");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::registry;
    use super::super::ModelAvailability;

    #[test]
    fn availability_follows_health_and_models() {
        let r = registry();
        assert_eq!(
            r.availability("m"),
            ModelAvailability::Unavailable,
            "nobody answered yet"
        );
        r.all()[1].mark_healthy(vec!["other".into()]);
        r.all()[0].mark_healthy(vec!["m".into()]);
        assert_eq!(r.availability("x"), ModelAvailability::Unknown);
        assert_eq!(r.availability("m"), ModelAvailability::Available);
        r.all()[0].record_failure(2, "test");
        assert_eq!(
            r.availability("m"),
            ModelAvailability::Available,
            "one failure is tolerated"
        );
        r.all()[0].record_failure(2, "test");
        assert_eq!(r.availability("m"), ModelAvailability::Unavailable);
        assert_eq!(r.healthy_models(), vec!["other".to_owned()]);
    }

    #[test]
    fn passive_health_forgives_failures_and_expires() {
        let r = registry();
        let w = &r.all()[0];
        w.mark_healthy(vec!["m".into()]);
        assert!(
            !w.progressed_within(Duration::from_secs(60)),
            "never served"
        );
        w.record_failure(2, "slow probe");
        assert_eq!(w.consecutive_failures(), 1);
        assert!(w.is_healthy(), "suspect, not down");
        w.record_progress();
        assert_eq!(w.consecutive_failures(), 0, "a served request forgives");
        assert!(w.progressed_within(Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(30));
        assert!(!w.progressed_within(Duration::from_millis(10)));
        w.mark_down("refused");
        w.record_progress();
        assert!(!w.is_healthy(), "only a probe brings a worker back");
    }
}
