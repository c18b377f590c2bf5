//! A cheap hasher for the index's maps. Their keys are already hashes (ours, or engine
//! block ids), so SipHash's DoS resistance buys nothing and costs a fifth of ingest time.
//! One multiply spreads the bits; folding the high half down keeps keys that differ only
//! in high bits (ids with a worker in the top bits) in different buckets.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-fold hasher for integer keys.
#[derive(Debug, Default, Clone, Copy)]
pub struct MixHasher(u64);

const K: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }

    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x).wrapping_mul(K);
        self.0 = h ^ (h >> 32);
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
}

/// A `HashMap` with [`MixHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;
