//! How fast the sequences decoding on a worker release their KV: the decode lifetimes
//! observed so far (a decayed histogram), the ages of the decodes running now, and the
//! release rate they imply, which the admission model divides a KV deficit by
//! (`plan/admission.rs`).
//!
//! Agent decodes are heavy-tailed: on Qwen3 SWE-smith sessions most end within 3 s, a
//! few run 70 s, and a decode that has already run 5 s has 15 s left on average. A
//! worker whose KV is held by old decodes frees it far more slowly than one whose
//! decodes just started, though both show the same free KV and the same count. Without
//! the ages, the model took every running decode to be anywhere in a lifetime of the
//! mean length alike; the steps queued behind a few long decoders waited 3× what it
//! planned (44 s against 13 s) while the same queue elsewhere took 15 s.
//!
//! The rate: each age bin's KV releases the share of it the lifetimes say ends within the
//! next mean lifetime `L`, per `L`; KV whose age the router does not know (another
//! router's requests, or a response that was not streamed) releases at the stationary
//! `1 / L`. Until enough lifetimes are observed there is no rate, and the admission model
//! keeps its stationary one with the worker's own mean lifetime.
//!
//! `L` here is the mean over every worker's decodes, not each worker's own EWMA of its
//! last ten or so: with the worker's own, its noise (5.7 s on one of six identical
//! decoders, 12.8 s on another, at the same moment) set the rates apart more than the
//! ages did, and the moves herded onto the worker whose last few decodes happened to be
//! short (Qwen3 SWE-smith 2p6d, seed 11: 46 of the 49 slowest steps on it).

use serde::Serialize;

/// Bins of decode ages and lifetimes: `[0, 0.25)`, `[0.25, 0.5)`, … doubling up to
/// `[512, 1024)`, and `[1024, ∞)` seconds.
pub const BINS: usize = 14;

/// Lower edge of bin 1, seconds.
const FIRST_EDGE_S: f64 = 0.25;

/// A bin's lower edge, seconds.
fn lower(bin: usize) -> f64 {
    if bin == 0 {
        0.0
    } else {
        FIRST_EDGE_S * f64::from(1u32 << (bin - 1))
    }
}

/// A bin's upper edge, seconds; the open last bin is taken to end at twice its start.
fn upper(bin: usize) -> f64 {
    FIRST_EDGE_S * f64::from(1u32 << bin)
}

/// The bin holding `seconds` (negative and non-finite ones in bin 0).
fn bin_of(seconds: f64) -> usize {
    // NaN fails this too.
    if seconds.is_nan() || seconds < FIRST_EDGE_S {
        return 0;
    }
    ((seconds / FIRST_EDGE_S).log2().floor() as usize + 1).min(BINS - 1)
}

/// KV tokens held by the decodes running on a worker, by how long they have decoded
/// (since their first token): what the router knows of the requests it sent there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DecodeAges {
    tokens: [u64; BINS],
}

impl DecodeAges {
    /// Counts a decode that has run `age_s` seconds and holds `kv_tokens`.
    pub fn add(&mut self, age_s: f64, kv_tokens: u64) {
        let b = bin_of(age_s);
        self.tokens[b] = self.tokens[b].saturating_add(kv_tokens);
    }

    /// Uncounts a decode counted with `add` at `age_s` (it ended).
    pub fn remove(&mut self, age_s: f64, kv_tokens: u64) {
        let b = bin_of(age_s);
        self.tokens[b] = self.tokens[b].saturating_sub(kv_tokens);
    }

    /// KV tokens counted, all ages.
    pub fn total(&self) -> u64 {
        self.tokens.iter().fold(0, |a, &t| a.saturating_add(t))
    }
}

/// Weight the histogram keeps of its past at each new lifetime (about the last 100
/// lifetimes count).
const LIFETIME_DECAY: f64 = 0.99;

/// Lifetimes (decayed) the histogram needs before its shape is trusted.
const MIN_LIFETIMES: f64 = 20.0;

/// One decode taken to outlive every bin but the last: a prior that keeps the survival
/// of an age past everything observed above zero, so an old decode releases slowly
/// rather than never.
const PRIOR_LONG_LIFETIMES: f64 = 1.0;

/// The decode lifetimes observed (first to last token, seconds), as a decayed histogram.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecodeLifetimes {
    mass: [f64; BINS],
    /// Mass in the bins above each bin (`above[b]` = Σ `mass[b + 1..]`), kept with it.
    above: [f64; BINS],
    total: f64,
    /// The lifetimes' decayed sum (their mean is `sum / total`).
    sum: f64,
}

impl Default for DecodeLifetimes {
    fn default() -> Self {
        Self {
            mass: [0.0; BINS],
            above: [0.0; BINS],
            total: 0.0,
            sum: 0.0,
        }
    }
}

impl DecodeLifetimes {
    /// Adds one lifetime; non-finite or negative ones are ignored.
    pub fn observe(&mut self, lifetime_s: f64) {
        if !lifetime_s.is_finite() || lifetime_s < 0.0 {
            return;
        }
        for m in &mut self.mass {
            *m *= LIFETIME_DECAY;
        }
        self.mass[bin_of(lifetime_s)] += 1.0;
        self.total = self.total * LIFETIME_DECAY + 1.0;
        self.sum = self.sum * LIFETIME_DECAY + lifetime_s;
        let mut above = 0.0;
        for b in (0..BINS).rev() {
            self.above[b] = above;
            above += self.mass[b];
        }
    }

    /// The mean lifetime, once enough are observed to trust the histogram.
    pub fn mean_s(&self) -> Option<f64> {
        (self.total >= MIN_LIFETIMES).then(|| self.sum / self.total)
    }

    /// Share of decodes that run longer than `x` seconds, with the prior's long one:
    /// the mass above `x`'s bin and the part of its bin above `x` (spread evenly in it).
    fn survival(&self, x: f64) -> f64 {
        let b = bin_of(x);
        let (lo, hi) = (lower(b), upper(b));
        let within = ((hi - x.max(lo)) / (hi - lo)).clamp(0.0, 1.0);
        let prior = if x < hi || b < BINS - 1 {
            PRIOR_LONG_LIFETIMES
        } else {
            0.0
        };
        (self.above[b] + self.mass[b] * within + prior) / (self.total + PRIOR_LONG_LIFETIMES)
    }

    /// Share of a decode that has run `age_s` that ends within the next `horizon_s`.
    fn ending_share(&self, age_s: f64, horizon_s: f64) -> f64 {
        let alive = self.survival(age_s);
        if alive <= 0.0 {
            return 0.0;
        }
        (1.0 - self.survival(age_s + horizon_s) / alive).clamp(0.0, 1.0)
    }

    /// KV tokens per second a worker's running decodes release: `held` tokens held by
    /// running sequences, `ages` of those the router knows. `None` until enough
    /// lifetimes are observed, or with no KV held (the admission model's stationary
    /// `held / L` then).
    pub fn release_per_s(&self, ages: &DecodeAges, held: u64) -> Option<f64> {
        let lifetime_s = self.mean_s().filter(|l| *l > 0.0)?;
        if held == 0 {
            return None;
        }
        let known = ages.total();
        // The router's count can exceed what the engine holds (shared prefix blocks
        // count once there): the ages then split what is held.
        let scale = if known > held {
            held as f64 / known as f64
        } else {
            1.0
        };
        let mut released = held.saturating_sub(known) as f64;
        for (b, &kv) in ages.tokens.iter().enumerate() {
            if kv > 0 {
                let age = 0.5 * (lower(b) + upper(b));
                released += kv as f64 * scale * self.ending_share(age, lifetime_s);
            }
        }
        // Decodes older than any that ended may release nothing within a lifetime; all of
        // them end, at the latest, by the longest lifetime seen.
        Some((released / lifetime_s).max(held as f64 / self.longest_s()))
    }

    /// The upper edge of the longest lifetime observed (its bin's), seconds.
    fn longest_s(&self) -> f64 {
        let top = (0..BINS).rev().find(|&b| self.mass[b] > 1e-9).unwrap_or(0);
        upper(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A histogram of `n` copies of each lifetime in `lifetimes`, interleaved.
    fn observed(lifetimes: &[f64], n: usize) -> DecodeLifetimes {
        let mut h = DecodeLifetimes::default();
        for _ in 0..n {
            for &l in lifetimes {
                h.observe(l);
            }
        }
        h
    }

    #[test]
    fn bins_double_from_a_quarter_second() {
        assert_eq!(bin_of(0.0), 0);
        assert_eq!(bin_of(-1.0), 0);
        assert_eq!(bin_of(f64::NAN), 0);
        assert_eq!(bin_of(0.25), 1);
        assert_eq!(bin_of(0.49), 1);
        assert_eq!(bin_of(1.0), 3);
        assert_eq!(bin_of(70.0), 9);
        assert_eq!(bin_of(1e9), BINS - 1);
        for b in 0..BINS {
            assert_eq!(bin_of(lower(b)), b);
        }
    }

    #[test]
    fn survival_falls_from_one_through_what_was_observed() {
        let h = observed(&[1.5, 3.0, 70.0], 40);
        assert!(h.survival(0.0) > 0.99);
        let at = |x| h.survival(x);
        assert!(at(1.0) > at(2.0) && at(2.0) > at(5.0) && at(5.0) > at(100.0));
        // A third of the lifetimes are 70 s.
        assert!((at(10.0) - 1.0 / 3.0).abs() < 0.02, "{}", at(10.0));
        // Past everything observed only the prior's long decode survives, never zero.
        assert!(at(500.0) > 0.0 && at(500.0) < 0.02, "{}", at(500.0));
    }

    #[test]
    fn old_decodes_of_a_heavy_tail_release_their_kv_slower_than_young_ones() {
        // Most decodes end in 2 s, one in five runs 70 s (mean 15.4 s).
        let h = observed(&[1.5, 1.5, 2.0, 2.0, 70.0], 20);
        let lifetime = h.mean_s().unwrap();
        assert!((lifetime - 15.4).abs() < 0.5, "{lifetime}");
        let mut young = DecodeAges::default();
        young.add(0.5, 100_000);
        let mut old = DecodeAges::default();
        old.add(20.0, 100_000);
        let fast = h.release_per_s(&young, 100_000).unwrap();
        let slow = h.release_per_s(&old, 100_000).unwrap();
        // Four in five young ones end within a mean lifetime; the old ones are the long
        // decoders, which run on past it.
        let share = |rate: f64| rate * lifetime / 100_000.0;
        assert!(share(fast) > 0.75, "{}", share(fast));
        assert!(share(slow) < 0.15, "{}", share(slow));
        // None of them ends within a lifetime, by the bins: all end by the longest
        // lifetime seen (the 70 s bin ends at 128 s).
        assert!((slow - 100_000.0 / 128.0).abs() < 1e-6, "{slow}");
    }

    #[test]
    fn kv_of_unknown_age_releases_at_the_stationary_rate() {
        let h = observed(&[2.0, 6.0], 20);
        let none = DecodeAges::default();
        let mean = h.mean_s().unwrap();
        assert!((mean - 4.0).abs() < 0.2, "{mean}");
        let r = h.release_per_s(&none, 80_000).unwrap();
        assert!((r - 80_000.0 / mean).abs() < 1e-6, "{r}");
        // Too few lifetimes or nothing held: the admission model's own.
        assert_eq!(observed(&[1.0], 5).mean_s(), None);
        assert_eq!(observed(&[1.0], 5).release_per_s(&none, 80_000), None);
        assert_eq!(h.release_per_s(&none, 0), None);
    }

    #[test]
    fn ages_counted_beyond_what_the_engine_holds_split_what_it_holds() {
        let h = observed(&[1.0, 2.0, 30.0], 20);
        let mut twice = DecodeAges::default();
        twice.add(0.1, 60_000);
        twice.add(20.0, 60_000);
        let mut once = DecodeAges::default();
        once.add(0.1, 30_000);
        once.add(20.0, 30_000);
        let r = h.release_per_s(&twice, 60_000).unwrap();
        let same = h.release_per_s(&once, 60_000).unwrap();
        assert!((r - same).abs() < 1e-6, "{r} {same}");
    }
}
