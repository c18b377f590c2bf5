//! The router's own Prometheus counters (`GET /metrics`): executed plans by action, legs
//! that fell back to local recompute, migrations and idle-session demotions.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use ownerserve_planner::plan::Action;

const ACTIONS: [Action; 5] = [
    Action::Colocate,
    Action::RemotePrefill,
    Action::ArtifactFetch,
    Action::TailRecompute,
    Action::Migrate,
];

fn slot(a: Action) -> usize {
    ACTIONS.iter().position(|x| *x == a).unwrap_or(0)
}

/// Counters, updated lock-free on the request path.
#[derive(Debug, Default)]
pub struct RouterMetrics {
    plans: [AtomicU64; 5],
    fallbacks: [AtomicU64; 5],
    migrations: AtomicU64,
    demotions: AtomicU64,
    kv_pulled_bytes: AtomicU64,
}

impl RouterMetrics {
    /// A plan was executed.
    pub fn plan(&self, a: Action) {
        self.plans[slot(a)].fetch_add(1, Ordering::Relaxed);
    }

    /// A plan's transfer leg failed and the decode worker recomputed instead.
    pub fn fallback(&self, a: Action) {
        self.fallbacks[slot(a)].fetch_add(1, Ordering::Relaxed);
    }

    /// A session's ownership moved after its KV was copied (`bytes`).
    pub fn migrated(&self, bytes: u64) {
        self.migrations.fetch_add(1, Ordering::Relaxed);
        self.kv_pulled_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// An idle session's lease lapsed and it was demoted.
    pub fn demoted(&self) {
        self.demotions.fetch_add(1, Ordering::Relaxed);
    }

    /// Prometheus text exposition.
    pub fn render(&self, policy: &str) -> String {
        let mut out = String::new();
        let mut counter = |name: &str, help: &str, rows: &[(String, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (labels, v) in rows {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let by_action = |c: &[AtomicU64; 5]| -> Vec<(String, u64)> {
            ACTIONS
                .iter()
                .zip(c)
                .map(|(a, n)| {
                    (
                        format!("{{policy=\"{policy}\",action=\"{}\"}}", a.name()),
                        n.load(Ordering::Relaxed),
                    )
                })
                .collect()
        };
        counter(
            "ownerserve_plans_total",
            "Plans executed, by action.",
            &by_action(&self.plans),
        );
        counter(
            "ownerserve_plan_fallbacks_total",
            "Plans whose KV transfer leg failed and were recomputed on the decode worker.",
            &by_action(&self.fallbacks),
        );
        let one = |c: &AtomicU64| vec![(String::new(), c.load(Ordering::Relaxed))];
        counter(
            "ownerserve_migrations_total",
            "Sessions whose ownership moved after their KV was copied to the target.",
            &one(&self.migrations),
        );
        counter(
            "ownerserve_migrated_kv_bytes_total",
            "KV bytes copied by migrations, as the targets reported.",
            &one(&self.kv_pulled_bytes),
        );
        counter(
            "ownerserve_session_demotions_total",
            "Idle sessions demoted when their lease lapsed.",
            &one(&self.demotions),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_by_action() {
        let m = RouterMetrics::default();
        m.plan(Action::Migrate);
        m.plan(Action::Migrate);
        m.fallback(Action::RemotePrefill);
        m.migrated(10);
        let text = m.render("ownerserve");
        assert!(text.contains("ownerserve_plans_total{policy=\"ownerserve\",action=\"migrate\"} 2"));
        assert!(text.contains(
            "ownerserve_plan_fallbacks_total{policy=\"ownerserve\",action=\"remote_prefill\"} 1"
        ));
        assert!(text.contains("ownerserve_migrated_kv_bytes_total 10"));
        assert!(text.contains("# TYPE ownerserve_session_demotions_total counter"));
    }
}
