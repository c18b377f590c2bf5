//! PNG charts for the evaluation reports: CDFs, lines over time and stacked bars.
//!
//! Every chart is drawn by `plotters` into an in-memory RGB buffer and encoded with `png`
//! (see `canvas`), with text rendered from an embedded TTF by `ab_glyph` (see `font` and
//! `text_backend`), so a report renders identically on a fresh machine with no fonts
//! installed and the build needs no C code.
//!
//! # Layout
//! - `cdf`: [`cdf_png`] and the empirical-CDF / downsampling math behind it.
//! - `lines`: [`lines_png`].
//! - `bars`: [`stacked_bars_png`], on the categorical axis in `slots`.
//! - `legend`: the legend column right of the plot.
//! - `line_chart`: the axes and lines shared by the CDF and line charts.
//! - `canvas`: the shared frame (buffer, title, empty-chart placeholder, PNG encoding).
//! - `axis`: data ranges and tick-label formatting.
//! - `style`: palette and font sizes.
//! - `font`: the embedded font, parsed once.
//! - `text_backend`: the bitmap backend wrapper that draws text with that font.
//! - `error`: [`PlotError`].
//!
//! Inputs are tolerated rather than rejected where a report could reasonably produce them:
//! NaN (and infinite) values are skipped, and an empty chart still writes a PNG with its
//! title and a "no data" note. Only caller mistakes (mismatched lengths) are errors.
//!
//! This module must not compute report statistics; callers pass the numbers to draw.

mod axis;
mod bars;
mod canvas;
mod cdf;
mod error;
mod font;
mod legend;
mod line_chart;
mod lines;
mod slots;
mod style;
mod text_backend;

#[cfg(test)]
mod examples;
#[cfg(test)]
mod png_check;

pub use bars::stacked_bars_png;
pub use cdf::cdf_png;
pub use error::PlotError;
pub use lines::lines_png;

/// One named line of `(x, y)` points for [`lines_png`]; non-finite points break the line.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    /// Legend text.
    pub label: &'a str,
    /// Points in drawing order (normally ascending x).
    pub points: &'a [(f64, f64)],
}
