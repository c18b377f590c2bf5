//! HBM residency across the fleet: how many copies of each KV block are resident, from the
//! engines' cache changes (host-tier copies are not HBM and are not counted). The duplicate factor is copies over distinct blocks, weighted by
//! time; a series of it is kept for plots. It is kept twice: over every worker, and over the
//! workers that decode only (a prefill worker's prefix cache holds a copy of what it
//! prefilled for a decoder until something evicts it; the split says which copies are those).

use foldhash::HashMap;

use ownerserve_planner::ids::Role;
use ownerserve_shim::sim::scheduler::CacheEvent;

/// Residency over every worker and over the workers that decode.
#[derive(Debug)]
pub(crate) struct FleetResidency {
    pub all: Residency,
    /// Every worker but prefill workers.
    pub decoders: Residency,
}

impl FleetResidency {
    pub fn new(sample_s: f64) -> Self {
        Self {
            all: Residency::new(sample_s),
            decoders: Residency::new(sample_s),
        }
    }

    /// Applies the cache changes of one worker in `role` at `now_s`.
    pub fn apply(&mut self, now_s: f64, role: Role, events: &[CacheEvent]) {
        self.all.apply(now_s, events);
        if role != Role::Prefill {
            self.decoders.apply(now_s, events);
        }
    }
}

/// Copies of each resident block, and their time integrals.
#[derive(Debug, Default)]
pub(crate) struct Residency {
    copies: HashMap<u64, u16>,
    /// Copies of all blocks, summed over workers.
    total: u64,
    last_s: f64,
    copies_area: f64,
    distinct_area: f64,
    /// (time s, copies / distinct) at most every `sample_s`.
    pub series: Vec<(f64, f64)>,
    sample_s: f64,
    next_sample_s: f64,
}

impl Residency {
    pub fn new(sample_s: f64) -> Self {
        Self {
            sample_s: sample_s.max(1e-3),
            ..Self::default()
        }
    }

    fn advance(&mut self, now_s: f64) {
        let dt = (now_s - self.last_s).max(0.0);
        self.copies_area += self.total as f64 * dt;
        self.distinct_area += self.copies.len() as f64 * dt;
        self.last_s = self.last_s.max(now_s);
        if now_s >= self.next_sample_s {
            self.series.push((now_s, self.factor_now()));
            self.next_sample_s = now_s + self.sample_s;
        }
    }

    /// Copies over distinct blocks right now (1 when nothing is resident).
    pub fn factor_now(&self) -> f64 {
        if self.copies.is_empty() {
            1.0
        } else {
            self.total as f64 / self.copies.len() as f64
        }
    }

    /// Applies one worker's cache changes at `now_s`.
    pub fn apply(&mut self, now_s: f64, events: &[CacheEvent]) {
        if events.is_empty() {
            return;
        }
        self.advance(now_s);
        for e in events {
            match e {
                CacheEvent::Stored { hashes, .. } => {
                    for h in hashes {
                        *self.copies.entry(*h).or_insert(0) += 1;
                        self.total += 1;
                    }
                }
                CacheEvent::Removed { hashes } => {
                    for h in hashes {
                        if let Some(c) = self.copies.get_mut(h) {
                            *c -= 1;
                            self.total -= 1;
                            if *c == 0 {
                                self.copies.remove(h);
                            }
                        }
                    }
                }
                // The simulator never resets a cache; a host-tier copy is not in HBM.
                CacheEvent::Cleared
                | CacheEvent::HostStored { .. }
                | CacheEvent::HostRemoved { .. } => {}
            }
        }
    }

    /// Time-weighted duplicate factor up to `now_s`.
    pub fn factor(&mut self, now_s: f64) -> f64 {
        self.advance(now_s);
        if self.distinct_area > 0.0 {
            self.copies_area / self.distinct_area
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(h: &[u64]) -> CacheEvent {
        CacheEvent::Stored {
            hashes: h.to_vec(),
            parent: None,
            tokens: Vec::new(),
        }
    }

    #[test]
    fn copies_are_weighted_by_time() {
        let mut r = Residency::new(1.0);
        r.apply(0.0, &[stored(&[1, 2])]);
        // Two distinct blocks, one copy each, for 1 s; then block 1 twice for 1 s.
        r.apply(1.0, &[stored(&[1])]);
        assert!((r.factor_now() - 1.5).abs() < 1e-9);
        let f = r.factor(2.0);
        // copies area 2 + 3 = 5, distinct area 2 + 2 = 4.
        assert!((f - 1.25).abs() < 1e-9, "{f}");
        r.apply(
            2.0,
            &[CacheEvent::Removed {
                hashes: vec![1, 1, 9],
            }],
        );
        assert!((r.factor_now() - 1.0).abs() < 1e-9);
        assert!(!r.series.is_empty());
    }
}
