//! Dynamo-compatible rolling prefix hashes (WIRE_FORMATS.md §2.1).
//!
//! `local_i = xxh3_64(tokens of block i as LE u32, seed)` and
//! `seq_0 = local_0`, `seq_i = xxh3_64(LE[seq_{i-1}, local_i], 1337)`. The seed is 1337 unless
//! a LoRA name or cache salt mixes into it. Only full blocks are hashed, as in vLLM.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// Seed of every xxh3 call in the scheme when there is no LoRA and no salt.
pub const XXH3_SEED: u64 = 1337;

/// Block seed for a request: `1337 +w xxh3(lora, seed 0) +w xxh3(salt, seed 1)`;
/// empty strings count as absent (Dynamo `salt.rs`).
pub fn block_seed(lora_name: Option<&str>, cache_salt: Option<&str>) -> u64 {
    let mut seed = XXH3_SEED;
    if let Some(lora) = lora_name.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64(lora.as_bytes()));
    }
    if let Some(salt) = cache_salt.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(salt.as_bytes(), 1));
    }
    seed
}

/// Hash of one block's tokens alone. `scratch` is reused so hashing a long prompt costs
/// one allocation, not one per block.
pub fn local_block_hash(tokens: &[u32], seed: u64, scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    for t in tokens {
        scratch.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(scratch, seed)
}

/// Chains a block's local hash onto its parent's sequence hash.
pub fn sequence_hash(parent: u64, local: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&parent.to_le_bytes());
    buf[8..].copy_from_slice(&local.to_le_bytes());
    xxh3_64_with_seed(&buf, XXH3_SEED)
}

/// Incremental hasher over a growing token sequence: feed tokens, get one sequence hash
/// per completed block. Used by the simulated engine as blocks fill during decode.
#[derive(Debug, Clone)]
pub struct BlockChain {
    block_size: usize,
    seed: u64,
    hashes: Vec<u64>,
    scratch: Vec<u8>,
}

impl BlockChain {
    /// An empty chain; `block_size` must be non-zero (callers validate config).
    pub fn new(block_size: usize, seed: u64) -> Self {
        Self {
            block_size: block_size.max(1),
            seed,
            hashes: Vec::new(),
            scratch: Vec::with_capacity(block_size.max(1) * 4),
        }
    }

    /// Sequence hashes of the full blocks seen so far.
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// Hashes every block of `tokens` that is full and not hashed yet; `tokens` is the whole
    /// sequence so far (it only ever grows).
    pub fn extend_to(&mut self, tokens: &[u32]) {
        let full = tokens.len() / self.block_size;
        while self.hashes.len() < full {
            let i = self.hashes.len();
            let block = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let local = local_block_hash(block, self.seed, &mut self.scratch);
            let seq = match self.hashes.last() {
                Some(&parent) => sequence_hash(parent, local),
                None => local,
            };
            self.hashes.push(seq);
        }
    }
}

/// Sequence hashes of every full block of `tokens`.
pub fn prompt_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    let mut chain = BlockChain::new(block_size, seed);
    chain.hashes.reserve(tokens.len() / block_size.max(1));
    chain.extend_to(tokens);
    chain.hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(range: std::ops::RangeInclusive<u32>) -> Vec<u32> {
        range.collect()
    }

    // Vectors from ../shared/docs/vectors/hash_vectors.out (Dynamo's published scheme).
    #[test]
    fn reproduces_dynamo_local_hash_vectors() {
        let mut scratch = Vec::new();
        assert_eq!(
            local_block_hash(&tokens(1..=16), XXH3_SEED, &mut scratch),
            0xea06fc71a5ee6e88
        );
        assert_eq!(
            local_block_hash(&tokens(17..=32), XXH3_SEED, &mut scratch),
            0x1fbf39bd106be0b5
        );
    }

    #[test]
    fn reproduces_dynamo_sequence_hash_vector() {
        let all = tokens(1..=32);
        let hashes = prompt_hashes(&all, 16, XXH3_SEED);
        assert_eq!(hashes, vec![0xea06fc71a5ee6e88, 0xad01835a37dd294c]);
    }

    #[test]
    fn reproduces_dynamo_lora_seed_vector() {
        let seed = block_seed(Some("my-lora"), None);
        assert_eq!(seed, 12827409268353072861);
        let mut scratch = Vec::new();
        assert_eq!(
            local_block_hash(&tokens(1..=16), seed, &mut scratch),
            4148081000444450790
        );
        assert_eq!(block_seed(Some(""), Some("")), XXH3_SEED);
    }

    #[test]
    fn partial_blocks_are_not_hashed_and_chain_extends_incrementally() {
        let all = tokens(1..=40);
        let mut chain = BlockChain::new(16, XXH3_SEED);
        chain.extend_to(&all[..20]);
        assert_eq!(chain.hashes().len(), 1);
        chain.extend_to(&all);
        assert_eq!(
            chain.hashes(),
            prompt_hashes(&all, 16, XXH3_SEED).as_slice()
        );
        assert_eq!(chain.hashes().len(), 2);
    }
}
