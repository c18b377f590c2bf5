//! A `plotters` bitmap backend whose text comes from the embedded font via `ab_glyph`.
//!
//! Why not `plotters`' own font features: `ttf` needs font-kit, i.e. fontconfig/freetype C
//! builds and fonts installed at run time; its `ab_glyph` feature avoids both, but (as of
//! 0.3.7) drops each glyph's left side bearing and anchors text about a quarter em too high,
//! so "TTFT" prints as "TTF T" and tick labels float above their ticks. Wrapping the bitmap
//! backend and overriding only `draw_text` / `estimate_text_size` fixes both with plain
//! `ab_glyph` layout; every shape still goes to `BitMapBackend` unchanged.

use ab_glyph::{Font, FontRef, Glyph, PxScale, ScaleFont};
use plotters::prelude::BitMapBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingBackend, DrawingErrorKind,
};

/// `BitMapBackend` plus text rendering from one font.
pub(super) struct TextBackend<'a> {
    inner: BitMapBackend<'a>,
    font: &'static FontRef<'static>,
}

impl<'a> TextBackend<'a> {
    /// Draws shapes through `inner` and text with `font`.
    pub(super) fn new(inner: BitMapBackend<'a>, font: &'static FontRef<'static>) -> Self {
        Self { inner, font }
    }
}

/// Glyphs of one line of text, positioned with the line box's top-left at the origin.
struct Line {
    glyphs: Vec<Glyph>,
    width: f32,
    height: f32,
}

fn lay_out(font: &FontRef<'static>, size_px: f64, text: &str) -> Line {
    let scaled = font.as_scaled(PxScale::from(size_px as f32));
    let mut caret = 0.0f32;
    let mut previous = None;
    let mut glyphs = Vec::with_capacity(text.len());
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(previous) = previous {
            caret += scaled.kern(previous, id);
        }
        glyphs.push(id.with_scale_and_position(scaled.scale(), (caret, scaled.ascent())));
        caret += scaled.h_advance(id);
        previous = Some(id);
    }
    Line {
        glyphs,
        width: caret,
        height: scaled.ascent() - scaled.descent(),
    }
}

type Error<'a> = DrawingErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

impl<'a> DrawingBackend for TextBackend<'a> {
    type ErrorType = <BitMapBackend<'a> as DrawingBackend>::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), Error<'a>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), Error<'a>> {
        self.inner.present()
    }

    fn draw_pixel(&mut self, point: BackendCoord, color: BackendColor) -> Result<(), Error<'a>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), Error<'a>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), Error<'a>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), Error<'a>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), Error<'a>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let line = lay_out(self.font, style.size(), text);
        let anchor = style.anchor();
        let dx = match anchor.h_pos {
            HPos::Left => 0.0,
            HPos::Center => -line.width / 2.0,
            HPos::Right => -line.width,
        };
        let dy = match anchor.v_pos {
            VPos::Top => 0.0,
            VPos::Center => -line.height / 2.0,
            VPos::Bottom => -line.height,
        };
        let transform = style.transform();
        let mut result = Ok(());
        for mut glyph in line.glyphs {
            // Shifting before outlining lets ab_glyph place the sub-pixel offset, so every
            // pixel of a glyph lands on an integer position (rounding per pixel tears rows).
            glyph.position.x += dx;
            glyph.position.y += dy;
            let Some(outline) = self.font.outline_glyph(glyph) else {
                continue; // whitespace
            };
            let bounds = outline.px_bounds();
            let (left, top) = (bounds.min.x as i32, bounds.min.y as i32);
            outline.draw(|x, y, coverage| {
                if coverage <= 0.0 || result.is_err() {
                    return;
                }
                let (lx, ly) = (left + x as i32, top + y as i32);
                let (rx, ry) = transform.transform(lx, ly);
                let pixel = BackendColor {
                    alpha: color.alpha * f64::from(coverage.min(1.0)),
                    rgb: color.rgb,
                };
                result = self.inner.draw_pixel((pos.0 + rx, pos.1 + ry), pixel);
            });
            if result.is_err() {
                break;
            }
        }
        result
    }

    fn estimate_text_size<S: BackendTextStyle>(
        &self,
        text: &str,
        style: &S,
    ) -> Result<(u32, u32), Error<'a>> {
        let line = lay_out(self.font, style.size(), text);
        Ok((line.width.ceil() as u32, line.height.ceil() as u32))
    }
}

#[cfg(test)]
mod tests {
    use plotters::prelude::{IntoDrawingArea, Text, WHITE};
    use plotters::style::text_anchor::{HPos, Pos, VPos};

    use super::*;
    use crate::plot::{font, style};

    /// Bounding box `(x0, y0, x1, y1)` of the non-white pixels of an RGB buffer.
    fn ink_box(rgb: &[u8], width: usize) -> (usize, usize, usize, usize) {
        let mut ink = rgb
            .chunks(3)
            .enumerate()
            .filter(|(_, px)| px.iter().any(|&c| c < 128))
            .map(|(i, _)| (i % width, i / width));
        let first = ink.next().expect("some text was drawn");
        ink.fold(
            (first.0, first.1, first.0, first.1),
            |(x0, y0, x1, y1), (x, y)| (x0.min(x), y0.min(y), x1.max(x), y1.max(y)),
        )
    }

    #[test]
    fn centred_text_is_centred_on_its_anchor() {
        let font = font::font().expect("font");
        let mut rgb = vec![0u8; 200 * 100 * 3];
        {
            let backend = TextBackend::new(BitMapBackend::with_buffer(&mut rgb, (200, 100)), font);
            let area = backend.into_drawing_area();
            area.fill(&WHITE).expect("fill");
            let centred = style::text(30.0).pos(Pos::new(HPos::Center, VPos::Center));
            area.draw(&Text::new("HIH", (100, 50), centred))
                .expect("draw");
            area.present().expect("present");
        }
        let (x0, y0, x1, y1) = ink_box(&rgb, 200);
        // Capitals sit above the baseline, so "centred" means the line box, not the ink:
        // allow a few pixels vertically, but no quarter-em drift.
        assert!((x0 + x1).abs_diff(200) <= 4, "x span {x0}..{x1}");
        assert!((y0 + y1).abs_diff(100) <= 8, "y span {y0}..{y1}");
    }

    #[test]
    fn layout_keeps_side_bearings_so_uppercase_is_evenly_spaced() {
        let font = font::font().expect("font");
        let one = lay_out(font, 20.0, "T");
        let four = lay_out(font, 20.0, "TTTT");
        assert!((four.width - 4.0 * one.width).abs() < 1.0);
        assert!(one.height > 20.0 * 0.9 && one.height < 20.0 * 1.5);
    }
}
