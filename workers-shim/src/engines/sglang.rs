//! SGLang PD (`pd_router.rs`): the same `bootstrap_host`, `bootstrap_port` and
//! `bootstrap_room` go into the one body sent to both legs at once; a batch (`n > 1`)
//! gets one room per item, as arrays.
//!
//! [`Sglang`] is its protocol: probed at `/ready` (its `/health` runs a generation, at
//! least 1 s, up to 20 s under load); its load and capacity in `sglang:` gauges, one set
//! per tensor-parallel rank; its block size (`page_size`) and step budget
//! (`chunked_prefill_size`) read from `/server_info` at startup; a
//! `--disaggregation-mode prefill` server only ever hands its KV to a decode server; no
//! KV pull between peers, no named drops.

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::lifecycle::{Levers, Retention};
use serde_json::{json, Value};

use super::protocol::{
    CapacityGauge, EngineProtocol, EngineReport, MetricNames, Pairing, StepBudgetSource,
};

/// SGLang's `/metrics` names.
pub const METRIC_NAMES: MetricNames = MetricNames {
    running: "sglang:num_running_reqs",
    waiting: "sglang:num_queue_reqs",
    kv_usage: "sglang:token_usage",
    kv_usage_legacy: None,
    capacity: CapacityGauge::Tokens("sglang:max_total_num_tokens"),
    per_tp_rank: true,
};

/// SGLang's protocol.
pub struct Sglang;

impl EngineProtocol for Sglang {
    fn kind(&self) -> EngineKind {
        EngineKind::Sglang
    }
    fn probe_path(&self) -> &'static str {
        "/ready"
    }
    fn metric_names(&self) -> &'static MetricNames {
        &METRIC_NAMES
    }
    fn self_report_path(&self) -> &'static str {
        "/server_info"
    }
    fn read_self_report(&self, body: &[u8]) -> EngineReport {
        of_server_info(body)
    }
    fn step_budget(&self) -> StepBudgetSource {
        StepBudgetSource::SelfReport
    }
    fn pairing(&self) -> Pairing {
        Pairing::Bootstrap
    }
    fn kv_copy_path(&self) -> Option<&'static str> {
        None
    }
    fn drop_path(&self) -> Option<&'static str> {
        None
    }
    #[cfg(test)]
    fn samples(&self) -> super::protocol::Samples {
        // Served by SGLang 0.5.23 on this project's CPU machines (the real-engine suite);
        // its `/server_info` cut to the fields read, and two it is not.
        let metrics = include_str!("../../tests/fixtures/metrics/sglang-0.5.23.txt");
        super::protocol::Samples {
            metrics: metrics.to_owned(),
            self_report: br#"{"model_path": "m", "chunked_prefill_size": 8192, "page_size": 16, "disaggregation_mode": "null"}"#.to_vec(),
        }
    }
    fn prefill_role_decodes(&self) -> bool {
        false
    }

    /// SGLang 0.5.23: its session radix cache (`--enable-session-radix-cache`, a
    /// `session_id` on each request, `/close_session`) holds a session's KV ahead of
    /// unreferenced cache, but only with that flag; without it a kept session is kept warm
    /// by touches. Its hierarchical cache needs CUDA/ROCm/XPU copy kernels: no host tier
    /// here.
    fn levers(&self) -> Levers {
        Levers {
            priority: true,
            retention: Retention::Touch,
            host_tier: false,
        }
    }

    /// `x-override-priority` (higher runs sooner). Needs `--enable-priority-scheduling`,
    /// `--default-priority-value 0` (else an unmarked request has the lowest priority,
    /// and a returning step preempts running ones) and the engine's environment
    /// `SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES=1` (without it SGLang ignores the header).
    fn priority_header(&self, rank: i8) -> Option<(&'static str, i32)> {
        Some(("x-override-priority", -i32::from(rank)))
    }
}

/// An SGLang `/server_info` body: its `page_size`, and its `chunked_prefill_size` when
/// chunked prefill is on (SGLang sends -1 or null when it is off, and then runs a prompt
/// in one step, which no budget describes).
fn of_server_info(body: &[u8]) -> EngineReport {
    let Ok(info) = serde_json::from_slice::<Value>(body) else {
        return EngineReport::default();
    };
    let field = |name: &str| info.get(name).and_then(Value::as_u64);
    EngineReport {
        block_size: field("page_size").and_then(|b| usize::try_from(b).ok()),
        step_tokens: field("chunked_prefill_size").filter(|&t| t > 0),
    }
}

/// Where the prefill worker's bootstrap server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bootstrap {
    pub host: String,
    /// From the prefill's `/server_info`; `None` is sent as `null`.
    pub port: Option<u16>,
}

/// A room id as SGLang draws it: uniform in `[0, 2^63 - 1]`.
pub fn room(random: u64) -> u64 {
    random & (i64::MAX as u64)
}

/// Items in the request's batch (`n`, at least 1).
pub fn batch_size(body: &Value) -> usize {
    body.get("n")
        .and_then(Value::as_u64)
        .map_or(1, |n| n.max(1) as usize)
}

/// The body both legs receive: the client's plus the bootstrap fields. `rooms` holds one
/// room per batch item.
pub fn with_bootstrap(body: &Value, b: &Bootstrap, rooms: &[u64]) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        if rooms.len() > 1 {
            o.insert(
                "bootstrap_host".into(),
                json!(vec![b.host.clone(); rooms.len()]),
            );
            o.insert("bootstrap_port".into(), json!(vec![b.port; rooms.len()]));
            o.insert("bootstrap_room".into(), json!(rooms));
        } else {
            o.insert("bootstrap_host".into(), json!(b.host));
            o.insert("bootstrap_port".into(), json!(b.port));
            o.insert(
                "bootstrap_room".into(),
                json!(rooms.first().copied().unwrap_or(0)),
            );
        }
    }
    out
}

/// Fields [`with_bootstrap`] adds.
const BOOTSTRAP_FIELDS: [&str; 3] = ["bootstrap_host", "bootstrap_port", "bootstrap_room"];

/// The client's body again, without the bootstrap fields: what the decode worker runs
/// whole when its prefill partner failed.
pub fn without_bootstrap(body: &Value) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        for k in BOOTSTRAP_FIELDS {
            o.remove(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_request_gets_scalars_and_a_batch_gets_arrays() {
        let b = Bootstrap {
            host: "10.0.0.1".into(),
            port: Some(8998),
        };
        let one = with_bootstrap(&json!({"model": "m", "text": "x"}), &b, &[7]);
        assert_eq!(one["bootstrap_host"], "10.0.0.1");
        assert_eq!(one["bootstrap_port"], 8998);
        assert_eq!(one["bootstrap_room"], 7);
        let body = json!({"model": "m", "n": 2});
        assert_eq!(batch_size(&body), 2);
        let two = with_bootstrap(&body, &Bootstrap { port: None, ..b }, &[1, 2]);
        assert_eq!(two["bootstrap_port"], json!([null, null]));
        assert_eq!(two["bootstrap_room"], json!([1, 2]));
        assert_eq!(room(u64::MAX), i64::MAX as u64);
        assert_eq!(without_bootstrap(&two), body);
        assert_eq!(without_bootstrap(&one), json!({"model": "m", "text": "x"}));
    }

    #[test]
    fn sglang_s_server_info_gives_its_page_size_and_its_chunk_unless_chunking_is_off() {
        assert_eq!(
            of_server_info(br#"{"chunked_prefill_size": 4096, "page_size": 16}"#),
            EngineReport {
                block_size: Some(16),
                step_tokens: Some(4096)
            }
        );
        let off = of_server_info(br#"{"chunked_prefill_size": -1, "page_size": 1}"#);
        assert_eq!((off.block_size, off.step_tokens), (Some(1), None));
        let null = of_server_info(br#"{"chunked_prefill_size": null}"#);
        assert_eq!(null, EngineReport::default());
        assert_eq!(of_server_info(b"not json"), EngineReport::default());
    }
}
