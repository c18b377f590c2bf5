//! Stacked bar charts: one bar per category, stacked by part (e.g. KV bytes moved P→D, by
//! fetch and by migration, per policy).

use std::path::Path;

use plotters::prelude::{ChartBuilder, Color, Rectangle, BLACK, WHITE};

use super::axis::tick_label;
use super::canvas::{self, render_png, Area, DrawError};
use super::legend::{self, Swatch};
use super::slots::SlotAxis;
use super::{style, PlotError};

/// Fraction of each category's slot the bar fills.
const BAR_WIDTH: f64 = 0.6;

/// Stacked bars: one bar per category (e.g. policy), stacked by part (e.g. KV bytes P→D / fetch / migration).
///
/// `parts[j].1[i]` is the size of part `j` in category `i`; every part needs one value per
/// category ([`PlotError::LengthMismatch`] otherwise). Parts stack bottom-up in the given
/// order. NaN, infinite and negative values draw nothing. A chart with no categories, or
/// with only zero values, still gets its title.
pub fn stacked_bars_png(
    path: &Path,
    title: &str,
    y_label: &str,
    categories: &[&str],
    parts: &[(&str, &[f64])],
) -> Result<(), PlotError> {
    if let Some((part, values)) = parts.iter().find(|(_, v)| v.len() != categories.len()) {
        return Err(PlotError::LengthMismatch {
            part: (*part).to_owned(),
            expected: categories.len(),
            got: values.len(),
        });
    }
    let stacks = stack(categories.len(), parts);
    let top = stacks.iter().flatten().fold(0.0, |m: f64, s| m.max(s.1));
    render_png(path, title, |area| {
        draw(area, y_label, categories, parts, &stacks, top)?;
        if top > 0.0 {
            Ok(())
        } else {
            canvas::no_data(area)
        }
    })
}

/// For every part and category, the `(bottom, top)` of its segment.
fn stack(categories: usize, parts: &[(&str, &[f64])]) -> Vec<Vec<(f64, f64)>> {
    let mut heights = vec![0.0; categories];
    parts
        .iter()
        .map(|(_, values)| {
            values
                .iter()
                .zip(heights.iter_mut())
                .map(|(&value, height)| {
                    let bottom = *height;
                    if value.is_finite() && value > 0.0 {
                        *height += value;
                    }
                    (bottom, *height)
                })
                .collect()
        })
        .collect()
}

fn draw(
    area: &Area<'_>,
    y_label: &str,
    categories: &[&str],
    parts: &[(&str, &[f64])],
    stacks: &[Vec<(f64, f64)>],
    top: f64,
) -> Result<(), DrawError> {
    let (plot, legend_area) = legend::split(area, parts.iter().map(|(label, _)| *label))?;
    let x = SlotAxis::new(categories.len());
    let y_top = if top > 0.0 { top * 1.05 } else { 1.0 };
    let mut chart = ChartBuilder::on(&plot)
        .margin(16)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, 0.0..y_top)?;
    let category_name = |v: &f64| {
        let name = SlotAxis::slot_of(*v).and_then(|i| categories.get(i));
        name.map_or_else(String::new, |n| (*n).to_owned())
    };
    let value = |v: &f64| tick_label(*v);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .axis_desc_style(style::text(style::AXIS_DESC_PX))
        .label_style(style::text(style::LABEL_PX))
        .x_label_formatter(&category_name)
        .y_label_formatter(&value)
        .light_line_style(WHITE.mix(0.0))
        .bold_line_style(BLACK.mix(0.12))
        .draw()?;

    let half = BAR_WIDTH / 2.0;
    for (index, segments) in stacks.iter().enumerate() {
        let color = style::color(index);
        let bars = segments
            .iter()
            .enumerate()
            .filter(|(_, (bottom, top))| top > bottom)
            .map(|(slot, &(bottom, top))| {
                let centre = SlotAxis::centre(slot);
                Rectangle::new(
                    [(centre - half, bottom), (centre + half, top)],
                    color.filled(),
                )
            });
        chart.draw_series(bars)?;
    }
    if let Some(legend_area) = legend_area {
        // Top part first, so the legend reads in the same order as the stack.
        let entries: Vec<_> = parts
            .iter()
            .enumerate()
            .rev()
            .map(|(index, (label, _))| (*label, style::color(index)))
            .collect();
        legend::draw(&legend_area, &entries, Swatch::Block)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::png_check::{png_size, remove, temp_png};
    use super::*;

    #[test]
    fn parts_stack_bottom_up_and_skip_bad_values() {
        let a = [1.0, f64::NAN, 2.0];
        let b = [3.0, 4.0, -1.0];
        let stacks = stack(3, &[("a", &a), ("b", &b)]);
        let want = vec![
            vec![(0.0, 1.0), (0.0, 0.0), (0.0, 2.0)],
            vec![(1.0, 4.0), (0.0, 4.0), (2.0, 2.0)],
        ];
        assert_eq!(stacks, want);
    }

    #[test]
    fn bars_write_a_1000_by_600_png() {
        let path = temp_png("bars");
        let p2d = [4e9, 1e9, 2.5e9];
        let fetch = [0.0, 2e9, f64::NAN];
        let categories = ["round-robin", "kv-aware", "ownerserve"];
        let parts: [(&str, &[f64]); 2] = [("P→D", &p2d), ("fetch", &fetch)];
        stacked_bars_png(&path, "KV bytes", "bytes", &categories, &parts).expect("drawn");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn bars_of_nothing_still_write_a_png() {
        let path = temp_png("bars-empty");
        stacked_bars_png(&path, "empty", "bytes", &[], &[]).expect("no categories");
        assert_eq!(png_size(&path), (1000, 600));
        let nan = [f64::NAN];
        stacked_bars_png(&path, "nan", "bytes", &["a"], &[("nan", &nan)]).expect("nan");
        assert_eq!(png_size(&path), (1000, 600));
        remove(&path);
    }

    #[test]
    fn a_part_of_the_wrong_length_is_an_error() {
        let path = temp_png("bars-mismatch");
        let short = [1.0];
        let err = stacked_bars_png(&path, "t", "y", &["a", "b"], &[("short", &short)]);
        assert!(matches!(
            err,
            Err(PlotError::LengthMismatch {
                expected: 2,
                got: 1,
                ..
            })
        ));
        assert!(!path.exists(), "nothing written on error");
    }
}
