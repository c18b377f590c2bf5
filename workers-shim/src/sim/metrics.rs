//! The simulated engine's `/metrics`, in Prometheus text format with vLLM V1's names and
//! labels (`model_name`, `engine`), so scrapers and dashboards built for vLLM work on it.
//! OwnerServe's own counters (KV transfer, fencing, prefill split) follow, as
//! `ownerserve_*_total` with the same labels.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::openai::response::FinishReason;

/// A cumulative histogram with fixed upper bounds.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending; `+Inf` is implied).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of observations so far.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

// vLLM's buckets (vllm/v1/metrics/loggers.py).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Everything the engine reports; times are simulated seconds.
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    pub num_requests_running: usize,
    pub num_requests_waiting: usize,
    pub kv_cache_usage_perc: f64,
    pub num_gpu_blocks: u32,
    pub block_size: u32,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub num_preemptions: u64,
    pub request_success: BTreeMap<&'static str, u64>,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_request_latency: Histogram,
    pub request_queue_time: Histogram,
    pub iteration_tokens: Histogram,
    pub kv: KvMetrics,
}

/// KV transfer, fencing and prefill-split counters (simulated seconds).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KvMetrics {
    /// KV bytes this engine served to pulls.
    pub sent_bytes: u64,
    /// KV bytes this engine received from pulls.
    pub received_bytes: u64,
    /// Simulated seconds spent receiving KV.
    pub transfer_seconds: f64,
    /// Pulls that answered (with any number of blocks).
    pub transfers: u64,
    /// Pulls that failed (source unreachable or refused); the request recomputed.
    pub transfer_failures: u64,
    /// Cached blocks evicted by `/ownerserve/v1/kv/drop`.
    pub dropped_blocks: u64,
    /// Requests refused for a stale epoch.
    pub stale_epoch_rejections: u64,
    /// Prompt tokens prefilled (not served from the prefix cache), counted at admission.
    pub prefill_computed_tokens: u64,
    /// Prompt tokens served from the prefix cache, received blocks included.
    pub prefill_cached_tokens: u64,
    /// Of those, tokens restored from the host-DRAM tier.
    pub host_restored_tokens: u64,
    /// Simulated seconds steps spent restoring them over PCIe.
    pub host_restore_seconds: f64,
}

impl EngineMetrics {
    /// Zeroed metrics for an engine with this cache shape.
    pub fn new(num_gpu_blocks: u32, block_size: u32) -> Self {
        Self {
            num_requests_running: 0,
            num_requests_waiting: 0,
            kv_cache_usage_perc: 0.0,
            num_gpu_blocks,
            block_size,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            num_preemptions: 0,
            request_success: BTreeMap::new(),
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(ITL_BUCKETS),
            e2e_request_latency: Histogram::new(REQUEST_BUCKETS),
            request_queue_time: Histogram::new(REQUEST_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            kv: KvMetrics::default(),
        }
    }

    /// Counts a finished sequence.
    pub fn finished(&mut self, reason: FinishReason) {
        let key = match reason {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        };
        *self.request_success.entry(key).or_default() += 1;
    }

    /// Renders the exposition text.
    pub fn render(&self, model_name: &str) -> String {
        let labels = format!("model_name=\"{}\",engine=\"0\"", escape(model_name));
        let mut out = String::with_capacity(8192);
        let mut gauge = |name: &str, help: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}"
            );
        };
        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            self.num_requests_running as f64,
        );
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            self.num_requests_waiting as f64,
        );
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            self.kv_cache_usage_perc,
        );
        let _ = writeln!(
            out,
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
             # TYPE vllm:cache_config_info gauge\n\
             vllm:cache_config_info{{block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"True\",{labels}}} 1.0",
            self.block_size, self.num_gpu_blocks
        );
        let mut counter = |name: &str, help: &str, v: u64| {
            let _ = writeln!(out, "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {v}");
        };
        counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            self.prefix_cache_queries,
        );
        counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            self.prefix_cache_hits,
        );
        counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            self.prompt_tokens,
        );
        counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            self.generation_tokens,
        );
        counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            self.num_preemptions,
        );
        let _ = writeln!(
            out,
            "# HELP vllm:request_success_total Count of successfully processed requests.\n\
             # TYPE vllm:request_success_total counter"
        );
        for reason in ["stop", "length"] {
            let v = self.request_success.get(reason).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "vllm:request_success_total{{finished_reason=\"{reason}\",{labels}}} {v}"
            );
        }
        for (name, help, h) in [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                &self.time_to_first_token,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                &self.inter_token_latency,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                &self.e2e_request_latency,
            ),
            (
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                &self.request_queue_time,
            ),
            (
                "vllm:iteration_tokens_total",
                "Histogram of number of tokens per engine_step.",
                &self.iteration_tokens,
            ),
        ] {
            render_histogram(&mut out, name, help, &labels, h);
        }
        self.kv.render(&mut out, &labels);
        out
    }
}

impl KvMetrics {
    fn render(&self, out: &mut String, labels: &str) {
        let mut counter = |name: &str, help: &str, v: &dyn std::fmt::Display| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}"
            );
        };
        counter(
            "ownerserve_kv_sent_bytes_total",
            "KV bytes served to pulls from other engines.",
            &self.sent_bytes,
        );
        counter(
            "ownerserve_kv_received_bytes_total",
            "KV bytes pulled from other engines.",
            &self.received_bytes,
        );
        counter(
            "ownerserve_kv_transfer_seconds_total",
            "Simulated seconds spent receiving KV.",
            &self.transfer_seconds,
        );
        counter(
            "ownerserve_kv_transfers_total",
            "KV pulls that completed.",
            &self.transfers,
        );
        counter(
            "ownerserve_kv_transfer_failures_total",
            "KV pulls that failed; the prompt was recomputed.",
            &self.transfer_failures,
        );
        counter(
            "ownerserve_kv_dropped_blocks_total",
            "Cached KV blocks evicted on request.",
            &self.dropped_blocks,
        );
        counter(
            "ownerserve_stale_epoch_rejections_total",
            "Requests refused because their session epoch was stale.",
            &self.stale_epoch_rejections,
        );
        counter(
            "ownerserve_prefill_computed_tokens_total",
            "Prompt tokens prefilled by this engine.",
            &self.prefill_computed_tokens,
        );
        counter(
            "ownerserve_prefill_cached_tokens_total",
            "Prompt tokens served from the prefix cache, received KV included.",
            &self.prefill_cached_tokens,
        );
        counter(
            "ownerserve_host_restored_tokens_total",
            "Prompt tokens restored from the host-DRAM KV tier instead of recomputed.",
            &self.host_restored_tokens,
        );
        counter(
            "ownerserve_host_restore_seconds_total",
            "Simulated seconds of engine steps spent restoring KV from host DRAM.",
            &self.host_restore_seconds,
        );
    }
}

fn render_histogram(out: &mut String, name: &str, help: &str, labels: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, c) in h.bounds.iter().zip(&h.counts) {
        cumulative += c;
        let _ = writeln!(
            out,
            "{name}_bucket{{le=\"{bound:?}\",{labels}}} {cumulative}"
        );
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{labels}}} {}", h.count);
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
}

/// Escapes a label value (backslash, quote, newline) per the text format.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_vllm_names_with_cumulative_buckets() {
        let mut m = EngineMetrics::new(100, 16);
        m.prefix_cache_queries = 64;
        m.prefix_cache_hits = 32;
        m.time_to_first_token.observe(0.003);
        m.time_to_first_token.observe(0.3);
        m.finished(FinishReason::Length);
        m.kv.received_bytes = 2_097_152;
        m.kv.transfer_seconds = 0.5;
        let text = m.render("m\"x");
        for line in [
            "vllm:prefix_cache_queries_total{model_name=\"m\\\"x\",engine=\"0\"} 64",
            "vllm:prefix_cache_hits_total{model_name=\"m\\\"x\",engine=\"0\"} 32",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.005\",model_name=\"m\\\"x\",engine=\"0\"} 1",
            "vllm:time_to_first_token_seconds_bucket{le=\"0.5\",model_name=\"m\\\"x\",engine=\"0\"} 2",
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"m\\\"x\",engine=\"0\"} 2",
            "vllm:time_to_first_token_seconds_count{model_name=\"m\\\"x\",engine=\"0\"} 2",
            "vllm:request_success_total{finished_reason=\"length\",model_name=\"m\\\"x\",engine=\"0\"} 1",
            "# TYPE vllm:num_requests_running gauge",
            "# TYPE ownerserve_kv_received_bytes_total counter",
            "ownerserve_kv_received_bytes_total{model_name=\"m\\\"x\",engine=\"0\"} 2097152",
            "ownerserve_kv_transfer_seconds_total{model_name=\"m\\\"x\",engine=\"0\"} 0.5",
            "ownerserve_stale_epoch_rejections_total{model_name=\"m\\\"x\",engine=\"0\"} 0",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
    }
}
