//! The admin listing (`GET /admin/v1/workers`) and workers named in plan reasons.

use serde::Serialize;

use ownerserve_planner::ids::{EngineKind, Role, WorkerId};

use super::{Registry, ServedModel};

impl Registry {
    /// `text` (a plan's reason, written by the planner, which knows workers only by id)
    /// with each worker id (`w0`, `w1`, ...) replaced by the worker's configured name.
    pub fn name_workers(&self, text: &str) -> String {
        let fleet = self.all();
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find('w') {
            let (before, from) = rest.split_at(at);
            out.push_str(before);
            let digits = from[1..].bytes().take_while(u8::is_ascii_digit).count();
            let word_start = !out.ends_with(|c: char| c.is_alphanumeric() || c == '_');
            let word_end =
                !from[1 + digits..].starts_with(|c: char| c.is_alphanumeric() || c == '_');
            let worker = from[1..1 + digits]
                .parse::<u32>()
                .ok()
                .filter(|_| digits > 0 && word_start && word_end)
                .and_then(|i| fleet.by_id.get(&WorkerId(i)).map(|&at| &fleet.workers[at]));
            match worker {
                Some(w) => out.push_str(&w.spec.name),
                None => out.push_str(&from[..1 + digits]),
            }
            rest = &from[1 + digits..];
        }
        out.push_str(rest);
        out
    }

    /// The admin API's view of every worker that is not retired.
    pub fn describe(&self) -> Vec<WorkerInfo> {
        self.all()
            .iter()
            .filter(|w| !w.is_retired())
            .map(|w| WorkerInfo {
                id: w.spec.name.clone(),
                url: w.spec.base_url.clone(),
                role: w.spec.role,
                engine: w.spec.engine,
                healthy: w.is_healthy(),
                suspect: w.is_healthy() && w.consecutive_failures() > 0,
                consecutive_failures: w.consecutive_failures(),
                draining: w.is_draining(),
                in_flight: w.in_flight(),
                active_blocks: w.active_blocks(),
                kv_capacity_tokens: w.kv_capacity_tokens(),
                kv_capacity_source: if w.spec.kv_capacity_tokens.is_some() {
                    "configured"
                } else if w.reported_kv_tokens().is_some() {
                    "engine"
                } else {
                    "unknown"
                },
                load: w.load().map(|l| LoadInfo {
                    running: l.running,
                    waiting: l.waiting,
                    kv_usage: l.kv_usage,
                }),
                kv_events: w.spec.kv_events.clone(),
                models: w.models().to_vec(),
            })
            .collect()
    }
}

/// One row of `GET /admin/v1/workers`.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    pub id: String,
    pub url: String,
    pub role: Role,
    pub engine: EngineKind,
    pub healthy: bool,
    /// Up, but its last checks or proxied requests failed (fewer than the threshold).
    pub suspect: bool,
    pub consecutive_failures: u32,
    pub draining: bool,
    pub in_flight: u32,
    pub active_blocks: u64,
    /// KV capacity in tokens (`kv_capacity_source` says where it came from).
    pub kv_capacity_tokens: Option<u64>,
    /// `configured` (the worker's `kv_capacity_tokens`), `engine` (its metrics) or
    /// `unknown`.
    pub kv_capacity_source: &'static str,
    pub load: Option<LoadInfo>,
    pub kv_events: Option<String>,
    pub models: Vec<ServedModel>,
}

/// The scraped load of a worker.
#[derive(Debug, Clone, Serialize)]
pub struct LoadInfo {
    pub running: f64,
    pub waiting: f64,
    pub kv_usage: f64,
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::ids::{EngineKind, Role};

    use super::super::tests::registry;
    use super::super::Registry;
    use crate::config::WorkerSpec;

    #[test]
    fn plan_reasons_name_workers_by_their_configured_names() {
        let r = registry();
        assert_eq!(
            r.name_workers("colocate: on w1: prefill; 1.00 ms vs 2.00 ms for remote_prefill on w0"),
            "colocate: on b: prefill; 1.00 ms vs 2.00 ms for remote_prefill on a"
        );
        assert_eq!(
            r.name_workers("w7 w1x aw1 w"),
            "w7 w1x aw1 w",
            "not a worker of ours"
        );
    }

    #[test]
    fn configured_capacity_overrides_the_engines() {
        let mut spec = WorkerSpec::new("a", "http://127.0.0.1:1", Role::Hybrid, EngineKind::Sglang);
        let r = Registry::new(vec![spec.clone()]);
        assert_eq!(r.all()[0].kv_capacity_tokens(), None);
        r.all()[0].set_reported_kv_tokens(Some(16_384));
        assert_eq!(r.all()[0].kv_capacity_tokens(), Some(16_384));
        assert_eq!(r.describe()[0].kv_capacity_source, "engine");
        spec.kv_capacity_tokens = Some(4096);
        let r = Registry::new(vec![spec]);
        r.all()[0].set_reported_kv_tokens(Some(16_384));
        assert_eq!(r.all()[0].kv_capacity_tokens(), Some(4096));
        assert_eq!(r.describe()[0].kv_capacity_source, "configured");
    }
}
