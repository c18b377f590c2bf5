//! The cost planner's figures from `[router.planner]` and the workers (models, GPUs,
//! links, weights, step budgets), and the other policies' settings from
//! `[router.policy]`.

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::plan::{
    engine_default_chunk_tokens, ClassThresholds, Link, Links, StepBudget, Weights,
};
use ownerserve_planner::policy::{BusyThresholds, KvAwareConfig, OwnerServeConfig, PolicySettings};
use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_planner::spec::{GpuSpec, ModelSpec};
use ownerserve_shim::sim::config::load;

use super::{ConfigError, DirectoryMode, RouterSettings, WorkerSpec};

/// The spec of each served model: every preset under its `served_name`, then
/// `router.models` (a preset name or a `.toml` file per served name) over them.
fn served_model_specs(
    s: &RouterSettings,
) -> Result<std::collections::BTreeMap<String, ModelSpec>, ConfigError> {
    let mut models: std::collections::BTreeMap<String, ModelSpec> = ModelSpec::presets()
        .map_err(|e| ConfigError::router("planner_model", e))?
        .into_iter()
        .map(|m| (m.served_name.clone(), m))
        .collect();
    for (served, spec) in &s.models {
        let m = load(spec, ModelSpec::preset, ModelSpec::from_toml)
            .map_err(|e| ConfigError::invalid("router", format!("models.{served}"), e))?;
        models.insert(served.clone(), m);
    }
    Ok(models)
}

/// The operator's per-pair links (`planner_links`), keyed by the registry's worker ids.
fn planner_link_pairs(
    s: &RouterSettings,
    workers: &[WorkerSpec],
) -> Result<std::collections::BTreeMap<(WorkerId, WorkerId), Link>, ConfigError> {
    let index = |name: &str| {
        workers
            .iter()
            .position(|w| w.name == name)
            .map(|i| WorkerId(i as u32))
            .ok_or_else(|| {
                ConfigError::router("planner_links", format!("no worker named `{name}`"))
            })
    };
    let mut pairs = std::collections::BTreeMap::new();
    for l in &s.planner_links {
        if !(l.gbs > 0.0 && l.gbs.is_finite() && l.latency_us >= 0.0 && l.latency_us.is_finite()) {
            return Err(ConfigError::router(
                "planner_links",
                format!(
                    "{} -> {}: gbs must be positive, latency_us >= 0",
                    l.from, l.to
                ),
            ));
        }
        let link = Link {
            bytes_per_s: l.gbs * 1e9,
            latency_s: l.latency_us / 1e6,
        };
        pairs.insert((index(&l.from)?, index(&l.to)?), link);
    }
    Ok(pairs)
}

/// Builds the cost planner's figures for `workers` (indexed as the registry numbers them).
pub(super) fn planner_setup(
    s: &RouterSettings,
    workers: &[WorkerSpec],
) -> Result<OwnerServeConfig, ConfigError> {
    let model = load(&s.planner_model, ModelSpec::preset, ModelSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_model", e))?;
    let models = served_model_specs(s)?;
    let gpu = load(&s.planner_gpu, GpuSpec::preset, GpuSpec::from_toml)
        .map_err(|e| ConfigError::router("planner_gpu", e))?;
    let link_gbs = s.planner_link_gbs.unwrap_or(gpu.link_gbs);
    if !(link_gbs > 0.0 && link_gbs.is_finite()) {
        return Err(ConfigError::router("planner_link_gbs", "must be positive"));
    }
    let weights = Weights {
        lambda_s_per_gb: s.planner_lambda_s_per_gb,
        mu: s.planner_mu,
        nu: s.planner_nu,
        kappa: s.planner_kappa,
        rho: s.planner_rho,
        migration_budget: s.planner_migration_budget,
        ..Weights::default()
    };
    for (field, v) in [
        ("planner_link_latency_us", s.planner_link_latency_us),
        ("planner_lambda_s_per_gb", weights.lambda_s_per_gb),
        ("planner_mu", weights.mu),
        ("planner_nu", weights.nu),
        ("planner_kappa", weights.kappa),
        ("planner_rho", weights.rho),
    ] {
        if !(v >= 0.0 && v.is_finite()) {
            return Err(ConfigError::router(field, "must be zero or positive"));
        }
    }
    let pairs = planner_link_pairs(s, workers)?;
    // `inf` is no budget; NaN and negative shares are refused.
    let b = s.planner_migration_budget;
    if b.is_nan() || b < 0.0 {
        return Err(ConfigError::router(
            "planner_migration_budget",
            "must be zero, positive or inf (no budget)",
        ));
    }
    if s.planner_max_num_batched_tokens == Some(0) {
        return Err(ConfigError::router(
            "planner_max_num_batched_tokens",
            "must be positive",
        ));
    }
    let step_budget = StepBudget {
        tokens: s
            .planner_max_num_batched_tokens
            .unwrap_or_else(|| engine_default_chunk_tokens(&gpu)),
        long_prefill_cap: s.planner_long_prefill_token_threshold.unwrap_or(0),
    };
    let (rooflines, worker_step_budgets) = worker_engines(s, &gpu, step_budget, workers)?;
    Ok(OwnerServeConfig {
        roofline: Roofline::new(&gpu, s.planner_gpus.max(1), Efficiency::default()),
        rooflines,
        step_budget,
        worker_step_budgets,
        model,
        models,
        links: Links {
            default: Link {
                bytes_per_s: link_gbs * 1e9,
                latency_s: s.planner_link_latency_us / 1e6,
            },
            pairs,
        },
        weights,
        thresholds: ClassThresholds::default(),
        // What restoring a host-cached prefix costs (workers whose engines report host
        // holds, medium CPU): the planner GPU preset's host link.
        pcie_bytes_per_s: gpu.pcie_gbs * 1e9,
        prefill_workers_decode: s.planner_prefill_workers_decode,
        move_hold_s: move_hold_s(s),
    })
}

/// How long a move's first answer is held, which the planner prices
/// (`claim::settle_move`): the read lease of a remote directory, which other routers may
/// read; nothing where this router alone reads its directory.
fn move_hold_s(s: &RouterSettings) -> f64 {
    match s.directory {
        DirectoryMode::Remote => s.read_lease_ms as f64 / 1e3,
        DirectoryMode::Off | DirectoryMode::Embedded => 0.0,
    }
}

/// Per worker, its roofline and its engine's step budget, where they differ from the
/// planner's defaults.
type WorkerEngines = (
    std::collections::BTreeMap<WorkerId, Roofline>,
    std::collections::BTreeMap<WorkerId, StepBudget>,
);

/// The workers whose rooflines (their `gpu`, `gpus`) or engine step budgets differ from
/// the planner's defaults (`default_budget`). A worker's budget is its own
/// `max_num_batched_tokens`, else the router's, else vLLM's default for its GPU; its
/// long-prefill cap its own `long_prefill_token_threshold`, else the router's.
fn worker_engines(
    s: &RouterSettings,
    gpu: &GpuSpec,
    default_budget: StepBudget,
    workers: &[WorkerSpec],
) -> Result<WorkerEngines, ConfigError> {
    let mut rooflines = std::collections::BTreeMap::new();
    let mut worker_step_budgets = std::collections::BTreeMap::new();
    for (i, w) in workers.iter().enumerate() {
        let g = match &w.gpu {
            Some(name) => Some(
                load(name, GpuSpec::preset, GpuSpec::from_toml)
                    .map_err(|e| ConfigError::invalid("workers", format!("{}.gpu", w.name), e))?,
            ),
            None => None,
        };
        let tokens = w
            .max_num_batched_tokens
            .or(s.planner_max_num_batched_tokens)
            .or_else(|| g.as_ref().map(engine_default_chunk_tokens))
            .unwrap_or(default_budget.tokens);
        let long_prefill_cap = w
            .long_prefill_token_threshold
            .unwrap_or(default_budget.long_prefill_cap);
        let budget = StepBudget {
            tokens,
            long_prefill_cap,
        };
        if budget != default_budget {
            worker_step_budgets.insert(WorkerId(i as u32), budget);
        }
        if g.is_none() && w.gpus.is_none() {
            continue;
        }
        let n = w.gpus.unwrap_or(s.planner_gpus).max(1);
        rooflines.insert(
            WorkerId(i as u32),
            Roofline::new(g.as_ref().unwrap_or(gpu), n, Efficiency::default()),
        );
    }
    Ok((rooflines, worker_step_budgets))
}

/// `baseline`'s settings with the cost planner's `planner` beside them.
pub(super) fn with_planner(
    baseline: &PolicySettings,
    planner: &OwnerServeConfig,
) -> PolicySettings {
    PolicySettings {
        ownerserve: Some(planner.clone()),
        ..baseline.clone()
    }
}

/// The settings of every policy but the cost planner (the `--policy` chosen reads its own).
pub(super) fn baseline_settings(s: &RouterSettings) -> PolicySettings {
    PolicySettings {
        kv_aware: KvAwareConfig {
            overlap_weight: s.kv_overlap_weight,
            temperature: s.kv_temperature,
            busy: BusyThresholds {
                max_waiting: s.busy_max_waiting,
                max_kv_usage: s.busy_max_kv_usage,
                max_active_prefill_tokens: s.busy_max_active_prefill_tokens,
            },
        },
        session_ttl_ms: s.session_ttl_s.saturating_mul(1000),
        ..PolicySettings::default()
    }
}
