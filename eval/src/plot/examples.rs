//! `cargo test -p ownerserve-eval write_examples -- --ignored` writes one chart of each kind
//! to `<temp dir>/plot-examples/`, for looking at them after a change to the drawing code.

use super::{cdf_png, lines_png, stacked_bars_png, Series};

/// Deterministic log-normal-ish samples (no RNG crate needed for a picture).
fn latencies(count: usize, median_ms: f64, spread: f64, seed: u64) -> Vec<f64> {
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..count)
        .map(|_| {
            // Box-Muller.
            let normal = (-2.0 * uniform().ln()).sqrt() * (std::f64::consts::TAU * uniform()).cos();
            median_ms * (spread * normal).exp()
        })
        .collect()
}

#[test]
#[ignore = "writes example PNGs for a human to look at"]
fn write_examples() {
    let dir = std::env::temp_dir().join("plot-examples");
    let rr = latencies(100_000, 180.0, 0.9, 1);
    let kv = latencies(100_000, 120.0, 0.7, 2);
    let ours = latencies(100_000, 70.0, 0.5, 3);
    let samples: [(&str, &[f64]); 3] = [
        ("round-robin", &rr),
        ("kv-aware", &kv),
        ("ownerserve", &ours),
    ];
    cdf_png(
        &dir.join("cdf-log.png"),
        "Time to first token (100k requests)",
        "TTFT (ms)",
        &samples,
        true,
    )
    .expect("cdf log");
    cdf_png(
        &dir.join("cdf-linear.png"),
        "Time to first token",
        "TTFT (ms)",
        &samples,
        false,
    )
    .expect("cdf linear");

    let lines: Vec<Vec<(f64, f64)>> = (0..10)
        .map(|k| {
            (0..=120)
                .map(|t| {
                    let t = f64::from(t);
                    let y = 1.0 + f64::from(k) * 0.15 + 0.3 * (t / 15.0 + f64::from(k)).sin();
                    (
                        t * 5.0,
                        if k == 3 && (40.0..50.0).contains(&t) {
                            f64::NAN
                        } else {
                            y
                        },
                    )
                })
                .collect()
        })
        .collect();
    let names = [
        "round-robin",
        "kv-aware",
        "ownerserve",
        "gap at t≈200s",
        "p5",
        "p6",
        "p7",
        "p8",
        "p9",
        "p10",
    ];
    let series: Vec<Series<'_>> = names
        .iter()
        .zip(&lines)
        .map(|(label, points)| Series { label, points })
        .collect();
    lines_png(
        &dir.join("lines.png"),
        "HBM duplicate factor over time",
        "time (s)",
        "duplicate factor",
        &series,
    )
    .expect("lines");

    let categories = [
        "round-robin",
        "kv-aware",
        "ownerserve",
        "ownerserve (no migration)",
    ];
    let p2d = [42e9, 40e9, 38e9, 38e9];
    let fetch = [0.0, 12e9, 3.5e9, 9e9];
    let migration = [0.0, 0.0, 1.2e9, f64::NAN];
    let parts: [(&str, &[f64]); 3] = [("P→D", &p2d), ("fetch", &fetch), ("migration", &migration)];
    stacked_bars_png(
        &dir.join("bars.png"),
        "KV bytes moved per policy",
        "bytes",
        &categories,
        &parts,
    )
    .expect("bars");

    cdf_png(
        &dir.join("empty.png"),
        "A chart with no data",
        "TTFT (ms)",
        &[("none", &[])],
        true,
    )
    .expect("empty");
}
