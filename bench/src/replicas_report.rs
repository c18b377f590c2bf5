//! `bench replicas`' figures: what one router count measured ([`Sample`]), the figures
//! derived from it against the first count of the run, the baseline ([`Row`]), and the
//! Markdown table and verdict printed from them. Pure: no IO.
//!
//! Wall-clock throughput only scales with routers when each has a core of its own. The
//! figure that does not depend on the machine is the router CPU a request costs: with each
//! router on its own core, N routers serve N / (router CPU seconds per request), so the
//! scaling they would reach is N × (requests per router-CPU-second at N ÷ the same at the
//! baseline), and its share of linear is that ratio alone. The directory is shared: its
//! busiest node's CPU per request bounds what any number of routers can serve.

use crate::ownership_check::Verdict;

/// What one router count measured over its window.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub routers: usize,
    /// Steps answered 2xx, and not.
    pub requests: u64,
    pub errors: u64,
    /// Wall seconds of the window.
    pub secs: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// CPU seconds of every router process over the window.
    pub router_cpu_s: f64,
    /// CPU the routers used per second with no load (their timers, replicas, health checks
    /// and scrapes), all of them together, in cores.
    pub router_idle_cores: f64,
    /// CPU seconds of the directory's nodes over the window: all, and the busiest one.
    pub directory_cpu_s: f64,
    pub directory_busiest_cpu_s: f64,
    /// CPU seconds of the rest (the load generator and the workers).
    pub load_cpu_s: f64,
    /// Raft log entries the directory applied, and commands proposed through its nodes.
    pub log_entries: u64,
    pub commands: u64,
    /// The routers' owner claims: won, lost to another router, failed.
    pub claims: [u64; 3],
    /// Sessions some of whose steps went to another router than the rest.
    pub cross_sessions: usize,
    pub ownership: Verdict,
}

/// A sample's derived figures and its ratios to the baseline.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub routers: usize,
    pub rps: f64,
    pub rps_per_router: f64,
    /// Router CPU milliseconds per request, and requests per router-CPU-second.
    pub router_cpu_ms: f64,
    pub per_router_cpu_s: f64,
    /// Share of the wall time the routers kept one core busy (1.0: one core's worth).
    pub router_cores: f64,
    /// Router CPU milliseconds per request less what the routers use idle.
    pub router_busy_cpu_ms: f64,
    pub directory_cpu_ms: f64,
    /// Requests per second the busiest directory node could take on one core.
    pub directory_ceiling_rps: f64,
    pub log_entries_per_request: f64,
    pub commands_per_request: f64,
    /// Total req/s ÷ the baseline's.
    pub throughput_ratio: f64,
    /// Requests per router-CPU-second ÷ the baseline's: the share of linear scaling the
    /// routers would reach on cores of their own.
    pub efficiency: f64,
    /// (routers ÷ the baseline's) × `efficiency`: the scaling on cores of their own.
    pub projected: f64,
}

fn per(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// Each sample's row, its ratios against the first sample's.
pub fn rows(samples: &[Sample]) -> Vec<Row> {
    let derive = |s: &Sample| {
        let n = s.requests as f64;
        Row {
            routers: s.routers,
            rps: per(n, s.secs),
            rps_per_router: per(n, s.secs * s.routers as f64),
            router_cpu_ms: per(s.router_cpu_s * 1e3, n),
            per_router_cpu_s: per(n, s.router_cpu_s),
            router_cores: per(s.router_cpu_s, s.secs),
            router_busy_cpu_ms: per((s.router_cpu_s - s.router_idle_cores * s.secs) * 1e3, n),
            directory_cpu_ms: per(s.directory_cpu_s * 1e3, n),
            directory_ceiling_rps: per(n, s.directory_busiest_cpu_s),
            log_entries_per_request: per(s.log_entries as f64, n),
            commands_per_request: per(s.commands as f64, n),
            throughput_ratio: 1.0,
            efficiency: 1.0,
            projected: 1.0,
        }
    };
    let Some(base) = samples.first().map(derive) else {
        return Vec::new();
    };
    samples
        .iter()
        .map(|s| {
            let mut r = derive(s);
            r.throughput_ratio = per(r.rps, base.rps);
            r.efficiency = per(r.per_router_cpu_s, base.per_router_cpu_s);
            r.projected = per(r.routers as f64, base.routers as f64) * r.efficiency;
            r
        })
        .collect()
}

/// The lowest share of linear scaling the issue asks for.
pub const TARGET_EFFICIENCY: f64 = 0.9;

/// The table (Markdown) of `samples`, one line each; the first is the baseline.
pub fn table(samples: &[Sample]) -> Vec<String> {
    let mut out = vec![
        "| routers | req/s | req/s per router | p50 / p99 ms | router CPU ms/req | less idle ms/req | req per router-CPU-s | router cores busy | directory CPU ms/req | directory ceiling req/s | log entries / commands per req | claims won / lost / failed | throughput vs base | per-router-CPU vs base | projected scaling (own cores) | sessions (cross-router) | split / disagree / unfenced steps |".to_owned(),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|".to_owned(),
    ];
    for (s, r) in samples.iter().zip(rows(samples)) {
        out.push(format!(
            "| {} | {:.0} | {:.0} | {:.2} / {:.2} | {:.3} | {:.3} | {:.0} | {:.2} | {:.3} | {:.0} | {:.3} / {:.3} | {} / {} / {} | {:.2}x | {:.2}x | {:.2}x of {:.0}x | {} ({}) | {} / {} / {} |",
            r.routers,
            r.rps,
            r.rps_per_router,
            s.p50_ms,
            s.p99_ms,
            r.router_cpu_ms,
            r.router_busy_cpu_ms,
            r.per_router_cpu_s,
            r.router_cores,
            r.directory_cpu_ms,
            r.directory_ceiling_rps,
            r.log_entries_per_request,
            r.commands_per_request,
            s.claims[0],
            s.claims[1],
            s.claims[2],
            r.throughput_ratio,
            r.efficiency,
            r.projected,
            per(r.routers as f64, samples[0].routers as f64),
            s.ownership.sessions,
            s.cross_sessions,
            s.ownership.split,
            s.ownership.directory_disagrees,
            s.ownership.unfenced_steps,
        ));
    }
    out
}

/// The verdict lines: scaling against the target and ownership.
pub fn verdict(samples: &[Sample]) -> Vec<String> {
    let rows = rows(samples);
    let mut out = Vec::new();
    let worst = rows
        .iter()
        .skip(1)
        .map(|r| r.efficiency)
        .fold(f64::INFINITY, f64::min);
    if worst.is_finite() {
        out.push(format!(
            "scaling on cores of their own (per-router-CPU throughput vs base): worst {worst:.2}x of linear, target >= {TARGET_EFFICIENCY:.1}x: {}",
            if worst >= TARGET_EFFICIENCY { "met" } else { "NOT met" }
        ));
    }
    let errors: u64 = samples.iter().map(|s| s.errors).sum();
    let split: usize = samples.iter().map(|s| s.ownership.split).sum();
    let disagree: usize = samples
        .iter()
        .map(|s| s.ownership.directory_disagrees)
        .sum();
    out.push(format!(
        "ownership: {split} sessions served by two workers without a new epoch, {disagree} the directory disagrees with (must be 0 and 0): {}; {errors} failed steps",
        if split == 0 && disagree == 0 { "held" } else { "NOT held" }
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(routers: usize, requests: u64, router_cpu_s: f64) -> Sample {
        Sample {
            routers,
            requests,
            errors: 0,
            secs: 10.0,
            p50_ms: 1.0,
            p99_ms: 2.0,
            router_cpu_s,
            router_idle_cores: 0.1,
            directory_cpu_s: 2.0,
            directory_busiest_cpu_s: 1.0,
            load_cpu_s: 9.0,
            log_entries: requests / 10,
            commands: requests / 4,
            claims: [0, 0, 0],
            cross_sessions: 0,
            ownership: Verdict::default(),
        }
    }

    #[test]
    fn ratios_are_against_the_first_sample() {
        // Twice the routers, the same wall throughput, 10% more router CPU per request.
        let rows = rows(&[sample(1, 10_000, 10.0), sample(2, 10_000, 11.0)]);
        let (base, two) = (rows[0], rows[1]);
        assert_eq!(
            (base.throughput_ratio, base.efficiency, base.projected),
            (1.0, 1.0, 1.0)
        );
        assert_eq!(base.rps, 1000.0);
        assert_eq!(base.router_cpu_ms, 1.0);
        assert!((base.router_busy_cpu_ms - 0.9).abs() < 1e-12);
        assert_eq!(base.per_router_cpu_s, 1000.0);
        assert_eq!(base.directory_ceiling_rps, 10_000.0);
        assert_eq!(base.log_entries_per_request, 0.1);
        assert_eq!(two.rps_per_router, 500.0);
        assert_eq!(two.throughput_ratio, 1.0);
        assert!((two.efficiency - 10.0 / 11.0).abs() < 1e-12);
        assert!((two.projected - 20.0 / 11.0).abs() < 1e-12);
    }

    #[test]
    fn a_baseline_of_two_routers_makes_four_linear_at_twice() {
        let rows = rows(&[sample(2, 10_000, 10.0), sample(4, 20_000, 20.0)]);
        assert_eq!((rows[1].efficiency, rows[1].projected), (1.0, 2.0));
    }

    #[test]
    fn the_verdict_names_the_worst_efficiency_and_any_split() {
        let mut four = sample(4, 10_000, 12.5);
        four.ownership.split = 1;
        let lines = verdict(&[sample(1, 10_000, 10.0), sample(2, 10_000, 10.5), four]);
        assert!(lines[0].contains("worst 0.80x"), "{}", lines[0]);
        assert!(lines[0].ends_with("NOT met"));
        assert!(lines[1].starts_with("ownership: 1 sessions"));
        assert!(lines[1].contains("NOT held"));
    }

    #[test]
    fn the_table_has_a_row_per_sample_with_every_column() {
        let t = table(&[sample(1, 10_000, 10.0), sample(2, 10_000, 10.0)]);
        assert_eq!(t.len(), 4);
        let columns = t[0].matches('|').count();
        assert!(t.iter().all(|l| l.matches('|').count() == columns));
        assert!(t[3].starts_with("| 2 | 1000 | 500 |"), "{}", t[3]);
    }

    #[test]
    fn nothing_measured_gives_no_rows() {
        assert!(rows(&[]).is_empty());
        assert!(rows(&[sample(1, 0, 0.0)])[0].router_cpu_ms.is_nan());
    }
}
