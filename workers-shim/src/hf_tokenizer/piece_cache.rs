//! The ids of pieces already encoded, so a word the text repeats is looked up, not run
//! through the BPE model again.
//!
//! Most pieces are short words. Those of at most 15 bytes are keyed by their bytes packed
//! in a `u128` (zero-padded, the length in the last byte) and their ids kept back to back
//! in one vector: a lookup hashes 16 bytes, compares two words and reads the ids, with no
//! pointer to follow to a boxed key (a cache miss on a prompt's first encoding) and no
//! `memcmp` call. That was about half of the piece lookups' cost, which were ~12% of a
//! router's core on new 171 KB sessions. Longer pieces, up to [`MAX_PIECE_BYTES`], keep
//! boxed keys.
//!
//! Keys come from clients' text, so the hash is seeded per process: nobody can choose
//! pieces that all land in one bucket.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Pieces kept (beyond, the cache starts over: text with ever new pieces costs a bounded
/// cache).
const MAX_PIECES: usize = 1 << 16;
/// The longest piece kept (long pieces rarely repeat).
const MAX_PIECE_BYTES: usize = 64;
/// The longest piece kept inline in a `u128` key (one byte holds the length).
const SHORT_PIECE_BYTES: usize = 15;

/// xxh3 over a piece's bytes, from a per-process seed.
#[derive(Debug, Default)]
pub(super) struct PieceHasher(u64);

impl Hasher for PieceHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxhash_rust::xxh3::xxh3_64_with_seed(bytes, self.0);
    }

    /// A packed short piece: one folded multiply of its two halves, each mixed with the
    /// seed (as `foldhash` does), instead of xxh3 over bytes it would first store.
    fn write_u128(&mut self, n: u128) {
        let a = (n as u64) ^ self.0;
        let b = ((n >> 64) as u64) ^ self.0.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
        let m = u128::from(a) * u128::from(b);
        self.0 = (m as u64) ^ ((m >> 64) as u64);
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0 ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// Makes [`PieceHasher`]s from one random seed.
#[derive(Debug, Clone, Copy)]
pub(super) struct PieceHashes(u64);

impl Default for PieceHashes {
    fn default() -> Self {
        // The standard library's per-process random keys, drawn once.
        Self(std::collections::hash_map::RandomState::new().hash_one(0x5EED_u64))
    }
}

impl BuildHasher for PieceHashes {
    type Hasher = PieceHasher;

    fn build_hasher(&self) -> PieceHasher {
        PieceHasher(self.0)
    }
}

/// Pieces' bytes → their ids.
#[derive(Debug, Default)]
pub(super) struct PieceCache {
    /// Pieces of at most [`SHORT_PIECE_BYTES`]: packed bytes → (start, count) in `ids`.
    short: HashMap<u128, (u32, u32), PieceHashes>,
    /// The short pieces' ids, back to back.
    ids: Vec<u32>,
    /// Longer pieces.
    long: HashMap<Box<[u8]>, Box<[u32]>, PieceHashes>,
}

/// `piece` packed into a key, if it is short enough. Built from a few overlapping loads in
/// registers: writing the bytes into an array and reading it back as a number stalls on
/// store forwarding, which cost more than the lookup saved.
fn packed(piece: &[u8]) -> Option<u128> {
    let n = piece.len();
    if n > SHORT_PIECE_BYTES {
        return None;
    }
    let (lo, hi) = match piece.split_at_checked(8) {
        Some((head, rest)) => {
            let head: [u8; 8] = head.try_into().ok()?;
            (u64::from_le_bytes(head), packed_small(rest))
        }
        None => (packed_small(piece), 0),
    };
    Some(u128::from(lo) | u128::from(hi) << 64 | (n as u128) << (8 * SHORT_PIECE_BYTES))
}

/// Up to 7 bytes as a little-endian number. The loads overlap where the length is not a
/// power of two; overlapping bytes land on the same bits, so OR keeps them as they are.
fn packed_small(b: &[u8]) -> u64 {
    let n = b.len();
    let word = |at: usize| -> u64 {
        b.get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .map_or(0, |w: [u8; 4]| u64::from(u32::from_le_bytes(w)))
    };
    let byte = |at: usize| b.get(at).map_or(0, |&x| u64::from(x)) << (8 * at);
    match n {
        0 => 0,
        1..=3 => byte(0) | byte(n / 2) | byte(n - 1),
        _ => word(0) | word(n - 4) << (8 * (n - 4)),
    }
}

impl PieceCache {
    /// The ids of `piece`, if kept.
    pub(super) fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        match packed(piece) {
            Some(key) => {
                let &(start, count) = self.short.get(&key)?;
                self.ids.get(start as usize..(start + count) as usize)
            }
            None => self.long.get(piece).map(|ids| &ids[..]),
        }
    }

    /// Keeps `piece`'s ids (unless it is too long to be worth it).
    pub(super) fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if piece.len() > MAX_PIECE_BYTES {
            return;
        }
        if self.short.len() + self.long.len() >= MAX_PIECES {
            self.short.clear();
            self.ids.clear();
            self.long.clear();
        }
        match packed(piece) {
            Some(key) => {
                let (Ok(start), Ok(count)) =
                    (u32::try_from(self.ids.len()), u32::try_from(ids.len()))
                else {
                    return;
                };
                self.ids.extend_from_slice(ids);
                self.short.insert(key, (start, count));
            }
            None => {
                self.long.insert(piece.into(), ids.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Short and long pieces are kept apart and read back whole; pieces that differ only
    /// in trailing zero bytes or length stay distinct; pieces too long are not kept.
    #[test]
    fn pieces_are_read_back_as_kept() {
        let mut cache = PieceCache::default();
        let pieces: [(&[u8], &[u32]); 5] = [
            (b"the", &[1]),
            (b"the\0", &[2, 3]),
            (b"fifteen-bytes!!", &[4, 5, 6]),
            (b"sixteen-bytes!!!", &[7]),
            (b"", &[]),
        ];
        for (piece, ids) in pieces {
            cache.insert(piece, ids);
        }
        for (piece, ids) in pieces {
            assert_eq!(cache.get(piece), Some(ids), "{piece:?}");
        }
        assert_eq!(cache.get(b"th"), None);
        let long = [b'x'; MAX_PIECE_BYTES + 1];
        cache.insert(&long, &[9]);
        assert_eq!(cache.get(&long), None);
        assert_eq!((cache.short.len(), cache.long.len()), (4, 1));
    }

    /// Packing keeps every byte and the length: it equals the bytes laid out in order,
    /// for every length up to the limit.
    #[test]
    fn packing_lays_the_bytes_out_in_order() {
        let bytes: Vec<u8> = (1..=SHORT_PIECE_BYTES as u8).map(|b| b * 17).collect();
        for n in 0..=SHORT_PIECE_BYTES {
            let mut want = [0u8; 16];
            want[..n].copy_from_slice(&bytes[..n]);
            want[SHORT_PIECE_BYTES] = n as u8;
            assert_eq!(
                packed(&bytes[..n]),
                Some(u128::from_le_bytes(want)),
                "{n} bytes"
            );
        }
        assert_eq!(packed(&[0; SHORT_PIECE_BYTES + 1]), None);
    }

    /// The cache starts over when full, and keeps working after.
    #[test]
    fn a_full_cache_starts_over() {
        let mut cache = PieceCache::default();
        for i in 0..MAX_PIECES as u32 + 10 {
            cache.insert(format!("p{i}").as_bytes(), &[i]);
        }
        assert!(cache.short.len() <= MAX_PIECES);
        let last = MAX_PIECES as u32 + 9;
        assert_eq!(cache.get(format!("p{last}").as_bytes()), Some(&[last][..]));
        assert_eq!(
            cache.get(b"p0"),
            None,
            "dropped when the cache started over"
        );
    }
}
