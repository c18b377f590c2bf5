//! The frame every chart shares: a white RGB buffer with the title on top, drawn by
//! `plotters` and written as PNG with the `png` crate.
//!
//! Encoding here rather than through `plotters`' `bitmap_encoder` feature keeps the `image`
//! crate (and its JPEG/BMP codecs) out of the build, which halves the added compile time.
//! Text goes through [`TextBackend`], which draws it with the embedded font.

use std::fs::{self, File};
use std::io::BufWriter;
use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::{
    BitMapBackend, DrawingArea, DrawingAreaErrorKind, DrawingBackend, IntoDrawingArea, Text, WHITE,
};
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::text_backend::TextBackend;
use super::{font, style, PlotError};

/// Chart width in pixels.
pub(super) const WIDTH: u32 = 1000;
/// Chart height in pixels.
pub(super) const HEIGHT: u32 = 600;

/// The area below the title that a chart draws on.
pub(super) type Area<'a> = DrawingArea<TextBackend<'a>, Shift>;
/// What a drawing step can fail with.
pub(super) type DrawError =
    DrawingAreaErrorKind<<TextBackend<'static> as DrawingBackend>::ErrorType>;

/// Draws the title, hands the rest of the canvas to `draw`, and writes the PNG to `path`
/// (creating its parent directory).
pub(super) fn render_png(
    path: &Path,
    title: &str,
    draw: impl FnOnce(&Area<'_>) -> Result<(), DrawError>,
) -> Result<(), PlotError> {
    let font = font::font()?;
    let mut rgb = vec![0u8; WIDTH as usize * HEIGHT as usize * 3];
    {
        let bitmap = BitMapBackend::with_buffer(&mut rgb, (WIDTH, HEIGHT));
        let root = TextBackend::new(bitmap, font).into_drawing_area();
        let (band, body) = root.split_vertically(style::TITLE_BAND_PX);
        let centre = (WIDTH as i32 / 2, style::TITLE_BAND_PX as i32 / 2);
        let title_style = style::text(style::TITLE_PX).pos(Pos::new(HPos::Center, VPos::Center));
        let drawn = root
            .fill(&WHITE)
            .and_then(|()| band.draw(&Text::new(title, centre, title_style)))
            .and_then(|()| draw(&body))
            .and_then(|()| root.present());
        drawn.map_err(|e| PlotError::Draw {
            path: path.to_owned(),
            source: Box::new(e),
        })?;
    }
    write_png(path, &rgb)
}

/// Writes "no data" in the middle of `area`, for charts whose inputs had no drawable value.
pub(super) fn no_data(area: &Area<'_>) -> Result<(), DrawError> {
    let (w, h) = area.dim_in_pixel();
    let centre = (w as i32 / 2, h as i32 / 2);
    let style = style::text(style::AXIS_DESC_PX).pos(Pos::new(HPos::Center, VPos::Center));
    area.draw(&Text::new("no data", centre, style))
}

fn write_png(path: &Path, rgb: &[u8]) -> Result<(), PlotError> {
    let io_err = |path: &Path| {
        let path = path.to_owned();
        move |source| PlotError::Io { path, source }
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let file = File::create(path).map_err(io_err(path))?;
    let mut encoder = png::Encoder::new(BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let encode_err = |source| PlotError::Encode {
        path: path.to_owned(),
        source,
    };
    let mut writer = encoder.write_header().map_err(encode_err)?;
    writer.write_image_data(rgb).map_err(encode_err)?;
    writer.finish().map_err(encode_err)
}
