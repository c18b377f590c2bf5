//! The evaluation report: every policy over one workload on each cluster, as a Markdown
//! table and PNG plots (TTFT CDFs, duplicate factor over time, KV bytes moved); each
//! policy at its best shape (`best_shape`: soonest sessions; `best_goodput`: most goodput
//! sessions, with their KV costs).

pub mod best_goodput;
pub mod best_shape;
mod capacity;
pub mod matrix;
mod steps_csv;
mod summary_json;
mod table;

pub use capacity::{max_sessions, meets, meets_serving, unservable_steps, CapacitySearch};
pub use steps_csv::steps_csv;
pub use summary_json::summary_json;
pub use table::{markdown_table, summary_line};

use std::path::{Path, PathBuf};

use ownerserve_planner::policy::{self, Policy, PolicySettings};

use crate::bound::{lower_bound, BOUND};
use crate::oracle::Oracle;
use crate::plot::{self, Series};
use crate::progress::Progress;
use crate::sim::{simulate, Cluster, ClusterError, RunResult, SimOptions};
use crate::workload::Workload;

/// Every row the report compares: the router's policies (baselines and OwnerServe), the
/// oracle, then the lower bound no policy beats. Policies retired from the comparison
/// ([`policy::RETIRED_FROM_EVALUATION`], with the reason there) are left out.
pub fn all_policies() -> Vec<String> {
    policy::POLICY_NAMES
        .iter()
        .filter(|p| !policy::RETIRED_FROM_EVALUATION.contains(p))
        .chain(&["oracle", BOUND])
        .map(|s| (*s).to_owned())
        .collect()
}

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("unknown policy `{0}`")]
    Policy(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    #[error(transparent)]
    Workload(#[from] crate::workload::WorkloadError),
    #[error("the capacity search of `{0}` stopped with a panic")]
    SearchPanicked(String),
}

/// Builds `name` for a run of `workload` on a fleet with these engine configs.
pub fn make_policy(
    name: &str,
    workload: &Workload,
    cluster: &Cluster,
) -> Result<Box<dyn Policy>, ReportError> {
    if name == "oracle" {
        return Ok(Box::new(Oracle::new(workload)));
    }
    // The planner is told the presets, not a perturbed engine's figures.
    let configs = cluster.build_believed()?;
    let settings = PolicySettings {
        ownerserve: cluster.planner_config(&configs),
        ..PolicySettings::default()
    };
    policy::by_name(name, &settings).map_err(|_| ReportError::Policy(name.to_owned()))
}

/// One row of a report: `name` (a policy, `oracle`, or the [`BOUND`]) over `workload` on
/// `cluster`; `progress` is told how many steps completed.
pub fn run_one(
    name: &str,
    workload: &Workload,
    cluster: &Cluster,
    opts: &SimOptions,
    progress: &dyn Fn(u64),
) -> Result<RunResult, ReportError> {
    if name == BOUND {
        let r = lower_bound(workload, cluster)?;
        progress(r.steps.len() as u64);
        return Ok(r);
    }
    let p = make_policy(name, workload, cluster)?;
    Ok(simulate(workload, cluster, p, opts, progress)?)
}

/// Runs each of `policies` over `workload` on `cluster`, with a progress bar.
pub fn run_all(
    workload: &Workload,
    cluster: &Cluster,
    policies: &[String],
    opts: &SimOptions,
    quiet: bool,
) -> Result<Vec<RunResult>, ReportError> {
    let per_run = workload.num_requests() as u64;
    let bar = Progress::new(
        &format!("{} on {}", workload.name, cluster.name),
        per_run * policies.len() as u64,
        quiet,
    );
    let mut out = Vec::new();
    for (i, name) in policies.iter().enumerate() {
        let base = per_run * i as u64;
        out.push(run_one(name, workload, cluster, opts, &|done| {
            bar.set(base + done)
        })?);
    }
    bar.finish();
    Ok(out)
}

/// Writes the plots of one (workload, cluster) comparison into `dir`, named after `stem`;
/// returns the file names written.
pub fn write_plots(dir: &Path, stem: &str, runs: &[RunResult]) -> Result<Vec<String>, ReportError> {
    std::fs::create_dir_all(dir).map_err(|source| ReportError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let title = runs
        .first()
        .map(|r| format!("{} on {}", r.workload, r.cluster))
        .unwrap_or_default();
    let ttfts: Vec<(String, Vec<f64>)> =
        runs.iter().map(|r| (r.policy.clone(), r.ttfts())).collect();
    let samples: Vec<(&str, &[f64])> = ttfts
        .iter()
        .map(|(p, v)| (p.as_str(), v.as_slice()))
        .collect();
    let cdf = format!("{stem}-ttft-cdf.png");
    plot::cdf_png(
        &dir.join(&cdf),
        &format!("TTFT CDF, {title}"),
        "TTFT (s, log)",
        &samples,
        true,
    )?;
    let dup = format!("{stem}-duplicate-factor.png");
    // The bound has no residency series and moves no KV: it only joins the CDF.
    let simulated: Vec<&RunResult> = runs.iter().filter(|r| r.policy != BOUND).collect();
    let series: Vec<Series<'_>> = simulated
        .iter()
        .map(|r| Series {
            label: &r.policy,
            points: &r.duplicate_series,
        })
        .collect();
    plot::lines_png(
        &dir.join(&dup),
        &format!("HBM duplicate factor over time, {title}"),
        "virtual time (s)",
        "copies per distinct resident block",
        &series,
    )?;
    let bytes = format!("{stem}-kv-bytes.png");
    let names: Vec<&str> = simulated.iter().map(|r| r.policy.as_str()).collect();
    let gb = |f: fn(&RunResult) -> u64| {
        simulated
            .iter()
            .map(|r| f(r) as f64 / 1e9)
            .collect::<Vec<_>>()
    };
    let (p2d, fetch, mig) = (
        gb(|r| r.kv_bytes.prefill_to_decode),
        gb(|r| r.kv_bytes.fetch),
        gb(|r| r.kv_bytes.migration),
    );
    plot::stacked_bars_png(
        &dir.join(&bytes),
        &format!("KV moved between workers, {title}"),
        "GB",
        &names,
        &[
            ("prefill→decode", &p2d),
            ("fetch", &fetch),
            ("migration", &mig),
        ],
    )?;
    Ok(vec![cdf, dup, bytes])
}
