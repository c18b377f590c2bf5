//! `ownerserve bench ...`: the benchmark commands. Each prints its figures next to a
//! baseline measured in the same run; none of them is a test (figures depend on the
//! machine). Whole processes are benchmarked as processes: `proxy` and `directory` start
//! the `ownerserve` binary (and `wrk`), so this crate does not depend on the router.
//!
//! # Layout
//! - [`proxy`]: the router's added latency and throughput against a sim worker driven
//!   directly (wrk).
//! - [`peers`]: OwnerServe next to nginx and SMG on the same static backends
//!   (`bench proxy --peers`); [`peer_fleet`] starts those processes, [`peer_load`] makes the
//!   bodies and wrk scripts and reads wrk's figures.
//! - [`child_output`]: the address a started child prints, its other output drained;
//!   [`proc_stats`]: a process's memory, threads and descriptors from `/proc`.
//! - [`classes`]: admission classes under overload: interactive time to first token
//!   unloaded, beside batch and background floods, and with the floods unlabelled.
//! - [`overload`]: a flood of concurrent long streams against `up`: who is served, shed
//!   or left without an answer, `/health` latency and the router's memory meanwhile.
//! - [`soak`]: `up --ha`'s topology for N minutes under agent traffic and a fault every
//!   few minutes: memory, descriptors, tasks, p99 TTFT, lost writes and the directory's
//!   invariants, judged against issue 66's acceptance.
//! - [`fuzz`]: the mutation engine behind `ownerserve fuzz` (the binary wires the targets).
//! - [`kv`]: the KV routing hot paths (hashing, event ingest, prefix match and cost).
//! - [`directory`]: ownership writes on a local 3-node cluster, and memory for 1M sessions;
//!   [`replica`]: a router's side of that cluster (replica lookups, claims, lag);
//!   [`dir_scale`]: `--scale`, the directory's costs as sessions grow, measured in process
//!   ([`dir_snapshot`]: memory, snapshots) and on clusters ([`dir_live`]: writes, a new
//!   replica's catch-up, a node's recovery), printed and drawn by [`dir_report`];
//!   [`dir_cluster`]: the local cluster itself.
//! - [`replicas`]: 1, 2, 4 routers sharing one directory in front of one sim fleet:
//!   throughput and CPU per request as routers are added, and ownership held across them;
//!   [`replicas_fleet`]: its processes and counters, [`replicas_load`]: its session clients, [`replicas_report`]: its figures and ratios,
//!   [`ownership_check`]: the steps' workers and epochs against the directory's owners.
//! - [`planner`]: planner decision latency (hash + plan) for a long prompt over a fleet.
//! - [`sim`]: trace simulator throughput.
//! - [`first_step`]: the router's CPU for Claude Code's first request of a new session,
//!   after an earlier session and cold, next to the built-in tokenizer and `round_robin`.
//! - [`tokenize`]: a model's own tokenizer on an agent-sized chat prompt, from scratch and
//!   as a session's next step, next to the built-in tokenizer.
//!
//! The commands are the binary's glue (they start processes, print figures, and their
//! errors are only printed), so they use `anyhow`, as STYLE.md allows for main glue.
#![forbid(unsafe_code)]

pub mod child_output;
pub mod classes;
pub mod dir_cluster;
pub mod dir_live;
pub mod dir_report;
pub mod dir_scale;
pub mod dir_snapshot;
pub mod directory;
pub mod first_step;
pub mod fuzz;
pub mod kv;
pub mod overload;
pub mod ownership_check;
pub mod peer_fleet;
pub mod peer_load;
pub mod peers;
pub mod planner;
pub mod proc_stats;
pub mod proxy;
pub mod replica;
pub mod replicas;
pub mod replicas_fleet;
pub mod replicas_load;
pub mod replicas_report;
pub mod sim;
pub mod soak;
pub mod tokenize;

/// Percentile (0..=100) of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Times each of `fs` `n` times, one call of each in turn, so that every one sees the
/// machine in the same states (a shared VM drifts between fast and slow spells over
/// seconds, which skews ratios of cases timed one after another); returns each one's
/// sorted per-call microseconds.
pub fn time_interleaved_us(n: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::with_capacity(n); fs.len()];
    for _ in 0..n {
        for (f, samples) in fs.iter_mut().zip(&mut out) {
            let t = std::time::Instant::now();
            f();
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    for samples in &mut out {
        samples.sort_by(f64::total_cmp);
    }
    out
}

/// Times `f` `n` times; returns sorted per-call microseconds.
pub fn time_us(n: usize, mut f: impl FnMut()) -> Vec<f64> {
    let mut out: Vec<f64> = (0..n)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}
