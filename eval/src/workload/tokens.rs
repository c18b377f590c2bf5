//! Synthetic prompt tokens from block ids, and the allocator that hands out fresh ids.
//!
//! Tokens depend on a block's id alone, so equal ids give equal tokens: a live engine's
//! prefix cache then sees exactly the reuse the workload's hash ids describe.

use ownerserve_planner::policy::SplitMix64;

use super::Step;

/// Smallest token id emitted: keeps clear of special tokens (BOS, EOS, pads) in any vocab.
const TOKEN_MIN: u32 = 1000;
/// Largest token id emitted: fits every current model's vocabulary.
const TOKEN_MAX: u32 = 60_000;
/// Separates the token stream of an id from other uses of the same id as a seed.
const TOKEN_STREAM: u64 = 0x746f_6b65_6e73_2121;

/// Prompt token ids for a step: block j holds tokens derived from `hash_ids[j]` alone
/// (equal ids give equal tokens, different ids different ones with overwhelming
/// probability), truncated to `input_tokens`. Token ids lie in 1000..=60000. Each draw of
/// the id's generator gives four tokens (16 bits each, scaled into the range by a multiply
/// and a shift): the simulator builds every prompt this way, and a draw and a division per
/// token were a tenth of its time.
pub fn prompt_tokens(step: &Step, hash_block: u32) -> Vec<u32> {
    let total = step.input_tokens as usize;
    let mut out = Vec::with_capacity(total);
    if hash_block == 0 {
        return out;
    }
    let span = TOKEN_MAX - TOKEN_MIN + 1;
    for &id in &step.hash_ids {
        let mut rng = SplitMix64::new(id ^ TOKEN_STREAM);
        let n = (hash_block as usize).min(total - out.len());
        let mut bits = 0u64;
        for i in 0..n {
            if i % 4 == 0 {
                bits = rng.next_u64();
            }
            let draw = (bits >> (16 * (i % 4))) & 0xFFFF;
            out.push(TOKEN_MIN + ((draw as u32 * span) >> 16));
        }
        if out.len() == total {
            break;
        }
    }
    out
}

/// The splitmix64 finaliser: a bijection on u64, so distinct inputs give distinct outputs.
pub(crate) fn mix64(x: u64) -> u64 {
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Hands out block ids that never repeat within one allocator (a bijection of a counter),
/// salted by the seed so that two workloads rarely alias each other's ids either.
#[derive(Debug, Clone)]
pub(crate) struct IdAlloc {
    salt: u64,
    next: u64,
}

impl IdAlloc {
    /// An allocator whose ids depend on `salt` (mix the seed and a per-generator tag).
    pub(crate) fn new(salt: u64) -> Self {
        Self {
            salt: mix64(salt),
            next: 0,
        }
    }

    /// A never-before-returned id.
    pub(crate) fn fresh(&mut self) -> u64 {
        let id = mix64(self.salt.wrapping_add(self.next));
        self.next += 1;
        id
    }
}
