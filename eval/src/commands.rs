//! `ownerserve simulate`, `report` and (feature `replay`) `replay`: the trace simulator,
//! the evaluation report and the live replay from the command line: their arguments,
//! files and printed lines. The `ownerserve` binary parses the arguments and calls these.

use std::fmt::Write as _;
use std::path::PathBuf;

use ownerserve_planner::policy::PrefillWorkersDecode;
use ownerserve_shim::sim::config::SimSettings;

use crate::console::say;
use crate::report::{self, all_policies, markdown_table, summary_line, ReportError};
use crate::scenario::WorkloadSpec;
use crate::sim::{Cluster, ClusterError, Perturbation, SimOptions, SPREAD};
use crate::workload::{Workload, WorkloadError};

/// Why an evaluation command stopped.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("workload")]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("an open-loop workload has no agentic JSONL form (its calls have absolute arrivals)")]
    OpenLoop,
    #[error("cannot write {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[cfg(feature = "replay")]
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
}

/// What the engines are beyond their presets, for `simulate` and `report`: drifted from
/// the planner's model, or unable to pull KV from a peer.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct EngineDrift {
    /// Draw each engine's compute and memory efficiency within ±30% of its preset with this
    /// seed; the cost planner keeps the presets (an engine that is not its model).
    #[arg(long)]
    perturb_seed: Option<u64>,
    /// The engines' steps take compute plus memory time, not the longer of the two; the
    /// cost planner is not told.
    #[arg(long)]
    additive_steps: bool,
    /// The engines cannot pull KV from a peer (vLLM and SGLang here: KV moves only from a
    /// prefill leg to its decode leg), so the cost planner plans no fetch or migration.
    #[arg(long)]
    no_peer_pulls: bool,
}

impl EngineDrift {
    /// `cluster` with its engines drifted (unchanged without either flag).
    fn apply(self, cluster: Cluster) -> Cluster {
        let cluster = cluster.with_peer_pulls(!self.no_peer_pulls);
        if self.perturb_seed.is_none() && !self.additive_steps {
            return cluster;
        }
        cluster.perturbed(Perturbation {
            seed: self.perturb_seed,
            spread: SPREAD,
            additive_steps: self.additive_steps,
        })
    }

    /// How the engines drift, for a report's heading ("" without either flag).
    fn describe(self) -> String {
        let mut parts = Vec::new();
        if let Some(seed) = self.perturb_seed {
            parts.push(format!("efficiencies ±30% (seed {seed})"));
        }
        if self.additive_steps {
            parts.push("additive mixed steps".to_owned());
        }
        if self.no_peer_pulls {
            parts.push("no peer pulls".to_owned());
        }
        if parts.is_empty() {
            String::new()
        } else {
            format!("Engines: {}.\n\n", parts.join(", "))
        }
    }
}

/// Which fleet and policies to simulate.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    #[command(flatten)]
    workload: WorkloadSpec,
    /// Cluster: groups of `<count><p|d|h>` (prefill, decode, hybrid), e.g. 2p6d or 8h; a
    /// mixed fleet joins parts with `+`, each part's GPU preset after `@`: 4h@h100+4h@l40.
    #[arg(long, default_value = "2p6d")]
    cluster: String,
    /// Policies to run, comma-separated, or `all` (every baseline, ownerserve, oracle, and
    /// `bound`, the lower bound no policy beats).
    #[arg(long, default_value = "all")]
    policy: String,
    /// Every worker's engine settings (the same flags `ownerserve sim-worker` takes).
    #[command(flatten)]
    engine: SimSettings,
    /// When the cost planner may decode on prefill workers too: never, auto (where the
    /// worker's KV pool is sized for decoding), always (the router's
    /// `planner_prefill_workers_decode`); the peers' routers keep their sources' roles.
    #[arg(long, default_value_t = PrefillWorkersDecode::Auto)]
    prefill_workers_decode: PrefillWorkersDecode,
    /// The cost planner's migration budget: the share of its prompts' KV bytes its moves
    /// may ship (the router's `planner_migration_budget`; unset: its default, 0.1; `inf`:
    /// no budget).
    #[arg(long, value_parser = migration_share)]
    migration_budget: Option<f64>,
    /// Run the pooled relaxation instead of the fleet: its hybrid workers fused into one
    /// engine with their KV pools, budgets, FLOP/s and bandwidth summed and the weights
    /// read once per GPU (`eval/src/sim/pooled.rs`). What it cannot hold, a router on
    /// that fleet is unlikely to.
    #[arg(long)]
    pooled: bool,
    #[command(flatten)]
    drift: EngineDrift,
    /// Run `ownerserve` with the parked sessions' KV lifecycle (`[router.sessions]
    /// lifecycle`: keep, offload, prefetch or let go each session parked on a tool call,
    /// its returning steps marked ahead of new prompts on engines running vLLM's priority
    /// policy); the other policies run as they are.
    #[arg(long)]
    lifecycle: bool,
    /// With `--lifecycle`: decide knowing each parked session's true return (its trace
    /// gap) or end, a bound on what better gap predictions could save.
    #[arg(long, requires = "lifecycle")]
    lifecycle_oracle: bool,
    /// Run `ownerserve` with session admission (`[router.sessions] admission`): a new
    /// session's first step waits while the fleet's KV memory cannot hold its context
    /// beside the live sessions'; the wait counts in its TTFT.
    #[arg(long)]
    admission: bool,
    /// With `--admission`: the share of the fleet's KV kept for the live sessions' growth
    /// (`[router.sessions] admission_headroom`, 0 to 0.9).
    #[arg(long, requires = "admission", default_value_t = 0.0, value_parser = headroom)]
    admission_headroom: f64,
    /// Also print, per policy, what its sessions' returning steps (every step after a
    /// session's first) paid: prefill tokens recomputed after their tool gap and TTFT.
    #[arg(long)]
    returning: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Also write every step's record (where it ran, the plan's terms, its TTFT) to
    /// `<path>-<policy>.csv`, for diagnosing a policy step by step.
    #[arg(long)]
    steps_csv: Option<PathBuf>,
    /// Also write each policy's headline figures (prompt, cached and computed tokens,
    /// preemptions, TTFT percentiles) to this path, a JSON array.
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Also write the workload as agentic JSONL to this path (closed-loop workloads: the
    /// generators, the agentic traces), which `--workload PATH` reads back as it was.
    #[arg(long)]
    write_jsonl: Option<PathBuf>,
}

/// Which fleets to compare policies on, and where the report goes.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    #[command(flatten)]
    workload: WorkloadSpec,
    /// Clusters, comma-separated (see `simulate --cluster`).
    #[arg(long, default_value = "2p6d,8h")]
    clusters: String,
    /// Policies, comma-separated, or `all`.
    #[arg(long, default_value = "all")]
    policy: String,
    /// Output folder for `<name>.md` and the PNG plots.
    #[arg(long, default_value = "docs/eval")]
    out: PathBuf,
    /// File stem of the report (default: from the workload).
    #[arg(long)]
    name: Option<String>,
    /// Also search, per policy, the most sessions held with p99 TTFT within this many
    /// seconds (the workload rescaled to each session count; needs a scalable workload).
    #[arg(long)]
    capacity_slo_s: Option<f64>,
    /// Largest session count the capacity search tries.
    #[arg(long, default_value_t = 512)]
    capacity_max: usize,
    /// With `--capacity-slo-s`: goodput sessions, whose p99 TPOT must also stay within this
    /// many milliseconds.
    #[arg(long)]
    capacity_tpot_ms: Option<f64>,
    /// Score every policy at its best shape: each runs on every `--clusters` spec with each
    /// of these host-DRAM sizes (GB per GPU, comma-separated), into
    /// `<out>/<name>-best-shape.md`.
    #[arg(long, value_delimiter = ',')]
    best_shape: Option<Vec<f64>>,
    /// Run the evaluation matrix instead of one workload: every workload of
    /// [`matrix_workloads`] (fixed seeds and parameters) × `--clusters` × `--models`, with the
    /// bound and the acceptance checks per row, into `<out>/<name or "matrix">.md`.
    #[arg(long)]
    matrix: bool,
    /// Model presets of the matrix, comma-separated.
    #[arg(long, default_value = "llama-3.1-8b,qwen3-30b-a3b")]
    models: String,
    /// Workloads of the matrix, comma-separated (`swe-smith`, `coding-agent`, `forked`,
    /// `long-doc`, `mooncake`), or `all`; each keeps its fixed parameters.
    #[arg(long, default_value = "all")]
    workloads: String,
    /// Policies the matrix's capacity search runs (with `--capacity-slo-s`), comma-separated,
    /// or `auto`: `ownerserve` and the `--capacity-baselines` baselines with the lowest p99
    /// TTFT in the row's own run (the criterion is p99 TTFT, so the baseline that holds the
    /// most sessions is among the best at the row's count unless the order flips with load).
    #[arg(long, default_value = "auto")]
    capacity_policies: String,
    /// How many baselines `--capacity-policies auto` searches.
    #[arg(long, default_value_t = 3)]
    capacity_baselines: usize,
    /// The capacity search stops once the failing count is within this share of the held
    /// one; 0 (the default) bisects to the session, which the 1.2× acceptance needs
    /// (`CapacitySearch::tolerance`).
    #[arg(long, default_value_t = 0.0)]
    capacity_tolerance: f64,
    #[command(flatten)]
    engine: SimSettings,
    /// When the cost planner may decode on prefill workers too: never, auto (where the
    /// worker's KV pool is sized for decoding), always (the router's
    /// `planner_prefill_workers_decode`); the peers' routers keep their sources' roles.
    #[arg(long, default_value_t = PrefillWorkersDecode::Auto)]
    prefill_workers_decode: PrefillWorkersDecode,
    #[command(flatten)]
    drift: EngineDrift,
    #[arg(long)]
    quiet: bool,
}

/// Which router to drive, and what to compare with.
#[cfg(feature = "replay")]
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The router's base URL.
    #[arg(long)]
    target: String,
    #[command(flatten)]
    workload: WorkloadSpec,
    /// The `model` requests name. (Its own clap id: the flattened engine settings have a
    /// `model` of their own, `--model-preset`, and two equal ids made the command unusable.)
    #[arg(
        long = "model",
        id = "served_model",
        default_value = "meta-llama/Llama-3.1-8B-Instruct"
    )]
    model: String,
    /// The fleet's simulated seconds per wall second (its workers' `time_scale`).
    #[arg(long = "fleet-time-scale", default_value_t = 1.0)]
    fleet_time_scale: f64,
    /// Bearer token for the router.
    #[arg(long, env = "OWNERSERVE_API_TOKEN")]
    token: Option<String>,
    /// Longest one request may take, seconds (wall).
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// The served model's vocabulary size, when below the workload's token ids (up to
    /// 60,000): ids are folded into it (a tiny test model's 4,096).
    #[arg(long)]
    vocab: Option<u32>,
    /// Also simulate the same workload on this cluster (the fleet behind the router) and
    /// print how far apart the two are.
    #[arg(long)]
    compare_cluster: Option<String>,
    /// The router's policy, for the comparison.
    #[arg(long, default_value = "ownerserve")]
    compare_policy: String,
    /// Engine settings of the compared cluster (match the live workers').
    #[command(flatten)]
    engine: SimSettings,
    #[arg(long)]
    quiet: bool,
    /// Also write the live run's headline figures (and the simulated one's, with
    /// `--compare-cluster`) to this path, a JSON array (TTFT and steps; the engines'
    /// cache figures are theirs to report).
    #[arg(long)]
    summary_json: Option<PathBuf>,
    /// Also write every live step's record (TTFT, prompt and cached tokens) to
    /// `<path>-live.csv` (and the simulated run's to `<path>-<policy>.csv`).
    #[arg(long)]
    steps_csv: Option<PathBuf>,
}

/// Writes `value` to `path`.
fn write_json(path: &std::path::Path, value: &serde_json::Value) -> Result<(), CommandError> {
    std::fs::write(path, value.to_string()).map_err(|source| CommandError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Replays the workload against a live router; optionally compares with the simulator.
#[cfg(feature = "replay")]
pub async fn replay(args: ReplayArgs) -> Result<(), CommandError> {
    use crate::agreement::Agreement;
    use crate::replay::{self, ReplayOptions};
    let wl = args.workload.build()?;
    say(&format!("workload: {}", wl.stats()));
    let opts = ReplayOptions {
        target: args.target.clone(),
        model: args.model.clone(),
        time_scale: args.fleet_time_scale,
        token: args.token.clone(),
        timeout: std::time::Duration::from_secs(args.timeout_s.max(1)),
        vocab: args.vocab,
    };
    let bar = std::sync::Arc::new(crate::progress::Progress::new(
        "replay",
        wl.num_requests() as u64,
        args.quiet,
    ));
    let b = bar.clone();
    let live = replay::replay(&wl, &opts, std::sync::Arc::new(move |n| b.set(n))).await?;
    bar.finish();
    for e in &live.errors {
        say(&format!("error: {e}"));
    }
    say(&summary_line(&live.result));
    let csv = |stem: &PathBuf, label: &str, r: &crate::sim::RunResult| {
        let path = PathBuf::from(format!("{}-{label}.csv", stem.display()));
        std::fs::write(&path, report::steps_csv(r))
            .map_err(|source| CommandError::Write { path, source })
    };
    if let Some(stem) = &args.steps_csv {
        csv(stem, "live", &live.result)?;
    }
    let mut summaries = vec![report::summary_json(&live.result)];
    let Some(spec) = args.compare_cluster else {
        if let Some(path) = &args.summary_json {
            write_json(path, &serde_json::Value::Array(summaries))?;
        }
        return Ok(());
    };
    let cluster = Cluster::parse(&spec, &args.engine)?;
    let sim = report::run_one(
        &args.compare_policy,
        &wl,
        &cluster,
        &SimOptions::default(),
        &|_| {},
    )?;
    say(&summary_line(&sim));
    say(&Agreement::of(&live.result, &sim).to_string());
    summaries.push(report::summary_json(&sim));
    if let Some(stem) = &args.steps_csv {
        csv(stem, &sim.policy, &sim)?;
    }
    if let Some(path) = &args.summary_json {
        write_json(path, &serde_json::Value::Array(summaries))?;
    }
    Ok(())
}

fn policies(list: &str) -> Vec<String> {
    if list == "all" {
        all_policies()
    } else {
        list.split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect()
    }
}

/// A migration budget's share: zero, positive or `inf` (NaN and negative shares refused,
/// as the router refuses them).
fn migration_share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(share) if share >= 0.0 => Ok(share),
        _ => Err(format!(
            "{text:?}: a share of the prompts' KV bytes, zero, positive or inf"
        )),
    }
}

/// An admission headroom: a share from 0 to `MAX_HEADROOM` (as the router refuses others).
fn headroom(text: &str) -> Result<f64, String> {
    use ownerserve_planner::lifecycle::admission::MAX_HEADROOM;
    match text.parse::<f64>() {
        Ok(h) if (0.0..=MAX_HEADROOM).contains(&h) => Ok(h),
        _ => Err(format!(
            "{text:?}: a share of the fleet's KV from 0 to {MAX_HEADROOM}"
        )),
    }
}

/// Runs the simulator and prints one summary line per policy, then a Markdown table.
pub fn simulate(args: SimulateArgs) -> Result<(), CommandError> {
    let wl = args.workload.build()?;
    let mut cluster = Cluster::parse(&args.cluster, &args.engine)?
        .with_prefill_workers_decode(args.prefill_workers_decode);
    if let Some(share) = args.migration_budget {
        cluster = cluster.with_migration_budget(share);
    }
    if args.pooled {
        cluster = cluster.pooled()?;
    }
    cluster = args.drift.apply(cluster);
    say(&format!("workload: {}", wl.stats()));
    if let Some(path) = &args.write_jsonl {
        let text = crate::workload::agentic::write(&wl).ok_or(CommandError::OpenLoop)?;
        std::fs::write(path, text).map_err(|source| CommandError::Write {
            path: path.clone(),
            source,
        })?;
        say(&format!("wrote {}", path.display()));
    }
    let opts = SimOptions {
        lifecycle: args.lifecycle,
        lifecycle_oracle: args.lifecycle_oracle,
        admission: args.admission,
        admission_headroom: args.admission_headroom,
        ..SimOptions::default()
    };
    let runs = report::run_all(&wl, &cluster, &policies(&args.policy), &opts, args.quiet)?;
    for r in &runs {
        say(&summary_line(r));
    }
    if args.returning {
        say("");
        for r in &runs {
            say(&returning_line(r, &wl));
        }
    }
    say("");
    say(&markdown_table(&runs));
    if let Some(path) = &args.summary_json {
        let all: Vec<_> = runs.iter().map(report::summary_json).collect();
        write_json(path, &serde_json::Value::Array(all))?;
    }
    if let Some(stem) = &args.steps_csv {
        for r in &runs {
            let path = PathBuf::from(format!("{}-{}.csv", stem.display(), r.policy));
            std::fs::write(&path, report::steps_csv(r))
                .map_err(|source| CommandError::Write { path, source })?;
        }
    }
    Ok(())
}

/// What a run's returning steps (a session's steps after its first) paid, and what its
/// lifecycle did. Recomputed: the tokens of the prompt's prefix the session itself had
/// sent before (with the step it continues) that the engine did not find cached; the tool
/// result and new turn after it are new, never recomputed.
fn returning_line(r: &crate::sim::RunResult, wl: &Workload) -> String {
    let back: Vec<_> = r
        .steps
        .iter()
        .filter(|s| s.step > 0 && !s.rejected)
        .collect();
    let recomputed: u64 = back
        .iter()
        .map(|s| {
            let sent = own_prefix_tokens(wl, s.session, s.step).min(s.prompt_tokens);
            u64::from(sent.saturating_sub(s.cached_tokens))
        })
        .sum();
    let mut ttft: Vec<f64> = back.iter().map(|s| s.ttft_s).collect();
    ttft.sort_by(f64::total_cmp);
    let q = |p: f64| {
        ttft.get(((ttft.len().saturating_sub(1)) as f64 * p).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let mut line = format!(
        "{:<16} returning steps {:>5}: sent before, recomputed {:>11} tokens, TTFT p50 {:>7.3}s p99 {:>7.3}s",
        r.policy,
        back.len(),
        recomputed,
        q(0.5),
        q(0.99)
    );
    if !r.lifecycle.is_empty() {
        let counts: Vec<String> = r
            .lifecycle
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        line.push_str(&format!("  [lifecycle: {}]", counts.join(", ")));
    }
    line
}

/// Tokens of step `step`'s prompt its session had sent before: the whole blocks it shares
/// with the step it continues (its `parent`, else the one before it), at most that step's
/// prompt.
fn own_prefix_tokens(wl: &Workload, session: usize, step: usize) -> u32 {
    let Some(steps) = wl.sessions.get(session).map(|s| &s.steps) else {
        return 0;
    };
    let Some(st) = steps.get(step) else {
        return 0;
    };
    let before = st
        .parent
        .and_then(|t| steps[..step].iter().rev().find(|p| p.turn == t))
        .or_else(|| step.checked_sub(1).map(|k| &steps[k]));
    let Some(before) = before else {
        return 0;
    };
    let shared = st
        .hash_ids
        .iter()
        .zip(&before.hash_ids)
        .take_while(|(a, b)| a == b)
        .count() as u32;
    (shared * wl.hash_block).min(before.input_tokens)
}

/// Runs every policy on every cluster and writes the Markdown report and plots.
pub fn report(args: ReportArgs) -> Result<(), CommandError> {
    if args.matrix {
        return report_matrix(&args);
    }
    if let Some(drams) = &args.best_shape {
        return report_best_shape(&args, drams);
    }
    let wl = args.workload.build()?;
    let stem = args.stem();
    let mut md = format!("## {}\n\nWorkload: {}\n\n", wl.name, wl.stats());
    for spec in args.cluster_specs() {
        let (cluster, runs) = args.run_on(&wl, spec, &args.engine)?;
        let plots = report::write_plots(&args.out, &format!("{stem}-{}", cluster.name), &runs)?;
        md.push_str(&format!("### Cluster {}\n\n", cluster.name));
        md.push_str(&markdown_table(&runs));
        md.push('\n');
        for p in plots {
            md.push_str(&format!("![{p}]({p})\n"));
        }
        md.push('\n');
        if let Some(slo_s) = args.capacity_slo_s {
            md.push_str(&capacity(&args, &cluster, slo_s)?);
        }
    }
    write_report(&args.out, &format!("{stem}.md"), md)
}

impl ReportArgs {
    /// The report's file stem: `--name`, else from the workload.
    fn stem(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| slug(&self.workload.workload))
    }

    /// The `--clusters` specs.
    fn cluster_specs(&self) -> impl Iterator<Item = &str> {
        self.clusters
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// The capacity search the flags ask for, at p99 TTFT `slo_s`.
    fn search(&self, slo_s: f64) -> report::CapacitySearch {
        report::CapacitySearch {
            tpot_slo_s: self.capacity_tpot_ms.map(|ms| ms / 1e3),
            tolerance: self.capacity_tolerance.clamp(0.0, 1.0),
            ..report::CapacitySearch::new(slo_s, self.capacity_max)
        }
    }

    /// The cluster `spec` with `settings`, its engines drifted as the flags say.
    fn cluster(&self, spec: &str, settings: &SimSettings) -> Result<Cluster, CommandError> {
        Ok(self.drift.apply(
            Cluster::parse(spec, settings)?
                .with_prefill_workers_decode(self.prefill_workers_decode),
        ))
    }

    /// Every `--policy` over `wl` on the cluster `spec` with `settings`.
    fn run_on(
        &self,
        wl: &crate::workload::Workload,
        spec: &str,
        settings: &SimSettings,
    ) -> Result<(Cluster, Vec<crate::sim::RunResult>), CommandError> {
        let cluster = self.cluster(spec, settings)?;
        let runs = report::run_all(
            wl,
            &cluster,
            &policies(&self.policy),
            &SimOptions::default(),
            self.quiet,
        )?;
        Ok((cluster, runs))
    }
}

/// Writes `md` to `out/file` (creating `out`) and says so.
fn write_report(out: &std::path::Path, file: &str, md: String) -> Result<(), CommandError> {
    std::fs::create_dir_all(out).map_err(|source| CommandError::Write {
        path: out.to_owned(),
        source,
    })?;
    let path = out.join(file);
    std::fs::write(&path, md).map_err(|source| CommandError::Write {
        path: path.clone(),
        source,
    })?;
    say(&format!("wrote {}", path.display()));
    Ok(())
}

/// The matrix's workloads, their parameters fixed before any run (seed 1): SWE-smith
/// scaled to 200 sessions arriving at 10/s, the coding-agent, forked-rollout and
/// long-document generators at their defaults, and the Mooncake synthetic trace. The
/// flag says whether the workload is agentic (closed-loop sessions: capacity and E2E
/// checks apply).
pub fn matrix_workloads(traces_dir: &std::path::Path) -> Vec<(WorkloadSpec, bool)> {
    let w = |name: &str, sessions: Option<usize>, rate: f64| WorkloadSpec {
        workload: name.to_owned(),
        sessions,
        rate,
        arrival_window_s: None,
        max_requests: 0,
        seed: 1,
        traces_dir: traces_dir.to_owned(),
        knobs: Default::default(),
    };
    vec![
        (w("swe-smith", Some(200), 10.0), true),
        (w("coding-agent", None, 1.0), true),
        (w("forked", None, 1.0), false),
        (w("long-doc", None, 1.0), false),
        (w("mooncake", None, 1.0), false),
    ]
}

/// Every workload × cluster × model, one Markdown file: the acceptance summary first,
/// then each row's full table.
fn report_matrix(args: &ReportArgs) -> Result<(), CommandError> {
    use crate::report::matrix::{summary, MatrixRow};
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut rows = Vec::new();
    let mut detail = String::new();
    for model in list(&args.models) {
        let engine = SimSettings {
            model: model.clone(),
            ..args.engine.clone()
        };
        for (spec, agentic) in matrix_workloads(&args.workload.traces_dir)
            .into_iter()
            .filter(|(spec, _)| {
                args.workloads == "all" || list(&args.workloads).contains(&spec.workload)
            })
        {
            let wl = spec.build()?;
            for c in list(&args.clusters) {
                let cluster = args.cluster(&c, &engine)?;
                let configs = cluster.build()?;
                let runs = report::run_all(
                    &wl,
                    &cluster,
                    &policies(&args.policy),
                    &SimOptions::default(),
                    args.quiet,
                )?;
                let prompt_kv_bytes = configs.first().map_or(0.0, |cfg| {
                    let block = cfg.scheduler.block_size;
                    wl.sessions
                        .iter()
                        .flat_map(|s| &s.steps)
                        .map(|st| {
                            cfg.model
                                .prefix_bytes(u64::from(st.input_tokens), block)
                                .total
                        })
                        .sum()
                });
                let capacity = match (args.capacity_slo_s, agentic) {
                    (Some(slo_s), true) => {
                        matrix_capacity(args, &spec, &wl, &cluster, &runs, slo_s)?
                    }
                    _ => Vec::new(),
                };
                let pooled = match cluster.clone().pooled() {
                    Ok(pooled) if agentic => {
                        Some(matrix_pooled(args, &spec, &wl, &pooled, &capacity)?)
                    }
                    _ => None,
                };
                let _ = writeln!(
                    detail,
                    "### {} on {} with {}\n\nWorkload: {}\n\n{}",
                    wl.name,
                    cluster.name,
                    model,
                    wl.stats(),
                    markdown_table(&runs)
                );
                if !capacity.is_empty() {
                    let _ = writeln!(
                        detail,
                        "Sessions held with p99 TTFT ≤ {} s (searched up to {}): {}\n",
                        args.capacity_slo_s.unwrap_or_default(),
                        args.capacity_max,
                        capacity
                            .iter()
                            .map(|(n, c)| format!("{n} {c}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                }
                let row = MatrixRow {
                    workload: wl.name.clone(),
                    cluster: cluster.name.clone(),
                    model: model.clone(),
                    agentic,
                    runs,
                    capacity,
                    prompt_kv_bytes,
                    pooled,
                };
                say(&summary(std::slice::from_ref(&row)));
                rows.push(row);
            }
        }
    }
    let md = format!(
        "## Acceptance per row\n\n{}\n## Every row\n\n{detail}",
        summary(&rows)
    );
    let stem = args.name.clone().unwrap_or_else(|| "matrix".to_owned());
    write_report(&args.out, &format!("{stem}.md"), md)
}

/// Sessions held at the SLO on one matrix row, per searched policy (`--capacity-policies`):
/// each search starts from the policy's own run of the row (`wl`, its session count),
/// in parallel threads, one per policy.
fn matrix_capacity(
    args: &ReportArgs,
    spec: &WorkloadSpec,
    wl: &crate::workload::Workload,
    cluster: &Cluster,
    runs: &[crate::sim::RunResult],
    slo_s: f64,
) -> Result<Vec<(String, usize)>, CommandError> {
    let search = args.search(slo_s);
    let names = if args.capacity_policies == "auto" {
        report::matrix::capacity_candidates(runs, args.capacity_baselines)
    } else {
        args.capacity_policies
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let build = |n: usize| spec.scaled(n);
    let count = wl.sessions.iter().filter(|s| s.fork_of.is_none()).count();
    let unservable = report::unservable_steps(wl, cluster)?;
    let results: Vec<Result<usize, ReportError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .iter()
            .map(|name| {
                let known = runs
                    .iter()
                    .find(|r| &r.policy == name)
                    .map(|r| (count, report::meets_serving(r, slo_s, unservable)));
                let build = &build;
                scope.spawn(move || {
                    report::max_sessions(
                        build,
                        cluster,
                        name,
                        search,
                        &SimOptions::default(),
                        known,
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .zip(&names)
            .map(|(h, name)| {
                h.join()
                    .unwrap_or_else(|_| Err(ReportError::SearchPanicked(name.clone())))
            })
            .collect()
    });
    let mut out = Vec::new();
    for (name, n) in names.into_iter().zip(results) {
        out.push((name, n?));
    }
    Ok(out)
}

/// The pooled relaxation on an agentic row of a hybrid fleet (`pooled`, the fleet fused):
/// its E2E on the row's workload, and whether it holds the session count the row's
/// sessions-held check asks for (1.2× the best baseline's). Any policy is the same on one
/// worker; `session_affinity` is the one named.
fn matrix_pooled(
    args: &ReportArgs,
    spec: &WorkloadSpec,
    wl: &crate::workload::Workload,
    pooled: &Cluster,
    capacity: &[(String, usize)],
) -> Result<report::matrix::PooledRow, CommandError> {
    const POLICY: &str = "session_affinity";
    let opts = SimOptions::default();
    let e2e_s =
        crate::sim::mean(&report::run_one(POLICY, wl, pooled, &opts, &|_| {})?.session_e2e_s);
    let best = capacity
        .iter()
        .filter(|(n, _)| report::matrix::is_baseline(n))
        .map(|(_, c)| *c)
        .max();
    let at_target = match (args.capacity_slo_s, best) {
        (Some(slo_s), Some(best)) if best > 0 => {
            let n = (1.2 * best as f64).ceil() as usize;
            let wl = spec.scaled(n)?;
            let r = report::run_one(POLICY, &wl, pooled, &opts, &|_| {})?;
            let unservable = report::unservable_steps(&wl, pooled)?;
            let p99 = crate::sim::percentile(&r.ttfts(), 0.99);
            Some((n, p99, report::meets_serving(&r, slo_s, unservable)))
        }
        _ => None,
    };
    Ok(report::matrix::PooledRow { e2e_s, at_target })
}

/// `report --best-shape`: every policy on every shape, each scored at its best.
fn report_best_shape(args: &ReportArgs, drams: &[f64]) -> Result<(), CommandError> {
    if let Some(slo_s) = args.capacity_slo_s {
        return report_best_goodput(args, drams, slo_s);
    }
    let wl = args.workload.build()?;
    let mut cells = Vec::new();
    for spec in args.cluster_specs() {
        for &gb in drams {
            let settings = SimSettings {
                host_dram_gb: gb,
                ..args.engine.clone()
            };
            let (_, runs) = args.run_on(&wl, spec, &settings)?;
            cells.push((format!("{spec}, {gb} GB host"), runs));
        }
    }
    let best = report::best_shape::best_cells(&cells);
    let md = format!(
        "## {} at each policy's best shape\n\nWorkload: {}\n\n{}",
        wl.name,
        wl.stats(),
        report::best_shape::markdown(&best)
    );
    write_report(&args.out, &format!("{}-best-shape.md", args.stem()), md)
}

/// `report --best-shape --capacity-slo-s`: every policy's goodput sessions on every shape,
/// each scored at its best, with its KV cost at the best baseline's goodput count.
fn report_best_goodput(args: &ReportArgs, drams: &[f64], slo_s: f64) -> Result<(), CommandError> {
    use report::best_goodput::{self as goodput, GoodputCell, KvCost};
    let search = args.search(slo_s);
    let build = |n: usize| args.workload.scaled(n);
    let names = policies(&args.policy);
    let (mut cells, mut clusters) = (Vec::new(), Vec::new());
    for spec in args.cluster_specs() {
        for &gb in drams {
            let settings = SimSettings {
                host_dram_gb: gb,
                ..args.engine.clone()
            };
            let shape = format!("{spec}, {gb} GB host");
            let cluster = args.cluster(spec, &settings)?;
            for name in &names {
                let sessions = report::max_sessions(
                    &build,
                    &cluster,
                    name,
                    search,
                    &SimOptions::default(),
                    None,
                )?;
                say(&format!("{name} on {shape}: {sessions} goodput sessions"));
                cells.push(GoodputCell {
                    policy: name.clone(),
                    shape: shape.clone(),
                    sessions,
                });
            }
            clusters.push((shape, cluster));
        }
    }
    let best = goodput::best_goodput(&cells);
    let given = args.workload.build()?.sessions.len();
    let load = goodput::cost_load(&best, given);
    let wl = build(load)?;
    let first_seen = goodput::first_seen_tokens(&wl);
    let mut rows = Vec::new();
    for c in best {
        let Some((_, cluster)) = clusters.iter().find(|(s, _)| *s == c.shape) else {
            continue;
        };
        let kv_per_token = cluster
            .build()?
            .first()
            .map_or(0.0, |cfg| cfg.model.kv_bytes_per_token());
        let r = report::run_one(&c.policy, &wl, cluster, &SimOptions::default(), &|_| {})?;
        rows.push((c, KvCost::of(&r, &wl, first_seen, kv_per_token)));
    }
    let tpot = args
        .capacity_tpot_ms
        .map_or(String::new(), |ms| format!(" and p99 TPOT ≤ {ms} ms"));
    let md = format!(
        "## {} goodput at each policy's best shape\n\nGoodput sessions: p99 TTFT ≤ {slo_s} s{tpot}, searched up to {} over {}. Workload at {load} sessions: {}\n\n{}{}",
        wl.name,
        search.max_sessions,
        clusters
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>()
            .join("; "),
        wl.stats(),
        args.drift.describe(),
        goodput::markdown(&rows, load, search.max_sessions)
    );
    write_report(&args.out, &format!("{}-goodput.md", args.stem()), md)
}

/// The capacity table of one cluster: sessions held at the SLO, per policy.
fn capacity(args: &ReportArgs, cluster: &Cluster, slo_s: f64) -> Result<String, CommandError> {
    let search = args.search(slo_s);
    let build = |n: usize| args.workload.scaled(n);
    let names = policies(&args.policy);
    let bar = crate::progress::Progress::new(
        &format!("capacity on {}", cluster.name),
        names.len() as u64,
        args.quiet,
    );
    let tpot = args
        .capacity_tpot_ms
        .map_or(String::new(), |ms| format!(" and p99 TPOT ≤ {ms} ms"));
    let mut md = format!(
        "Sessions held with p99 TTFT ≤ {slo_s} s{tpot} (session count searched up to {}):\n\n\
         | policy | sessions |\n|---|---:|\n",
        search.max_sessions
    );
    for name in &names {
        let n = report::max_sessions(&build, cluster, name, search, &SimOptions::default(), None)?;
        let shown = if n >= search.max_sessions {
            format!("≥ {n}")
        } else {
            n.to_string()
        };
        md.push_str(&format!("| {name} | {shown} |\n"));
        bar.inc(1);
    }
    bar.finish();
    md.push('\n');
    Ok(md)
}

/// A file-name-safe form of a workload name.
fn slug(s: &str) -> String {
    let name = std::path::Path::new(s)
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or(s);
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

#[cfg(all(test, feature = "replay"))]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        args: ReplayArgs,
    }

    #[test]
    fn replay_takes_both_the_served_model_and_the_engine_preset() {
        let flags = Flags::try_parse_from([
            "replay",
            "--target",
            "http://127.0.0.1:8080",
            "--model",
            "tiny",
            "--model-preset",
            "llama-3.1-8b",
        ])
        .unwrap();
        assert_eq!(flags.args.model, "tiny");
        assert_eq!(flags.args.engine.model, "llama-3.1-8b");
    }
}

#[cfg(test)]
mod returning_tests {
    use super::*;
    use crate::workload::{Loop, Session, Step};

    fn step(turn: u32, parent: Option<u32>, input_tokens: u32, hash_ids: &[u64]) -> Step {
        Step {
            turn,
            parent,
            ..Step::of(input_tokens, hash_ids.to_vec())
        }
    }

    #[test]
    fn a_step_sent_before_is_the_prefix_it_shares_with_the_step_it_continues() {
        let wl = Workload {
            name: "t".into(),
            hash_block: 16,
            looping: Loop::Closed,
            sessions: vec![Session {
                id: "s".into(),
                start_ms: 0.0,
                fork_of: None,
                steps: vec![
                    step(0, None, 40, &[1, 2, 3]),
                    // Continues turn 0: blocks 1 and 2 are whole and shared; 3 was partial.
                    step(1, Some(0), 64, &[1, 2, 4, 5]),
                    // A subagent's turn continues turn 0, not the one before it.
                    step(2, Some(0), 48, &[1, 2, 3]),
                    // No parent: the step before it; nothing shared.
                    step(3, None, 32, &[9, 10]),
                ],
            }],
        };
        assert_eq!(own_prefix_tokens(&wl, 0, 0), 0);
        assert_eq!(own_prefix_tokens(&wl, 0, 1), 32);
        // All of turn 0's 40 tokens, its partial last block included, never more.
        assert_eq!(own_prefix_tokens(&wl, 0, 2), 40);
        assert_eq!(own_prefix_tokens(&wl, 0, 3), 0);
        assert_eq!(own_prefix_tokens(&wl, 1, 1), 0);
    }
}
