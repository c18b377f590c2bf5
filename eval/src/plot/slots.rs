//! A categorical x axis for bar charts: `n` equal slots over `0..n`, with a tick at each
//! slot's centre so that a label formatter can name the bar above it.
//!
//! `plotters`' own options do not fit: `SegmentedCoord` puts its last tick on a dummy slot,
//! and `WithKeyPoints` over a float axis loses the value formatter `configure_mesh` needs.

use std::ops::Range;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;

/// `slots` equal slots; slot `i` spans `i..i + 1`.
pub(super) struct SlotAxis {
    linear: RangedCoordf64,
    slots: usize,
}

impl SlotAxis {
    /// An axis of `slots` slots (at least one, so an empty chart still has an axis).
    pub(super) fn new(slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            linear: (0.0..slots as f64).into(),
            slots,
        }
    }

    /// The centre of slot `index`.
    pub(super) fn centre(index: usize) -> f64 {
        index as f64 + 0.5
    }

    /// The slot a tick value falls in.
    pub(super) fn slot_of(value: f64) -> Option<usize> {
        (value >= 0.0).then_some(value.floor() as usize)
    }
}

impl Ranged for SlotAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        // Every slot gets its label, whatever the hint: a missing category name misleads more
        // than a crowded axis.
        (0..self.slots).map(Self::centre).collect()
    }

    fn range(&self) -> Range<f64> {
        self.linear.range()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_sit_at_slot_centres() {
        let axis = SlotAxis::new(3);
        assert_eq!(axis.key_points(2usize), [0.5, 1.5, 2.5]);
        assert_eq!(axis.range(), 0.0..3.0);
        assert_eq!(SlotAxis::slot_of(2.5), Some(2));
        assert_eq!(SlotAxis::slot_of(-0.5), None);
    }

    #[test]
    fn an_empty_axis_has_one_slot() {
        assert_eq!(SlotAxis::new(0).range(), 0.0..1.0);
    }
}
