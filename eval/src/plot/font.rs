//! The chart font: DejaVu Sans, embedded in the binary and parsed once per process.
//!
//! Embedded so that charts depend on nothing outside the binary: no fonts need be installed
//! and nothing is looked up through fontconfig. License: `eval/assets/README.md`.

use std::sync::OnceLock;

use ab_glyph::FontRef;

use super::PlotError;

static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/DejaVuSans.ttf");

/// The parsed font; every call after the first returns the same outcome.
pub(super) fn font() -> Result<&'static FontRef<'static>, PlotError> {
    static PARSED: OnceLock<Option<FontRef<'static>>> = OnceLock::new();
    PARSED
        .get_or_init(|| FontRef::try_from_slice(DEJAVU_SANS).ok())
        .as_ref()
        .ok_or(PlotError::Font)
}

#[cfg(test)]
mod tests {
    use ab_glyph::Font;

    use super::*;

    #[test]
    fn embedded_font_parses_and_covers_the_labels_we_use() {
        let font = font().expect("embedded font parses");
        for c in "Az09.,%()≤→≈-".chars() {
            assert_ne!(font.glyph_id(c).0, 0, "no glyph for {c:?}");
        }
    }
}
