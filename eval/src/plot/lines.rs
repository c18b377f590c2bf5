//! Line charts over a shared x axis, e.g. the HBM duplicate factor over time per policy.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;

use super::axis::{finite_bounds, padded};
use super::canvas::{self, render_png};
use super::line_chart::{self, Curve};
use super::{PlotError, Series};

/// Lines over x (e.g. HBM duplicate factor over time, one line per policy).
///
/// A point with a NaN or infinite coordinate is skipped and breaks its line there; a point
/// left alone between two breaks is drawn as a dot. A chart with no finite point still gets
/// its title and legend.
pub fn lines_png(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series<'_>],
) -> Result<(), PlotError> {
    let curves: Vec<Curve<'_>> = series
        .iter()
        .map(|s| Curve {
            label: s.label,
            runs: finite_runs(s.points),
        })
        .collect();
    let points = || curves.iter().flat_map(|c| c.runs.iter().flatten());
    let x_bounds = finite_bounds(points().map(|p| p.0));
    let y_bounds = finite_bounds(points().map(|p| p.1));
    render_png(path, title, |area| match x_bounds.zip(y_bounds) {
        None => {
            let x: RangedCoordf64 = (0.0..1.0).into();
            line_chart::draw(area, (x, x_label), (0.0..1.0, y_label), &curves)?;
            canvas::no_data(area)
        }
        Some(((x_lo, x_hi), (y_lo, y_hi))) => {
            let (x_lo, x_hi) = padded(x_lo, x_hi, 0.0);
            let (y_lo, y_hi) = padded(y_lo, y_hi, 0.05);
            let x: RangedCoordf64 = (x_lo..x_hi).into();
            line_chart::draw(area, (x, x_label), (y_lo..y_hi, y_label), &curves)
        }
    })
}

/// Splits `points` into runs of consecutive finite points, dropping the non-finite ones.
fn finite_runs(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|(x, y)| !(x.is_finite() && y.is_finite()))
        .filter(|run| !run.is_empty())
        .map(<[_]>::to_vec)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::png_check::{png_size, remove, temp_png};
    use super::*;

    #[test]
    fn nan_points_break_the_line() {
        let nan = f64::NAN;
        let points = [(0.0, 1.0), (1.0, nan), (2.0, 2.0), (3.0, 3.0), (nan, 0.0)];
        let runs = finite_runs(&points);
        assert_eq!(runs, vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]);
    }

    #[test]
    fn lines_write_a_1000_by_600_png() {
        let path = temp_png("lines");
        let a = [
            (0.0, 1.0),
            (10.0, 1.4),
            (20.0, f64::NAN),
            (30.0, 1.2),
            (40.0, 1.1),
        ];
        let b = [(0.0, 2.0), (40.0, 2.0)];
        let series = [
            Series {
                label: "a",
                points: &a,
            },
            Series {
                label: "b",
                points: &b,
            },
        ];
        lines_png(&path, "dup", "t (s)", "factor", &series).expect("drawn");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn lines_of_nothing_or_only_nan_still_write_a_png() {
        let path = temp_png("lines-empty");
        lines_png(&path, "empty", "x", "y", &[]).expect("no series");
        assert_eq!(png_size(&path), (1000, 600));
        let nan = [(f64::NAN, 1.0), (2.0, f64::NAN)];
        let series = [
            Series {
                label: "nan",
                points: &nan,
            },
            Series {
                label: "none",
                points: &[],
            },
        ];
        lines_png(&path, "nan", "x", "y", &series).expect("nan only");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn a_single_point_or_flat_line_gets_a_non_empty_range() {
        let path = temp_png("lines-flat");
        let one = [(5.0, 5.0)];
        lines_png(
            &path,
            "one",
            "x",
            "y",
            &[Series {
                label: "one",
                points: &one,
            }],
        )
        .expect("one");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }
}
