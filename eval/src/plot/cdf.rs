//! Empirical CDF charts: several samples on one chart, optionally on a log x axis.

use std::path::Path;

use plotters::coord::combinators::{IntoLogRange, LogCoord};
use plotters::coord::types::RangedCoordf64;

use super::axis::{decades, finite_bounds, padded};
use super::canvas::{self, render_png};
use super::line_chart::{self, Curve};
use super::PlotError;

/// Points drawn per curve at most: a 1000-px-wide chart shows no more, and drawing 100k
/// points per curve would dominate report time.
const MAX_POINTS: usize = 2_000;
/// The y axis description of every CDF.
const Y_DESC: &str = "fraction of samples ≤ x";

/// Empirical CDFs of several samples on one chart (x = value, y = fraction 0..1); log-x when `log_x`.
///
/// NaN and infinite values are skipped, and so are values `<= 0` on a log axis. Each sample
/// is drawn with at most 2,000 points. A chart with no drawable value still gets its title.
pub fn cdf_png(
    path: &Path,
    title: &str,
    x_label: &str,
    samples: &[(&str, &[f64])],
    log_x: bool,
) -> Result<(), PlotError> {
    let curves: Vec<Curve<'_>> = samples
        .iter()
        .map(|&(label, values)| Curve {
            label,
            runs: vec![downsample(&ecdf(values, log_x), MAX_POINTS)],
        })
        .collect();
    let xs = curves
        .iter()
        .flat_map(|c| c.runs.iter().flatten().map(|p| p.0));
    let bounds = finite_bounds(xs);
    render_png(path, title, |area| match bounds {
        None => {
            let x: RangedCoordf64 = (0.0..1.0).into();
            line_chart::draw(area, (x, x_label), (0.0..1.0, Y_DESC), &curves)?;
            canvas::no_data(area)
        }
        Some((lo, hi)) if log_x => {
            let (lo, hi) = decades(lo, hi);
            let x: LogCoord<f64> = (lo..hi).log_scale().into();
            line_chart::draw(area, (x, x_label), (0.0..1.0, Y_DESC), &curves)
        }
        Some((lo, hi)) => {
            let (lo, hi) = padded(lo, hi, 0.02);
            let x: RangedCoordf64 = (lo..hi).into();
            line_chart::draw(area, (x, x_label), (0.0..1.0, Y_DESC), &curves)
        }
    })
}

/// The empirical CDF of `values` as a step curve: for each sorted value `v` at rank `i` of
/// `n`, the points `(v, i/n)` and `(v, (i+1)/n)`. Non-finite values are dropped, and so are
/// values `<= 0` when `positive_only` (they have no place on a log axis).
fn ecdf(values: &[f64], positive_only: bool) -> Vec<(f64, f64)> {
    let mut sorted: Vec<f64> = values
        .iter()
        .copied()
        .filter(|v| v.is_finite() && (!positive_only || *v > 0.0))
        .collect();
    sorted.sort_unstable_by(f64::total_cmp);
    let n = sorted.len() as f64;
    sorted
        .iter()
        .enumerate()
        .flat_map(|(i, &v)| [(v, i as f64 / n), (v, (i + 1) as f64 / n)])
        .collect()
}

/// At most `max` points (never fewer than two) picked evenly by index; the first and the
/// last point are always kept.
fn downsample<T: Copy>(points: &[T], max: usize) -> Vec<T> {
    let max = max.max(2);
    if points.len() <= max {
        return points.to_vec();
    }
    let last = points.len() - 1;
    (0..max).map(|k| points[k * last / (max - 1)]).collect()
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::png_check::{png_size, remove, temp_png};
    use super::*;

    #[test]
    fn ecdf_is_a_step_curve_from_zero_to_one() {
        let curve = ecdf(&[3.0, f64::NAN, 1.0, 2.0], false);
        let third = 1.0 / 3.0;
        let want = [
            (1.0, 0.0),
            (1.0, third),
            (2.0, third),
            (2.0, 2.0 * third),
            (3.0, 2.0 * third),
            (3.0, 1.0),
        ];
        assert_eq!(curve, want);
    }

    #[test]
    fn ecdf_on_log_axis_drops_non_positive_values() {
        let curve = ecdf(&[0.0, -1.0, 10.0], true);
        assert_eq!(curve, [(10.0, 0.0), (10.0, 1.0)]);
    }

    #[test]
    fn downsampling_keeps_first_and_last_and_caps_the_count() {
        let points: Vec<u32> = (0..100_001).collect();
        let kept = downsample(&points, MAX_POINTS);
        assert_eq!(kept.len(), MAX_POINTS);
        assert_eq!(kept.first(), Some(&0));
        assert_eq!(kept.last(), Some(&100_000));
        assert!(kept.windows(2).all(|w| w[0] < w[1]), "order kept");
    }

    #[test]
    fn downsampling_leaves_short_inputs_alone() {
        assert_eq!(downsample(&[1, 2, 3], 5), [1, 2, 3]);
        assert_eq!(downsample::<u8>(&[], 5), Vec::<u8>::new());
    }

    #[test]
    fn cdf_writes_a_1000_by_600_png() {
        let path = temp_png("cdf");
        let a: Vec<f64> = (1..=500).map(f64::from).collect();
        let b = [5.0, f64::NAN, 50.0, 500.0];
        cdf_png(&path, "TTFT", "ms", &[("a", &a), ("b", &b)], false).expect("drawn");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn cdf_log_x_handles_zeros_and_nan() {
        let path = temp_png("cdf-log");
        let a = [0.0, 0.5, 3.0, 70.0, f64::NAN, 1e4];
        cdf_png(&path, "log", "ms", &[("a", &a)], true).expect("drawn");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn cdf_of_nothing_still_writes_a_png() {
        let path = temp_png("cdf-empty");
        cdf_png(&path, "empty", "ms", &[], false).expect("no series");
        assert_eq!(png_size(&path), (1000, 600));
        let nan_only = [f64::NAN; 3];
        cdf_png(
            &path,
            "nan",
            "ms",
            &[("nan", &nan_only), ("none", &[])],
            true,
        )
        .expect("nan");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn cdf_of_100k_samples_is_fast() {
        let path = temp_png("cdf-100k");
        let values: Vec<f64> = (0..100_000u32).map(|i| f64::from(i % 977) * 1.5).collect();
        let started = Instant::now();
        cdf_png(&path, "100k", "ms", &[("a", &values), ("b", &values)], true).expect("drawn");
        // Generous for an unoptimised test build on a busy 2-core machine.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }
}
