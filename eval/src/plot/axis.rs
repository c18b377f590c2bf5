//! Data ranges and tick labels: pure helpers that keep odd inputs (one value, huge values,
//! float noise) from producing degenerate axes or unreadable labels.

/// Smallest and largest finite value, or `None` when there is none.
pub(super) fn finite_bounds(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
        })
}

/// Widens `lo..hi` by `frac` of its span on each side; a zero span gets a unit-sized margin.
pub(super) fn padded(lo: f64, hi: f64, frac: f64) -> (f64, f64) {
    let span = hi - lo;
    if span > 0.0 {
        (lo - span * frac, hi + span * frac)
    } else {
        let margin = if lo == 0.0 { 1.0 } else { lo.abs() * 0.1 };
        (lo - margin, hi + margin)
    }
}

/// Rounds positive `lo..hi` out to whole decades, so a log axis always shows labelled ticks.
pub(super) fn decades(lo: f64, hi: f64) -> (f64, f64) {
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    if hi > lo {
        (lo, hi)
    } else {
        (lo, lo * 10.0)
    }
}

/// A short tick label: at most four significant digits, SI suffixes from 10,000 up
/// (`12.5k`, `3M`, `1.2G`), exponent form for tiny values, and no float noise
/// (`0.30000000000000004` prints as `0.3`).
pub(super) fn tick_label(value: f64) -> String {
    const SI: [(f64, &str); 5] = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")];
    let magnitude = value.abs();
    if !value.is_finite() || magnitude == 0.0 {
        return if value.is_finite() {
            "0".to_owned()
        } else {
            value.to_string()
        };
    }
    if magnitude >= 1e4 {
        for (scale, suffix) in SI {
            if magnitude >= scale {
                return format!("{}{suffix}", significant(value / scale, 3));
            }
        }
    }
    if magnitude < 1e-3 {
        return format!("{value:.1e}").replace(".0e", "e");
    }
    significant(value, 4)
}

/// `value` with `digits` significant digits and trailing zeros trimmed.
fn significant(value: f64, digits: i32) -> String {
    let exponent = value.abs().log10().floor() as i32;
    let decimals = (digits - 1 - exponent).max(0) as usize;
    let text = format!("{value:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_skip_nan_and_infinity() {
        let values = [f64::NAN, 3.0, f64::INFINITY, -1.0, 2.0];
        assert_eq!(finite_bounds(values), Some((-1.0, 3.0)));
        assert_eq!(finite_bounds([f64::NAN]), None);
        assert_eq!(finite_bounds([]), None);
    }

    #[test]
    fn padding_never_yields_an_empty_range() {
        assert_eq!(padded(0.0, 10.0, 0.1), (-1.0, 11.0));
        assert_eq!(padded(0.0, 0.0, 0.1), (-1.0, 1.0));
        assert_eq!(padded(5.0, 5.0, 0.1), (4.5, 5.5));
    }

    #[test]
    fn decades_round_out_and_never_collapse() {
        assert_eq!(decades(3.0, 450.0), (1.0, 1000.0));
        assert_eq!(decades(10.0, 10.0), (10.0, 100.0));
    }

    #[test]
    fn tick_labels_are_short() {
        let cases = [
            (0.0, "0"),
            (0.1 + 0.2, "0.3"),
            (1.0, "1"),
            (-2.5, "-2.5"),
            (1234.5, "1234"),
            (12_500.0, "12.5k"),
            (3_000_000.0, "3M"),
            (1.25e9, "1.25G"),
            (0.00025, "2.5e-4"),
            (0.0001, "1e-4"),
        ];
        for (value, want) in cases {
            assert_eq!(tick_label(value), want, "for {value}");
        }
    }
}
