//! Each system at its best fleet shape (`report --best-shape`): every policy runs on every
//! shape (clusters × host DRAM), and each is scored at the shape where its sessions finish
//! soonest (mean session E2E; ties: p99 TTFT). A win that comes from the shape a baseline was
//! given is not one: the headline compares best shape against best shape.

use std::fmt::Write as _;

use crate::sim::{mean, percentile, RunResult};

use super::matrix::is_baseline;

/// One policy at its best shape.
#[derive(Debug, Clone, PartialEq)]
pub struct BestCell {
    pub policy: String,
    pub shape: String,
    pub e2e_mean_s: f64,
    pub ttft_p99_s: f64,
    pub tpot_p99_s: f64,
    pub duplicate_factor: f64,
    pub kv_moved_gb: f64,
}

impl BestCell {
    fn of(shape: &str, r: &RunResult) -> Self {
        Self {
            policy: r.policy.clone(),
            shape: shape.to_owned(),
            e2e_mean_s: mean(&r.session_e2e_s),
            ttft_p99_s: percentile(&r.ttfts(), 0.99),
            tpot_p99_s: percentile(&r.tpots(), 0.99),
            duplicate_factor: r.duplicate_factor,
            kv_moved_gb: r.kv_bytes.total() as f64 / 1e9,
        }
    }

    /// Sooner sessions first, then the lower p99 TTFT; a run that served nothing (NaN)
    /// last.
    fn better_than(&self, other: &Self) -> bool {
        let key = |c: &Self| {
            (
                if c.e2e_mean_s.is_nan() {
                    f64::INFINITY
                } else {
                    c.e2e_mean_s
                },
                if c.ttft_p99_s.is_nan() {
                    f64::INFINITY
                } else {
                    c.ttft_p99_s
                },
            )
        };
        key(self) < key(other)
    }
}

/// Each policy's best cell over `cells` (shape, that shape's runs), in first-seen order.
pub fn best_cells(cells: &[(String, Vec<RunResult>)]) -> Vec<BestCell> {
    let mut best: Vec<BestCell> = Vec::new();
    for (shape, runs) in cells {
        for r in runs {
            let c = BestCell::of(shape, r);
            match best.iter_mut().find(|b| b.policy == c.policy) {
                Some(b) if c.better_than(b) => *b = c,
                Some(_) => {}
                None => best.push(c),
            }
        }
    }
    best
}

/// The best-shape table, then `ownerserve`'s ratios against the best baseline at its own
/// best shape.
pub fn markdown(best: &[BestCell]) -> String {
    let mut md = String::from(
        "| policy | best shape | session E2E mean (s) | p99 TTFT (s) | p99 TPOT (ms) | dup. factor | KV moved (GB) |\n|---|---|---:|---:|---:|---:|---:|\n",
    );
    for c in best {
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.2} | {:.0} | {:.2} | {:.1} |",
            c.policy,
            c.shape,
            c.e2e_mean_s,
            c.ttft_p99_s,
            c.tpot_p99_s * 1e3,
            c.duplicate_factor,
            c.kv_moved_gb
        );
    }
    let ours = best.iter().find(|c| c.policy == "ownerserve");
    let rival = best
        .iter()
        .filter(|c| is_baseline(&c.policy))
        .reduce(|a, b| if b.better_than(a) { b } else { a });
    if let (Some(o), Some(r)) = (ours, rival) {
        let _ = writeln!(
            md,
            "\n`ownerserve` at {} against the best baseline, `{}` at {}: session E2E {:.2}×, p99 TTFT {:.2}×.",
            o.shape,
            r.policy,
            r.shape,
            o.e2e_mean_s / r.e2e_mean_s,
            o.ttft_p99_s / r.ttft_p99_s
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(policy: &str, e2e: f64, ttft: f64) -> RunResult {
        RunResult {
            policy: policy.to_owned(),
            session_e2e_s: vec![e2e],
            steps: vec![crate::sim::StepRecord {
                session: 0,
                step: 0,
                issued_s: 0.0,
                ttft_s: ttft,
                tpot_s: 0.02,
                latency_s: ttft,
                prompt_tokens: 10,
                cached_tokens: 0,
                restored_tokens: 0,
                rejected: false,
                placement: Default::default(),
            }],
            duplicate_factor: 1.0,
            ..Default::default()
        }
    }

    #[test]
    fn each_policy_is_scored_at_its_own_best_shape() {
        let cells = vec![
            (
                "2p6d".to_owned(),
                vec![run("ownerserve", 100.0, 1.0), run("dynamo_kv", 150.0, 2.0)],
            ),
            (
                "8h".to_owned(),
                vec![run("ownerserve", 110.0, 0.5), run("dynamo_kv", 120.0, 2.0)],
            ),
            (
                "4p4d".to_owned(),
                vec![
                    run("ownerserve", 100.0, 0.8),
                    run("dynamo_kv", f64::NAN, 1.0),
                ],
            ),
        ];
        let best = best_cells(&cells);
        let shape = |p: &str| {
            best.iter()
                .find(|c| c.policy == p)
                .map(|c| c.shape.as_str())
        };
        // Ties on E2E go to the lower p99 TTFT; a run that served nothing never wins.
        assert_eq!(shape("ownerserve"), Some("4p4d"));
        assert_eq!(shape("dynamo_kv"), Some("8h"));
        let md = markdown(&best);
        assert!(
            md.contains("`ownerserve` at 4p4d against the best baseline, `dynamo_kv` at 8h: session E2E 0.83×, p99 TTFT 0.40×"),
            "{md}"
        );
    }
}
