//! The streams decoding on a worker (first token seen, not ended): since when, and the
//! prompt tokens whose KV each holds (what a shell knows of it; the tokens decoded since
//! are few beside an agent's prompt). Time is the shell's, in seconds.

use crate::kv_release::DecodeAges;

/// A worker's decodes, their ages counted at most once per `window_s` (recounting every
/// stream for every candidate of every request would cost a walk over thousands of
/// streams per request); ended slots are reused.
#[derive(Debug, Default)]
pub struct Decodes {
    window_s: f64,
    slots: Vec<Option<(f64, u64)>>,
    free: Vec<usize>,
    /// The ages as last counted: when, in which time scale; streams that started or
    /// ended since are added or taken out as of that moment.
    counted: Option<(f64, f64, DecodeAges)>,
}

impl Decodes {
    /// Decodes whose ages, once counted, serve for `window_s` (0: counted every time).
    pub fn new(window_s: f64) -> Self {
        Self {
            window_s,
            ..Self::default()
        }
    }

    /// The ages at `now_s` in the planner's time (`time_scale` planner seconds per
    /// shell second), counted anew at most every window.
    pub fn ages(&mut self, now_s: f64, time_scale: f64) -> DecodeAges {
        if let Some((at, scale, ages)) = self.counted {
            if scale == time_scale && (now_s - at).max(0.0) < self.window_s {
                return ages;
            }
        }
        let mut ages = DecodeAges::default();
        for (since, tokens) in self.slots.iter().flatten() {
            ages.add((now_s - since).max(0.0) * time_scale, *tokens);
        }
        self.counted = Some((now_s, time_scale, ages));
        ages
    }

    /// A stream decoding since `since_s`, holding `tokens` of KV; returns its slot.
    pub fn start(&mut self, since_s: f64, tokens: u64) -> usize {
        if let Some((at, scale, ages)) = &mut self.counted {
            ages.add((*at - since_s).max(0.0) * *scale, tokens);
        }
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some((since_s, tokens));
                slot
            }
            None => {
                self.slots.push(Some((since_s, tokens)));
                self.slots.len() - 1
            }
        }
    }

    /// The stream in `slot` ended (a slot already ended is left alone).
    pub fn end(&mut self, slot: usize) {
        if let Some(s) = self.slots.get_mut(slot) {
            if let Some((since, tokens)) = s.take() {
                if let Some((at, scale, ages)) = &mut self.counted {
                    ages.remove((*at - since).max(0.0) * *scale, tokens);
                }
                self.free.push(slot);
            }
        }
    }
}
