//! HBM residency across the fleet: how many copies of each KV block are resident, from the
//! engines' cache changes (host-tier copies are not HBM and are not counted). The duplicate
//! factor is copies over distinct blocks, weighted by time; a series of it is kept for
//! plots. It is kept twice: over every worker, and over the workers that decode only (a
//! prefill worker's prefix cache holds a copy of what it prefilled for a decoder until
//! something evicts it; the split says which copies are those). One map holds both counts
//! of a block: the simulator's hottest path is this lookup.

use std::collections::hash_map::Entry;

use foldhash::HashMap;

use ownerserve_planner::ids::Role;
use ownerserve_shim::sim::scheduler::CacheEvent;

/// Residency over every worker and over the workers that decode.
#[derive(Debug)]
pub(crate) struct FleetResidency {
    /// Per resident block: its copies on every worker, and on the workers that decode.
    copies: HashMap<u64, [u16; 2]>,
    pub all: Residency,
    /// Every worker but prefill workers.
    pub decoders: Residency,
}

impl FleetResidency {
    pub fn new(sample_s: f64) -> Self {
        Self {
            copies: HashMap::default(),
            all: Residency::new(sample_s),
            decoders: Residency::new(sample_s),
        }
    }

    /// Applies the cache changes of one worker in `role` at `now_s`.
    pub fn apply(&mut self, now_s: f64, role: Role, events: &[CacheEvent]) {
        if events.is_empty() {
            return;
        }
        let decodes = role != Role::Prefill;
        self.all.advance(now_s);
        if decodes {
            self.decoders.advance(now_s);
        }
        for e in events {
            match e {
                CacheEvent::Stored { hashes, .. } => {
                    for h in hashes {
                        let c = self.copies.entry(*h).or_insert([0, 0]);
                        self.all.add(&mut c[0]);
                        if decodes {
                            self.decoders.add(&mut c[1]);
                        }
                    }
                }
                CacheEvent::Removed { hashes } => {
                    for h in hashes {
                        let Entry::Occupied(mut c) = self.copies.entry(*h) else {
                            continue;
                        };
                        let counts = c.get_mut();
                        self.all.remove(&mut counts[0]);
                        if decodes {
                            self.decoders.remove(&mut counts[1]);
                        }
                        if counts[0] == 0 {
                            c.remove();
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
}

/// Copies and distinct blocks of one view of the fleet, and their time integrals.
#[derive(Debug, Default)]
pub(crate) struct Residency {
    /// Copies of all blocks, summed over workers.
    total: u64,
    /// Blocks with at least one copy.
    distinct: u64,
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
        self.distinct_area += self.distinct as f64 * dt;
        self.last_s = self.last_s.max(now_s);
        if now_s >= self.next_sample_s {
            self.series.push((now_s, self.factor_now()));
            self.next_sample_s = now_s + self.sample_s;
        }
    }

    /// One more copy of a block that had `count`.
    fn add(&mut self, count: &mut u16) {
        if *count == 0 {
            self.distinct += 1;
        }
        *count += 1;
        self.total += 1;
    }

    /// One copy fewer of a block that had `count` (none if it had none here).
    fn remove(&mut self, count: &mut u16) {
        if *count == 0 {
            return;
        }
        *count -= 1;
        self.total -= 1;
        if *count == 0 {
            self.distinct -= 1;
        }
    }

    /// Copies over distinct blocks right now (1 when nothing is resident).
    pub fn factor_now(&self) -> f64 {
        if self.distinct == 0 {
            1.0
        } else {
            self.total as f64 / self.distinct as f64
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
        let mut r = FleetResidency::new(1.0);
        r.apply(0.0, Role::Hybrid, &[stored(&[1, 2])]);
        // Two distinct blocks, one copy each, for 1 s; then block 1 twice for 1 s.
        r.apply(1.0, Role::Hybrid, &[stored(&[1])]);
        assert!((r.all.factor_now() - 1.5).abs() < 1e-9);
        let f = r.all.factor(2.0);
        // copies area 2 + 3 = 5, distinct area 2 + 2 = 4.
        assert!((f - 1.25).abs() < 1e-9, "{f}");
        r.apply(
            2.0,
            Role::Hybrid,
            &[CacheEvent::Removed {
                hashes: vec![1, 1, 9],
            }],
        );
        assert!((r.all.factor_now() - 1.0).abs() < 1e-9);
        assert!(!r.all.series.is_empty());
    }

    #[test]
    fn a_prefill_workers_copies_count_over_all_workers_only() {
        let mut r = FleetResidency::new(1.0);
        r.apply(0.0, Role::Prefill, &[stored(&[1, 2])]);
        r.apply(0.0, Role::Decode, &[stored(&[1])]);
        assert!((r.all.factor_now() - 1.5).abs() < 1e-9);
        assert!((r.decoders.factor_now() - 1.0).abs() < 1e-9);
        // The decoder's copy goes; the prefill worker's stays, over all workers only.
        r.apply(
            1.0,
            Role::Decode,
            &[CacheEvent::Removed { hashes: vec![1] }],
        );
        assert!((r.all.factor_now() - 1.0).abs() < 1e-9);
        assert_eq!(r.decoders.factor_now(), 1.0);
        assert_eq!(r.decoders.distinct, 0);
        assert_eq!(r.all.distinct, 2);
    }
}
