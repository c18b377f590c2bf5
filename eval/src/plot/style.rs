//! Colours and text sizes shared by every chart, so the reports look like one family.

use plotters::style::{FontDesc, FontFamily, FontStyle, RGBColor, TextStyle, BLACK};

/// Tableau 10: distinguishable for up to ten series, including in greyscale print.
const PALETTE: [RGBColor; 10] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
];

/// Height of the band above the chart that holds the title, in pixels.
pub(super) const TITLE_BAND_PX: u32 = 48;
/// Title text height in pixels.
pub(super) const TITLE_PX: f64 = 26.0;
/// Axis description ("latency (ms)") height in pixels.
pub(super) const AXIS_DESC_PX: f64 = 18.0;
/// Tick label and legend text height in pixels.
pub(super) const LABEL_PX: f64 = 15.0;
/// Stroke width of data lines in pixels.
pub(super) const LINE_PX: u32 = 2;

/// The colour of the `index`-th series; the palette repeats after ten.
pub(super) fn color(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// Black text at `size_px` (the family is nominal: `TextBackend` draws every text with the
/// embedded font).
pub(super) fn text(size_px: f64) -> TextStyle<'static> {
    TextStyle::from(FontDesc::new(
        FontFamily::SansSerif,
        size_px,
        FontStyle::Normal,
    ))
    .color(&BLACK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_ten_colours_are_distinct_then_repeat() {
        let first: Vec<RGBColor> = (0..10).map(color).collect();
        for (i, a) in first.iter().enumerate() {
            for b in &first[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(color(10), color(0));
    }
}
