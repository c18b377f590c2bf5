//! Model and GPU specifications and the figures that follow from them (KV bytes per token,
//! weight bytes, KV capacity). Presets are TOML files under `configs/`, embedded at build
//! time so the binary runs from anywhere; a path to another TOML file works too.

use serde::Deserialize;

/// How a model stores attention state per token.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Attention {
    /// Multi-head or grouped-query attention: K and V per KV head per layer.
    Gqa { kv_heads: u32 },
    /// Multi-head latent attention: one compressed latent plus a RoPE key per layer.
    Mla { kv_lora_rank: u32, qk_rope_dim: u32 },
    /// DeepSeek-V4-style hybrid attention (see `kv_state`): CSA layers keep one compressed
    /// entry (plus an indexer key) per `csa_ratio` tokens, HCA layers one per `hca_ratio`
    /// tokens, and every layer keeps the last `swa_window` tokens uncompressed.
    Hybrid {
        csa_layers: u32,
        hca_layers: u32,
        csa_ratio: u32,
        hca_ratio: u32,
        /// Elements per compressed or uncompressed entry per layer.
        entry_dim: u32,
        /// Elements per CSA indexer key.
        indexer_dim: u32,
        swa_window: u32,
    },
}

/// Mixture-of-experts shape.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Moe {
    pub experts: u32,
    pub experts_active: u32,
}

/// A model preset (`configs/models/*.toml`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    /// Name clients put in `"model"`.
    pub served_name: String,
    pub layers: u32,
    pub hidden: u32,
    pub q_heads: u32,
    pub head_dim: u32,
    pub params_total: f64,
    pub params_active: f64,
    pub weight_bytes_per_param: f64,
    pub kv_bytes_per_element: f64,
    pub max_model_len: u32,
    #[serde(default)]
    pub moe: Option<Moe>,
    pub attention: Attention,
}

/// A GPU preset (`configs/gpus/*.toml`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    pub name: String,
    /// Dense BF16 tensor throughput, TFLOP/s.
    pub bf16_tflops: f64,
    pub memory_gb: f64,
    /// HBM bandwidth, TB/s.
    pub bandwidth_tbs: f64,
    /// GPU-GPU link bandwidth, one direction, GB/s.
    pub link_gbs: f64,
    /// Host DRAM per GPU a host KV tier may use, GB (0: none). The presets take the
    /// vendor's 8-GPU server memory over its GPUs, e.g. 2 TB / 8 = 256 GB for a DGX H100
    /// (sources in each preset file).
    #[serde(default)]
    pub host_dram_gb: f64,
    /// Host-to-GPU bandwidth, one direction, effective GB/s: ~50 for PCIe Gen5 x16 (64 GB/s
    /// raw; H100, H20), ~25 for Gen4 x16 (A100, L40). A preset without it gets 25.
    #[serde(default = "default_pcie_gbs")]
    pub pcie_gbs: f64,
}

fn default_pcie_gbs() -> f64 {
    25.0
}

/// A preset that failed to load or makes no sense.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("unknown {kind} preset `{name}` (built-in: {known})")]
    UnknownPreset {
        kind: &'static str,
        name: String,
        known: String,
    },
    #[error("invalid {kind} preset")]
    Parse {
        kind: &'static str,
        #[source]
        source: toml::de::Error,
    },
    #[error("{field} must be positive, got {value}")]
    NotPositive { field: &'static str, value: f64 },
    #[error("hybrid attention: {csa} CSA + {hca} HCA layers, but the model has {layers}")]
    LayerCount { csa: u32, hca: u32, layers: u32 },
    #[error(
        "{model} needs {weights_gb:.1} GB of weights but {gpus}x {gpu} offer {usable_gb:.1} GB \
         at this memory utilization: no room for KV cache"
    )]
    NoKvCapacity {
        model: String,
        gpu: String,
        gpus: u32,
        weights_gb: f64,
        usable_gb: f64,
    },
}

const MODEL_PRESETS: &[(&str, &str)] = &[
    (
        "llama-3.1-8b",
        include_str!("../../configs/models/llama-3.1-8b.toml"),
    ),
    (
        "qwen3-30b-a3b",
        include_str!("../../configs/models/qwen3-30b-a3b.toml"),
    ),
    (
        "qwen3-30b-a3b-fp8",
        include_str!("../../configs/models/qwen3-30b-a3b-fp8.toml"),
    ),
    (
        "deepseek-v3",
        include_str!("../../configs/models/deepseek-v3.toml"),
    ),
    (
        "hybrid-v4-like",
        include_str!("../../configs/models/hybrid-v4-like.toml"),
    ),
];

const GPU_PRESETS: &[(&str, &str)] = &[
    ("h100", include_str!("../../configs/gpus/h100.toml")),
    ("h20", include_str!("../../configs/gpus/h20.toml")),
    ("a100", include_str!("../../configs/gpus/a100.toml")),
    ("l40", include_str!("../../configs/gpus/l40.toml")),
];

fn lookup<'a>(
    table: &'a [(&str, &str)],
    kind: &'static str,
    name: &str,
) -> Result<&'a str, SpecError> {
    table
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| *text)
        .ok_or_else(|| SpecError::UnknownPreset {
            kind,
            name: name.to_owned(),
            known: table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
        })
}

fn positive(field: &'static str, value: f64) -> Result<(), SpecError> {
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(SpecError::NotPositive { field, value })
    }
}

impl ModelSpec {
    /// A built-in preset by short name (`llama-3.1-8b`, `qwen3-30b-a3b`, `qwen3-30b-a3b-fp8`,
    /// `deepseek-v3`, `hybrid-v4-like`).
    pub fn preset(name: &str) -> Result<Self, SpecError> {
        Self::from_toml(lookup(MODEL_PRESETS, "model", name)?)
    }

    /// Every built-in model preset.
    pub fn presets() -> Result<Vec<Self>, SpecError> {
        MODEL_PRESETS
            .iter()
            .map(|(_, text)| Self::from_toml(text))
            .collect()
    }

    /// Parses and validates a model preset.
    pub fn from_toml(text: &str) -> Result<Self, SpecError> {
        let spec: Self = toml::from_str(text).map_err(|source| SpecError::Parse {
            kind: "model",
            source,
        })?;
        positive("params_active", spec.params_active)?;
        positive("params_total", spec.params_total)?;
        positive("weight_bytes_per_param", spec.weight_bytes_per_param)?;
        positive("kv_bytes_per_element", spec.kv_bytes_per_element)?;
        positive("layers", f64::from(spec.layers))?;
        if let Attention::Hybrid {
            csa_layers,
            hca_layers,
            csa_ratio,
            hca_ratio,
            entry_dim,
            ..
        } = spec.attention
        {
            positive("attention.csa_ratio", f64::from(csa_ratio))?;
            positive("attention.hca_ratio", f64::from(hca_ratio))?;
            positive("attention.entry_dim", f64::from(entry_dim))?;
            if csa_layers + hca_layers != spec.layers {
                return Err(SpecError::LayerCount {
                    csa: csa_layers,
                    hca: hca_layers,
                    layers: spec.layers,
                });
            }
        }
        Ok(spec)
    }

    /// KV-cache bytes one token occupies across all layers.
    pub fn kv_bytes_per_token(&self) -> f64 {
        let elements = match self.attention {
            Attention::Gqa { kv_heads } => {
                2.0 * f64::from(kv_heads) * f64::from(self.head_dim) * f64::from(self.layers)
            }
            Attention::Mla {
                kv_lora_rank,
                qk_rope_dim,
            } => f64::from(kv_lora_rank + qk_rope_dim) * f64::from(self.layers),
            // The long-run average: compressed entries amortised over the tokens they
            // cover. The window and the tail are a bounded amount per sequence on top.
            Attention::Hybrid {
                csa_layers,
                hca_layers,
                csa_ratio,
                hca_ratio,
                entry_dim,
                indexer_dim,
                ..
            } => {
                f64::from(csa_layers) * f64::from(entry_dim + indexer_dim) / f64::from(csa_ratio)
                    + f64::from(hca_layers) * f64::from(entry_dim) / f64::from(hca_ratio)
            }
        };
        elements * self.kv_bytes_per_element
    }

    /// Bytes of all weights.
    pub fn weight_bytes(&self) -> f64 {
        self.params_total * self.weight_bytes_per_param
    }

    /// Weight bytes a forward pass over `tokens` tokens reads. For MoE, each routed
    /// expert is touched with probability `1 - (1 - k/E)^tokens`, so large batches read
    /// nearly every expert (PRESETS.md).
    pub fn weight_bytes_touched(&self, tokens: u64) -> f64 {
        let Some(moe) = &self.moe else {
            return self.weight_bytes();
        };
        let (e, k) = (f64::from(moe.experts), f64::from(moe.experts_active));
        if tokens == 0 || e <= k {
            return self.weight_bytes();
        }
        // total = dense + E·x and active = dense + k·x give the per-expert size x.
        let per_expert = (self.params_total - self.params_active) / (e - k);
        let dense = (self.params_active - k * per_expert).max(0.0);
        let touched = 1.0 - (1.0 - k / e).powf(tokens as f64);
        (dense + e * per_expert * touched) * self.weight_bytes_per_param
    }

    /// FLOPs of attention per (query token, context token) pair: QK^T and AV over all heads.
    pub fn attention_flops_per_pair(&self) -> f64 {
        4.0 * f64::from(self.layers) * f64::from(self.q_heads) * f64::from(self.head_dim)
    }
}

impl GpuSpec {
    /// A built-in preset by short name (`h100`, `h20`, `a100`, `l40`).
    pub fn preset(name: &str) -> Result<Self, SpecError> {
        Self::from_toml(lookup(GPU_PRESETS, "gpu", name)?)
    }

    /// Parses and validates a GPU preset.
    pub fn from_toml(text: &str) -> Result<Self, SpecError> {
        let spec: Self = toml::from_str(text).map_err(|source| SpecError::Parse {
            kind: "gpu",
            source,
        })?;
        positive("bf16_tflops", spec.bf16_tflops)?;
        positive("memory_gb", spec.memory_gb)?;
        positive("bandwidth_tbs", spec.bandwidth_tbs)?;
        positive("link_gbs", spec.link_gbs)?;
        positive("pcie_gbs", spec.pcie_gbs)?;
        if !(spec.host_dram_gb >= 0.0 && spec.host_dram_gb.is_finite()) {
            return Err(SpecError::NotPositive {
                field: "host_dram_gb",
                value: spec.host_dram_gb,
            });
        }
        Ok(spec)
    }
}

/// Names of the built-in model presets.
pub fn model_preset_names() -> impl Iterator<Item = &'static str> {
    MODEL_PRESETS.iter().map(|(n, _)| *n)
}

/// Names of the built-in GPU presets.
pub fn gpu_preset_names() -> impl Iterator<Item = &'static str> {
    GPU_PRESETS.iter().map(|(n, _)| *n)
}

/// Number of KV blocks that fit on `gpus` GPUs once weights are loaded, with
/// `memory_utilization` of HBM usable (vLLM's `gpu_memory_utilization`, default 0.9).
pub fn kv_capacity_blocks(
    model: &ModelSpec,
    gpu: &GpuSpec,
    gpus: u32,
    memory_utilization: f64,
    block_size: u32,
) -> Result<u64, SpecError> {
    let usable = gpu.memory_gb * 1e9 * f64::from(gpus) * memory_utilization;
    let free = usable - model.weight_bytes();
    let block_bytes = model.kv_bytes_per_token() * f64::from(block_size);
    let blocks = (free / block_bytes).floor();
    if blocks < 1.0 {
        return Err(SpecError::NoKvCapacity {
            model: model.name.clone(),
            gpu: gpu.name.clone(),
            gpus,
            weights_gb: model.weight_bytes() / 1e9,
            usable_gb: usable / 1e9,
        });
    }
    Ok(blocks as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_preset_parses() {
        for name in model_preset_names() {
            ModelSpec::preset(name).unwrap();
        }
        for name in gpu_preset_names() {
            GpuSpec::preset(name).unwrap();
        }
    }

    #[test]
    fn kv_bytes_per_token_match_presets_md() {
        let kv = |n: &str| ModelSpec::preset(n).unwrap().kv_bytes_per_token();
        assert_eq!(kv("llama-3.1-8b"), 131_072.0);
        assert_eq!(kv("qwen3-30b-a3b"), 98_304.0);
        assert_eq!(kv("deepseek-v3"), 70_272.0);
    }

    #[test]
    fn kv_capacity_follows_from_hbm_minus_weights() {
        let m = ModelSpec::preset("llama-3.1-8b").unwrap();
        let g = GpuSpec::preset("h100").unwrap();
        let blocks = kv_capacity_blocks(&m, &g, 1, 0.9, 16).unwrap();
        let expected = ((80e9_f64 * 0.9 - 8.03e9 * 2.0) / (131_072.0 * 16.0)).floor() as u64;
        assert_eq!(blocks, expected);
        // DeepSeek-V3 does not fit one H100, but does fit eight H20.
        let ds = ModelSpec::preset("deepseek-v3").unwrap();
        assert!(matches!(
            kv_capacity_blocks(&ds, &g, 1, 0.9, 16),
            Err(SpecError::NoKvCapacity { .. })
        ));
        let h20 = GpuSpec::preset("h20").unwrap();
        assert!(kv_capacity_blocks(&ds, &h20, 8, 0.9, 16).unwrap() > 1000);
    }

    #[test]
    fn moe_touches_few_experts_at_batch_one_and_nearly_all_at_large_batch() {
        let m = ModelSpec::preset("qwen3-30b-a3b").unwrap();
        let one = m.weight_bytes_touched(1);
        assert!((one - m.params_active * 2.0).abs() / one < 1e-9);
        assert!(m.weight_bytes_touched(512) > 0.99 * m.weight_bytes());
        let dense = ModelSpec::preset("llama-3.1-8b").unwrap();
        assert_eq!(dense.weight_bytes_touched(1), dense.weight_bytes());
    }

    #[test]
    fn unknown_preset_names_the_known_ones() {
        let err = ModelSpec::preset("gpt-9").unwrap_err().to_string();
        assert!(err.contains("llama-3.1-8b"), "{err}");
    }

    #[test]
    fn a_hybrid_whose_layer_kinds_do_not_add_up_is_refused() {
        let text = include_str!("../../configs/models/hybrid-v4-like.toml")
            .replace("hca_layers = 31", "hca_layers = 30");
        let err = ModelSpec::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("30 CSA + 30 HCA layers, but the model has 61"),
            "{err}"
        );
        let text = include_str!("../../configs/models/hybrid-v4-like.toml")
            .replace("hca_ratio = 128", "hca_ratio = 0");
        let err = ModelSpec::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.contains("attention.hca_ratio must be positive"),
            "{err}"
        );
    }
}
