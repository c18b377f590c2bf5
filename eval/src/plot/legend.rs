//! The legend: a column to the right of the plot, so it never hides data however many
//! series there are. Drawn here rather than by `plotters`, whose legend box sizes its text
//! with a font estimator that ignores the backend that actually draws it.

use plotters::prelude::{Color, PathElement, RGBColor, Rectangle, Text};
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::canvas::{Area, DrawError};
use super::style;

/// Space left of the swatch, in pixels.
const PAD_PX: i32 = 12;
/// Swatch width, and the gap between swatch and text, in pixels.
const SWATCH_PX: i32 = 24;
const GAP_PX: i32 = 8;
/// Height of one legend row, in pixels.
const ROW_PX: i32 = 24;
/// Top of the first row: level with the top of the plot (the chart's margin).
const TOP_PX: i32 = 16;
/// The legend column never takes more than this share of the width.
const MAX_SHARE: f64 = 0.35;

/// How an entry's colour sample looks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Swatch {
    /// A short thick line, for line charts.
    Line,
    /// A filled square, for bars.
    Block,
}

/// Splits `area` into the chart's part and, when there are labels, a legend column wide
/// enough for the longest one.
pub(super) fn split<'a, 'l>(
    area: &Area<'a>,
    labels: impl IntoIterator<Item = &'l str>,
) -> Result<(Area<'a>, Option<Area<'a>>), DrawError> {
    let text = style::text(style::LABEL_PX);
    let mut widest = None;
    for label in labels {
        let (w, _) = area.estimate_text_size(label, &text)?;
        widest = widest.max(Some(w));
    }
    let Some(widest) = widest else {
        return Ok((area.clone(), None));
    };
    let (total, _) = area.dim_in_pixel();
    let wanted = (PAD_PX + SWATCH_PX + GAP_PX + PAD_PX) as u32 + widest;
    let column = wanted.min((f64::from(total) * MAX_SHARE) as u32);
    let (chart, legend) = area.split_horizontally(total - column);
    Ok((chart, Some(legend)))
}

/// Draws one row per `(label, colour)` from the top of `area`.
pub(super) fn draw(
    area: &Area<'_>,
    entries: &[(&str, RGBColor)],
    swatch: Swatch,
) -> Result<(), DrawError> {
    let text = style::text(style::LABEL_PX).pos(Pos::new(HPos::Left, VPos::Center));
    for (row, (label, color)) in entries.iter().enumerate() {
        let y = TOP_PX + ROW_PX / 2 + ROW_PX * row as i32;
        let (x0, x1) = (PAD_PX, PAD_PX + SWATCH_PX);
        match swatch {
            Swatch::Line => {
                area.draw(&PathElement::new([(x0, y), (x1, y)], color.stroke_width(3)))?
            }
            Swatch::Block => {
                let half = 7;
                let square = [(x1 - 2 * half, y - half), (x1, y + half)];
                area.draw(&Rectangle::new(square, color.filled()))?;
            }
        }
        area.draw(&Text::new(*label, (x1 + GAP_PX, y), text.clone()))?;
    }
    Ok(())
}
