//! Settings of one simulated worker, parsed once (from flags or a TOML table) and validated
//! into a [`SimConfig`] before any socket opens.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use ownerserve_planner::hash::XXH3_SEED;
use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_planner::spec::{kv_capacity_blocks, GpuSpec, ModelSpec, SpecError};

use super::kv_transfer::{LinkModel, TransferConfig};
use super::scheduler::SchedulerConfig;
use crate::kv_events::wire::Encoding;

/// User-facing settings of a simulated worker: `ownerserve sim-worker` flags, or a `[sim]`
/// table in `configs/up.toml` (every key is documented in `configs/README.md`).
#[derive(Debug, Clone, PartialEq, Deserialize, clap::Args)]
#[serde(default, deny_unknown_fields)]
pub struct SimSettings {
    /// Model preset name (llama-3.1-8b, qwen3-30b-a3b, deepseek-v3) or path to a TOML file.
    #[arg(
        long = "model-preset",
        env = "OWNERSERVE_SIM_MODEL",
        default_value = "llama-3.1-8b"
    )]
    pub model: String,
    /// GPU preset name (h100, h20, a100, l40) or path to a TOML file.
    #[arg(
        long = "gpu-preset",
        env = "OWNERSERVE_SIM_GPU",
        default_value = "h100"
    )]
    pub gpu: String,
    /// GPUs per worker (tensor parallel).
    #[arg(long, env = "OWNERSERVE_SIM_GPUS", default_value_t = 1)]
    pub gpus: u32,
    /// Name clients use in `"model"`; defaults to the preset's served name.
    #[arg(long, env = "OWNERSERVE_SIM_SERVED_MODEL_NAME")]
    pub served_model_name: Option<String>,
    /// Tokens per KV block.
    #[arg(long, env = "OWNERSERVE_SIM_BLOCK_SIZE", default_value_t = 16)]
    pub block_size: u32,
    /// Token budget of one engine step (chunked prefill).
    #[arg(
        long,
        env = "OWNERSERVE_SIM_MAX_NUM_BATCHED_TOKENS",
        default_value_t = 8192
    )]
    pub max_num_batched_tokens: u32,
    /// Most prompt tokens one request may compute in a step while others run or wait
    /// (vLLM's `--long-prefill-token-threshold`); 0 = no cap beyond the step budget.
    #[arg(
        long,
        env = "OWNERSERVE_SIM_LONG_PREFILL_TOKEN_THRESHOLD",
        default_value_t = 0
    )]
    pub long_prefill_token_threshold: u32,
    /// Most sequences running at once.
    #[arg(long, env = "OWNERSERVE_SIM_MAX_NUM_SEQS", default_value_t = 256)]
    pub max_num_seqs: u32,
    /// Fraction of GPU memory the engine may use (weights + KV).
    #[arg(
        long,
        env = "OWNERSERVE_SIM_GPU_MEMORY_UTILIZATION",
        default_value_t = 0.9
    )]
    pub gpu_memory_utilization: f64,
    /// Cap on KV blocks below what memory allows (0 = no cap); small caches exercise eviction.
    #[arg(long, env = "OWNERSERVE_SIM_MAX_KV_BLOCKS", default_value_t = 0)]
    pub max_kv_blocks: u32,
    /// Fraction of peak FLOP/s reached.
    #[arg(long, env = "OWNERSERVE_SIM_COMPUTE_EFFICIENCY", default_value_t = 0.5)]
    pub compute_efficiency: f64,
    /// Fraction of peak memory bandwidth reached.
    #[arg(long, env = "OWNERSERVE_SIM_MEMORY_EFFICIENCY", default_value_t = 0.7)]
    pub memory_efficiency: f64,
    /// Fixed cost of one engine step, seconds.
    #[arg(long, env = "OWNERSERVE_SIM_STEP_OVERHEAD_S", default_value_t = 0.002)]
    pub step_overhead_s: f64,
    /// Simulated seconds per wall-clock second (10 = ten times faster than real time).
    #[arg(long, env = "OWNERSERVE_SIM_TIME_SCALE", default_value_t = 1.0)]
    pub time_scale: f64,
    /// No simulated delay at all: steps complete as fast as the CPU runs them.
    #[arg(long, env = "OWNERSERVE_SIM_INSTANT", default_value_t = false)]
    pub instant: bool,
    /// ZMQ PUB endpoint for KV events, e.g. tcp://127.0.0.1:5557 (port 0 picks one); unset
    /// publishes nothing.
    #[arg(long, env = "OWNERSERVE_SIM_KV_EVENTS_ENDPOINT")]
    pub kv_events_endpoint: Option<String>,
    /// ZMQ ROUTER endpoint serving replays of recent event batches.
    #[arg(long, env = "OWNERSERVE_SIM_KV_REPLAY_ENDPOINT")]
    pub kv_replay_endpoint: Option<String>,
    /// Event layout: map (current vLLM/SGLang) or array (legacy).
    #[arg(long, value_enum, env = "OWNERSERVE_SIM_KV_EVENTS_ENCODING", default_value_t = Encoding::Map)]
    pub kv_events_encoding: Encoding,
    /// First frame of every event message.
    #[arg(long, env = "OWNERSERVE_SIM_KV_EVENTS_TOPIC", default_value = "")]
    pub kv_events_topic: String,
    /// Event batches kept for replay.
    #[arg(
        long,
        env = "OWNERSERVE_SIM_KV_EVENTS_BUFFER_STEPS",
        default_value_t = 10_000
    )]
    pub kv_events_buffer_steps: usize,
    /// Bandwidth of the link KV transfers use, GB/s (10^9 bytes per simulated second).
    #[arg(long, env = "OWNERSERVE_SIM_LINK_GBS", default_value_t = 50.0)]
    pub link_gbs: f64,
    /// Fixed latency of one KV transfer, microseconds (simulated).
    #[arg(long, env = "OWNERSERVE_SIM_LINK_LATENCY_US", default_value_t = 10.0)]
    pub link_latency_us: f64,
    /// How long a prefill leg's prompt blocks stay pinned for the decode leg to pull,
    /// wall-clock milliseconds (vLLM's `kv_lease_duration`).
    #[arg(long, env = "OWNERSERVE_SIM_KV_LEASE_MS", default_value_t = 30_000)]
    pub kv_lease_ms: u64,
    /// KV blocks of host DRAM that blocks evicted from HBM are offloaded to and restored
    /// from (vLLM's CPU offloading connector, `num_cpu_blocks`); 0 = no host tier.
    #[arg(long, env = "OWNERSERVE_SIM_HOST_KV_BLOCKS", default_value_t = 0)]
    pub host_kv_blocks: u32,
    /// Host DRAM of the host tier, GB, sized into blocks from the model's KV bytes (as HBM
    /// is); used when `host_kv_blocks` is 0. 0 = no host tier (the default, so runs and
    /// reports without it are unchanged); the GPU presets' `host_dram_gb` (256 for an
    /// H100 in a DGX H100) is the figure for a whole server's share.
    #[arg(long, env = "OWNERSERVE_SIM_HOST_DRAM_GB", default_value_t = 0.0)]
    pub host_dram_gb: f64,
    /// Host-to-GPU bandwidth of restores, GB/s; unset = the GPU preset's `pcie_gbs`.
    #[arg(long, env = "OWNERSERVE_SIM_PCIE_GBS")]
    pub pcie_gbs: Option<f64>,
    /// vLLM's `--scheduling-policy`: `fcfs`, or `priority` (requests' `X-Vllm-Priority`,
    /// lower sooner, order the waiting queue and choose preemption victims).
    #[arg(long, env = "OWNERSERVE_SIM_SCHEDULING_POLICY", default_value = "fcfs",
          value_parser = ["fcfs", "priority"])]
    pub scheduling_policy: String,
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            model: "llama-3.1-8b".to_owned(),
            gpu: "h100".to_owned(),
            gpus: 1,
            served_model_name: None,
            block_size: 16,
            max_num_batched_tokens: 8192,
            long_prefill_token_threshold: 0,
            max_num_seqs: 256,
            gpu_memory_utilization: 0.9,
            max_kv_blocks: 0,
            compute_efficiency: 0.5,
            memory_efficiency: 0.7,
            step_overhead_s: 0.002,
            time_scale: 1.0,
            instant: false,
            kv_events_endpoint: None,
            kv_replay_endpoint: None,
            kv_events_encoding: Encoding::Map,
            kv_events_topic: String::new(),
            kv_events_buffer_steps: 10_000,
            link_gbs: 50.0,
            link_latency_us: 10.0,
            kv_lease_ms: 30_000,
            host_kv_blocks: 0,
            host_dram_gb: 0.0,
            pcie_gbs: None,
            scheduling_policy: "fcfs".to_owned(),
        }
    }
}

/// Where and how a worker publishes KV events.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub encoding: Encoding,
    pub topic: String,
    pub buffer_steps: usize,
}

/// How simulated time relates to wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TimeMode {
    /// Sleep `duration / scale` per step.
    Scaled(f64),
    /// Never sleep.
    Instant,
}

/// A validated worker configuration.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub model: ModelSpec,
    pub gpu: GpuSpec,
    /// GPUs per worker (tensor parallel; vLLM's `tp_size`).
    pub gpus: u32,
    pub served_model_name: String,
    pub scheduler: SchedulerConfig,
    pub roofline: Roofline,
    pub time: TimeMode,
    pub kv_events: Option<KvEventsConfig>,
    pub transfer: TransferConfig,
}

/// Settings that cannot make a worker.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("cannot read preset file {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kv_replay_endpoint needs kv_events_endpoint")]
    ReplayWithoutEvents,
    #[error("{field} must be {expected}, got {value}")]
    OutOfRange {
        field: &'static str,
        expected: &'static str,
        value: f64,
    },
}

fn range(
    field: &'static str,
    value: f64,
    ok: bool,
    expected: &'static str,
) -> Result<(), SimConfigError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(SimConfigError::OutOfRange {
            field,
            expected,
            value,
        })
    }
}

/// A preset by name, or a `.toml` file of one.
pub fn load<T>(
    name: &str,
    preset: impl Fn(&str) -> Result<T, SpecError>,
    parse: impl Fn(&str) -> Result<T, SpecError>,
) -> Result<T, SimConfigError> {
    if name.ends_with(".toml") {
        let text =
            std::fs::read_to_string(Path::new(name)).map_err(|source| SimConfigError::Read {
                path: name.to_owned(),
                source,
            })?;
        Ok(parse(&text)?)
    } else {
        Ok(preset(name)?)
    }
}

impl SimSettings {
    /// Validates the settings and derives the engine's figures from the presets.
    pub fn build(&self) -> Result<SimConfig, SimConfigError> {
        let model = load(&self.model, ModelSpec::preset, ModelSpec::from_toml)?;
        let gpu = load(&self.gpu, GpuSpec::preset, GpuSpec::from_toml)?;
        range("gpus", f64::from(self.gpus), self.gpus >= 1, "at least 1")?;
        range(
            "block_size",
            f64::from(self.block_size),
            (1..=1024).contains(&self.block_size),
            "1..=1024",
        )?;
        range(
            "max_num_batched_tokens",
            f64::from(self.max_num_batched_tokens),
            self.max_num_batched_tokens >= 1,
            "at least 1",
        )?;
        range(
            "max_num_seqs",
            f64::from(self.max_num_seqs),
            self.max_num_seqs >= 1,
            "at least 1",
        )?;
        let util = self.gpu_memory_utilization;
        range(
            "gpu_memory_utilization",
            util,
            util > 0.0 && util <= 1.0,
            "in (0, 1]",
        )?;
        for (field, v) in [
            ("compute_efficiency", self.compute_efficiency),
            ("memory_efficiency", self.memory_efficiency),
        ] {
            range(field, v, v > 0.0 && v <= 1.0, "in (0, 1]")?;
        }
        range(
            "step_overhead_s",
            self.step_overhead_s,
            self.step_overhead_s >= 0.0,
            "non-negative",
        )?;
        range(
            "time_scale",
            self.time_scale,
            self.time_scale > 0.0,
            "positive",
        )?;
        range("link_gbs", self.link_gbs, self.link_gbs > 0.0, "positive")?;
        range(
            "link_latency_us",
            self.link_latency_us,
            self.link_latency_us >= 0.0,
            "non-negative",
        )?;
        range(
            "kv_lease_ms",
            self.kv_lease_ms as f64,
            self.kv_lease_ms >= 1,
            "at least 1",
        )?;

        let pcie_gbs = self.pcie_gbs.unwrap_or(gpu.pcie_gbs);
        range("pcie_gbs", pcie_gbs, pcie_gbs > 0.0, "positive")?;
        range(
            "host_dram_gb",
            self.host_dram_gb,
            self.host_dram_gb >= 0.0,
            "non-negative",
        )?;
        let host_blocks = if self.host_kv_blocks > 0 {
            self.host_kv_blocks
        } else {
            let block_bytes = model.kv_bytes_per_token() * f64::from(self.block_size);
            (self.host_dram_gb * 1e9 / block_bytes)
                .floor()
                .min(f64::from(u32::MAX)) as u32
        };
        let mut num_blocks = kv_capacity_blocks(&model, &gpu, self.gpus, util, self.block_size)?;
        if self.max_kv_blocks > 0 {
            num_blocks = num_blocks.min(u64::from(self.max_kv_blocks));
        }
        let roofline = Roofline::new(
            &gpu,
            self.gpus,
            Efficiency {
                compute: self.compute_efficiency,
                memory: self.memory_efficiency,
                step_overhead_s: self.step_overhead_s,
            },
        );
        Ok(SimConfig {
            served_model_name: self
                .served_model_name
                .clone()
                .unwrap_or_else(|| model.served_name.clone()),
            scheduler: SchedulerConfig {
                block_size: self.block_size,
                max_num_batched_tokens: self.max_num_batched_tokens,
                long_prefill_token_threshold: self.long_prefill_token_threshold,
                max_num_seqs: self.max_num_seqs,
                num_blocks: u32::try_from(num_blocks).unwrap_or(u32::MAX),
                max_model_len: model.max_model_len,
                hash_seed: XXH3_SEED,
                emit_cache_events: self.kv_events_endpoint.is_some(),
                host_blocks,
                pcie_bytes_per_s: pcie_gbs * 1e9,
                priority_scheduling: self.scheduling_policy == "priority",
            },
            kv_events: self
                .kv_events_endpoint
                .clone()
                .map(|endpoint| KvEventsConfig {
                    endpoint,
                    replay_endpoint: self.kv_replay_endpoint.clone(),
                    encoding: self.kv_events_encoding,
                    topic: self.kv_events_topic.clone(),
                    buffer_steps: self.kv_events_buffer_steps.max(1),
                }),
            roofline,
            transfer: TransferConfig {
                link: LinkModel {
                    bytes_per_s: self.link_gbs * 1e9,
                    latency_s: self.link_latency_us * 1e-6,
                },
                kv_lease: Duration::from_millis(self.kv_lease_ms),
            },
            time: if self.instant {
                TimeMode::Instant
            } else {
                TimeMode::Scaled(self.time_scale)
            },
            model,
            gpu,
            gpus: self.gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_build_a_llama_on_h100() {
        let cfg = SimSettings::default().build().unwrap();
        assert_eq!(cfg.served_model_name, "meta-llama/Llama-3.1-8B-Instruct");
        assert!(cfg.scheduler.num_blocks > 20_000);
        assert_eq!(cfg.time, TimeMode::Scaled(1.0));
        assert_eq!(cfg.transfer.link.bytes_per_s, 50e9);
        assert!((cfg.transfer.link.latency_s - 10e-6).abs() < 1e-15);
        assert_eq!(cfg.transfer.kv_lease, Duration::from_secs(30));
    }

    #[test]
    fn bad_settings_fail_with_the_field_named() {
        let bad = SimSettings {
            gpu_memory_utilization: 1.5,
            ..SimSettings::default()
        };
        assert!(bad
            .build()
            .unwrap_err()
            .to_string()
            .contains("gpu_memory_utilization"));
        let too_big = SimSettings {
            model: "deepseek-v3".into(),
            ..SimSettings::default()
        };
        assert!(too_big
            .build()
            .unwrap_err()
            .to_string()
            .contains("no room for KV"));
        let capped = SimSettings {
            max_kv_blocks: 64,
            ..SimSettings::default()
        };
        assert_eq!(capped.build().unwrap().scheduler.num_blocks, 64);
        // No host tier by default; GB are sized into blocks; PCIe from the GPU preset.
        let cfg = SimSettings::default().build().unwrap();
        assert_eq!(cfg.scheduler.host_blocks, 0);
        assert_eq!(cfg.scheduler.pcie_bytes_per_s, 50e9);
        let host = SimSettings {
            host_dram_gb: 2.097152,
            ..SimSettings::default()
        };
        // 2.097152 GB / (16 tokens × 128 KiB) = 1,000 blocks.
        assert_eq!(host.build().unwrap().scheduler.host_blocks, 1000);
        let bad_host = SimSettings {
            host_dram_gb: -1.0,
            ..SimSettings::default()
        };
        assert!(bad_host.build().is_err());
        for bad in [
            SimSettings {
                link_gbs: 0.0,
                ..SimSettings::default()
            },
            SimSettings {
                link_gbs: f64::INFINITY,
                ..SimSettings::default()
            },
            SimSettings {
                link_latency_us: -1.0,
                ..SimSettings::default()
            },
            SimSettings {
                kv_lease_ms: 0,
                ..SimSettings::default()
            },
        ] {
            let err = bad.build().unwrap_err().to_string();
            assert!(
                err.starts_with("link_gbs")
                    || err.starts_with("link_latency_us")
                    || err.starts_with("kv_lease_ms"),
                "{err}"
            );
        }
    }
}
