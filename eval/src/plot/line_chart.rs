//! The line chart both [`cdf_png`](super::cdf_png) and [`lines_png`](super::lines_png) draw:
//! labelled axes, a light grid, one coloured line per curve and a legend. Generic over the
//! x coordinate so the CDF can use a log axis with the same code.

use std::ops::Range;

use plotters::coord::ranged1d::{Ranged, ValueFormatter};
use plotters::prelude::{ChartBuilder, Circle, Color, LineSeries, BLACK, WHITE};

use super::axis::tick_label;
use super::canvas::{Area, DrawError};
use super::legend::{self, Swatch};
use super::style;

/// One legend entry: its label and the unbroken runs of points to draw.
pub(super) struct Curve<'a> {
    /// Legend text.
    pub label: &'a str,
    /// Runs of finite points; a gap between runs is not drawn.
    pub runs: Vec<Vec<(f64, f64)>>,
}

/// Draws `curves` on `area` over `x` and `y`, with axis descriptions `x_desc` and `y_desc`.
pub(super) fn draw<X>(
    area: &Area<'_>,
    (x, x_desc): (X, &str),
    (y, y_desc): (Range<f64>, &str),
    curves: &[Curve<'_>],
) -> Result<(), DrawError>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let (plot, legend_area) = legend::split(area, curves.iter().map(|c| c.label))?;
    let mut chart = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    let format = |v: &f64| tick_label(*v);
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .axis_desc_style(style::text(style::AXIS_DESC_PX))
        .label_style(style::text(style::LABEL_PX))
        .x_label_formatter(&format)
        .y_label_formatter(&format)
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;

    for (index, curve) in curves.iter().enumerate() {
        let color = style::color(index);
        let line = color.stroke_width(style::LINE_PX);
        let runs = curve.runs.iter().filter(|run| run.len() > 1);
        chart.draw_series(runs.flat_map(|run| LineSeries::new(run.iter().copied(), line)))?;
        // A lone point between gaps would otherwise vanish.
        let lone = curve.runs.iter().filter(|run| run.len() == 1);
        chart.draw_series(lone.map(|run| Circle::new(run[0], 3, color.filled())))?;
    }
    if let Some(legend_area) = legend_area {
        let entries: Vec<_> = curves
            .iter()
            .enumerate()
            .map(|(index, curve)| (curve.label, style::color(index)))
            .collect();
        legend::draw(&legend_area, &entries, Swatch::Line)?;
    }
    Ok(())
}
