//! The report's Markdown table: one row per policy with the mission's metrics.

use std::fmt::Write;

use crate::sim::{mean, percentile, RunResult};

fn secs(x: f64) -> String {
    if !x.is_finite() {
        "–".to_owned()
    } else if x >= 10.0 {
        format!("{x:.1}")
    } else if x >= 0.1 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}")
    } else {
        "–".to_owned()
    }
}

fn pct(x: f64) -> String {
    if x.is_finite() {
        format!("{:.0}%", x * 100.0)
    } else {
        "–".to_owned()
    }
}

fn gb(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / 1e9)
}

/// Prefix reuse, and the host-DRAM tier's share of it when it restored anything.
fn reuse(r: &RunResult) -> String {
    match r.host_restored_bytes {
        0 => pct(r.reuse_ratio()),
        b => format!(
            "{} (host {}, {} GB)",
            pct(r.reuse_ratio()),
            pct(r.host_reuse_ratio()),
            gb(b)
        ),
    }
}

/// A Markdown table of `runs` (all of one workload and cluster).
pub fn markdown_table(runs: &[RunResult]) -> String {
    let mut s = String::from(
        "| policy | TTFT p50 / p95 / p99 (s) | TPOT p50 / p99 (ms) | session E2E mean / p99 (s) \
         | dup. factor (on decoders) | KV moved GB (P→D / fetch / migr.) | owner hit | decode interf. \
         | GPU busy | prefix reuse | actions |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in runs {
        let (t, p) = (r.ttfts(), r.tpots());
        let actions: Vec<String> = r
            .actions
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        let rejected = match r.rejected() {
            0 => String::new(),
            n => format!(" ({n} rejected)"),
        };
        let _ = writeln!(
            s,
            "| {}{} | {} / {} / {} | {:.0} / {:.0} | {} / {} | {} ({}) | {} / {} / {} | {} | {} | {} | {} | {} |",
            r.policy,
            rejected,
            secs(percentile(&t, 0.5)),
            secs(percentile(&t, 0.95)),
            secs(percentile(&t, 0.99)),
            percentile(&p, 0.5) * 1e3,
            percentile(&p, 0.99) * 1e3,
            secs(mean(&r.session_e2e_s)),
            secs(percentile(&r.session_e2e_s, 0.99)),
            ratio(r.duplicate_factor),
            ratio(r.duplicate_factor_decoders),
            gb(r.kv_bytes.prefill_to_decode),
            gb(r.kv_bytes.fetch),
            gb(r.kv_bytes.migration),
            ratio(r.owner_hit_rate),
            ratio(r.decode_interference),
            pct(r.gpu_busy),
            reuse(r),
            actions.join(", "),
        );
    }
    s
}

/// One line for a terminal: the headline metrics of a run.
pub fn summary_line(r: &RunResult) -> String {
    let t = r.ttfts();
    format!(
        "{:<16} ttft p50 {:>7}s p99 {:>7}s  e2e mean {:>7}s  dup {:>5}  kv {:>7} GB  hit {:>5}  busy {:>4}  reuse {}  ({} steps, {:.2}s wall)",
        r.policy,
        secs(percentile(&t, 0.5)),
        secs(percentile(&t, 0.99)),
        secs(mean(&r.session_e2e_s)),
        ratio(r.duplicate_factor),
        gb(r.kv_bytes.total()),
        ratio(r.owner_hit_rate),
        pct(r.gpu_busy),
        reuse(r),
        r.steps.len(),
        r.wall_s,
    )
}
