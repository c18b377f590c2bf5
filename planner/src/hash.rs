//! Dynamo-compatible rolling prefix hashes (WIRE_FORMATS.md §2.1).
//!
//! `local_i = xxh3_64(tokens of block i as LE u32, seed)` and
//! `seq_0 = local_0`, `seq_i = xxh3_64(LE[seq_{i-1}, local_i], 1337)`. The seed is 1337 unless
//! a LoRA name or cache salt mixes into it. Only full blocks are hashed, as in vLLM.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed, Xxh3};

use std::borrow::Cow;
use std::sync::Arc;

use crate::tokenized::{common_prefix, with_headroom, Tokenized};

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

/// Tokens converted per stack chunk (vLLM's default block size fits in one).
const CHUNK_TOKENS: usize = 16;

/// Hash of one block's tokens alone. The little-endian bytes go through a 64-byte stack
/// array, so hashing allocates nothing; larger blocks stream through xxh3's incremental
/// hasher, which gives the same result as the one-shot function.
#[inline]
pub fn local_block_hash(tokens: &[u32], seed: u64) -> u64 {
    let mut buf = [0u8; CHUNK_TOKENS * 4];
    if tokens.len() == CHUNK_TOKENS {
        // The default block size: a fixed-length input lets xxh3's length dispatch fold
        // away (6x faster than the general path here).
        le_bytes(tokens, &mut buf);
        return xxh3_64_with_seed(&buf, seed);
    }
    if tokens.len() < CHUNK_TOKENS {
        let n = le_bytes(tokens, &mut buf);
        return xxh3_64_with_seed(&buf[..n], seed);
    }
    let mut h = Xxh3::with_seed(seed);
    for chunk in tokens.chunks(CHUNK_TOKENS) {
        let n = le_bytes(chunk, &mut buf);
        h.update(&buf[..n]);
    }
    h.digest()
}

/// Writes up to 16 tokens as little-endian bytes; returns the byte count.
#[inline]
fn le_bytes(tokens: &[u32], buf: &mut [u8; CHUNK_TOKENS * 4]) -> usize {
    for (dst, t) in buf.chunks_exact_mut(4).zip(tokens) {
        dst.copy_from_slice(&t.to_le_bytes());
    }
    tokens.len().min(CHUNK_TOKENS) * 4
}

/// Chains a block's local hash onto its parent's sequence hash.
#[inline]
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
}

impl BlockChain {
    /// An empty chain; `block_size` must be non-zero (callers validate config).
    pub fn new(block_size: usize, seed: u64) -> Self {
        Self {
            block_size: block_size.max(1),
            seed,
            hashes: Vec::new(),
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
            let local = local_block_hash(block, self.seed);
            let seq = match self.hashes.last() {
                Some(&parent) => sequence_hash(parent, local),
                None => local,
            };
            self.hashes.push(seq);
        }
    }
}

/// Sequence hashes of every full block of `tokens` (one allocation: the result).
pub fn prompt_hashes(tokens: &[u32], block_size: usize, seed: u64) -> Vec<u64> {
    let bs = block_size.max(1);
    let mut out = Vec::with_capacity(tokens.len() / bs);
    chain_blocks(&mut out, tokens, bs, seed);
    out
}

/// A prompt (its text, when it came as text, and tokens) with its block hashes, kept so
/// that the session's next prompt, which almost always extends it, tokenizes and hashes
/// only what it adds: comparing 100K tokens takes a few microseconds, chaining their 6,250
/// blocks about 28 (each link waits for the one before), tokenizing their text about 1 ms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HashedPrompt {
    pub tokenized: Tokenized,
    /// `prompt_hashes(tokens, ..)` for the block size and seed the caller uses.
    pub hashes: Vec<u64>,
}

impl HashedPrompt {
    /// Bytes this holds (for cache budgets).
    pub fn heap_bytes(&self) -> usize {
        self.tokenized.heap_bytes() + self.hashes.capacity() * 8
    }
}

/// `prompt_hashes(tokens, ..)`, reusing `prev`'s hashes for the full blocks both prompts
/// start with (same result whatever `prev` holds, as long as its hashes are its tokens'
/// for this block size and seed).
pub fn prompt_hashes_after(
    prev: &HashedPrompt,
    tokens: &[u32],
    block_size: usize,
    seed: u64,
) -> Vec<u64> {
    let bs = block_size.max(1);
    let shared = (common_prefix(&prev.tokenized.tokens, tokens) / bs).min(prev.hashes.len());
    let mut out = Vec::with_capacity(tokens.len() / bs);
    out.extend_from_slice(&prev.hashes[..shared]);
    chain_blocks(&mut out, &tokens[shared * bs..], bs, seed);
    out
}

/// `prompt_hashes(&next.tokens, ..)`, reusing `prev`'s hashes like
/// [`prompt_hashes_after`], but comparing only the tokens past those `next` took from
/// `prev` as they were ([`Tokenized::reused`]): for a session's step that is a few hundred
/// tokens instead of the whole prompt (comparing 100K tokens reads 800 KB).
pub fn prompt_hashes_extending(
    prev: &HashedPrompt,
    next: &Tokenized,
    block_size: usize,
    seed: u64,
) -> Vec<u64> {
    let bs = block_size.max(1);
    let (a, b) = (&prev.tokenized.tokens, &next.tokens);
    let known = next.reused().min(a.len()).min(b.len());
    let same = known + common_prefix(&a[known..], &b[known..]);
    let shared = (same / bs).min(prev.hashes.len());
    let mut out = Vec::with_capacity(b.len() / bs);
    out.extend_from_slice(&prev.hashes[..shared]);
    chain_blocks(&mut out, &b[shared * bs..], bs, seed);
    out
}

/// A session's kept prompt as the base of its next step's: taken whole when nobody else
/// holds it (its vectors become the step's, cut back and extended in place: nothing
/// copied), else read (its reused tokens and hashes copied).
#[derive(Debug)]
pub enum KeptPrompt {
    Taken(HashedPrompt),
    Shared(Arc<HashedPrompt>),
}

/// What a step's hashes are chained onto: [`KeptPrompt::split`]'s second half.
#[derive(Debug)]
pub enum KeptChain<'a> {
    /// The kept prompt's hashes, taken: the step's first [`Tokenized::reused`] tokens are
    /// the kept prompt's, and the hashes of their full blocks are kept as they are.
    Taken(Vec<u64>),
    /// The kept prompt, read ([`prompt_hashes_extending`]).
    Shared(&'a HashedPrompt),
}

impl KeptPrompt {
    /// Taken when `prompt` is held nowhere else, else shared.
    pub fn new(prompt: Arc<HashedPrompt>) -> Self {
        match Arc::try_unwrap(prompt) {
            Ok(p) => KeptPrompt::Taken(p),
            Err(p) => KeptPrompt::Shared(p),
        }
    }

    /// The tokens to tokenize the step after and the chain to hash it onto; a taken
    /// prompt's vectors move out (what is left of it holds nothing).
    pub fn split(&mut self) -> (Cow<'_, Tokenized>, KeptChain<'_>) {
        match self {
            KeptPrompt::Taken(p) => (
                Cow::Owned(std::mem::take(&mut p.tokenized)),
                KeptChain::Taken(std::mem::take(&mut p.hashes)),
            ),
            KeptPrompt::Shared(p) => {
                let p: &HashedPrompt = p;
                (Cow::Borrowed(&p.tokenized), KeptChain::Shared(p))
            }
        }
    }
}

/// `prompt_hashes(&next.tokens, ..)`, chained onto what `next` was tokenized after, if
/// anything: a taken chain is cut back to the blocks of `next`'s reused tokens and
/// extended in place, with room to grow ([`with_headroom`]).
pub fn hashes_after(
    kept: Option<KeptChain<'_>>,
    next: &Tokenized,
    block_size: usize,
    seed: u64,
) -> Vec<u64> {
    let bs = block_size.max(1);
    match kept {
        None => prompt_hashes(&next.tokens, bs, seed),
        Some(KeptChain::Shared(prev)) => prompt_hashes_extending(prev, next, bs, seed),
        Some(KeptChain::Taken(mut hashes)) => {
            let keep = (next.reused().min(next.tokens.len()) / bs).min(hashes.len());
            hashes.truncate(keep);
            let blocks = next.tokens.len() / bs;
            hashes.reserve(with_headroom(blocks) - keep);
            chain_blocks(&mut hashes, &next.tokens[keep * bs..], bs, seed);
            hashes
        }
    }
}

/// Appends the hashes of `tokens`' full blocks to `out`, chained onto its last hash.
fn chain_blocks(out: &mut Vec<u64>, tokens: &[u32], bs: usize, seed: u64) {
    let mut parent = out.last().copied();
    let mut push = |local: u64| {
        let seq = match parent {
            Some(p) => sequence_hash(p, local),
            None => local,
        };
        out.push(seq);
        parent = Some(seq);
    };
    if bs == CHUNK_TOKENS {
        // The router's hot path: one stack buffer for the whole prompt.
        let mut buf = [0u8; CHUNK_TOKENS * 4];
        for block in tokens.chunks_exact(CHUNK_TOKENS) {
            le_bytes(block, &mut buf);
            push(xxh3_64_with_seed(&buf, seed));
        }
    } else {
        for block in tokens.chunks_exact(bs) {
            push(local_block_hash(block, seed));
        }
    }
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
        assert_eq!(
            local_block_hash(&tokens(1..=16), XXH3_SEED),
            0xea06fc71a5ee6e88
        );
        assert_eq!(
            local_block_hash(&tokens(17..=32), XXH3_SEED),
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
        assert_eq!(local_block_hash(&tokens(1..=16), seed), 4148081000444450790);
        assert_eq!(block_seed(Some(""), Some("")), XXH3_SEED);
    }

    #[test]
    fn every_path_agrees_whatever_the_block_size() {
        let tokens: Vec<u32> = (0..5000).map(|i| i * 7919 % 128_000).collect();
        for len in [1, 15, 16, 17, 32, 100, 2048] {
            let block = &tokens[..len];
            let bytes: Vec<u8> = block.iter().flat_map(|t| t.to_le_bytes()).collect();
            assert_eq!(
                local_block_hash(block, 9),
                xxh3_64_with_seed(&bytes, 9),
                "{len} tokens"
            );
        }
        let mut chain = BlockChain::new(16, XXH3_SEED);
        chain.extend_to(&tokens);
        assert_eq!(prompt_hashes(&tokens, 16, XXH3_SEED), chain.hashes());
        let seed = block_seed(Some("lora"), Some("salt"));
        let mut c2 = BlockChain::new(32, seed);
        c2.extend_to(&tokens);
        assert_eq!(prompt_hashes(&tokens, 32, seed), c2.hashes());
    }

    #[test]
    fn reusing_a_previous_prompt_gives_the_same_hashes() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 33) as u32
        };
        let base: Vec<u32> = (0..3000).map(|_| next() % 50_000).collect();
        for bs in [1, 16, 64] {
            let prev = HashedPrompt {
                tokenized: Tokenized::from_tokens(base.clone()),
                hashes: prompt_hashes(&base, bs, XXH3_SEED),
            };
            // An extension, a prefix, a divergence mid-block and at a block edge, an
            // unrelated prompt and an empty one.
            let mut extended = base.clone();
            extended.extend((0..777).map(|_| next() % 50_000));
            let mut diverged = base.clone();
            diverged[1000] ^= 1;
            let mut at_edge = base.clone();
            at_edge[1024] ^= 1;
            let unrelated: Vec<u32> = (0..2000).map(|_| next() % 50_000).collect();
            for tokens in [
                extended,
                base[..1500].to_vec(),
                diverged,
                at_edge,
                unrelated,
                Vec::new(),
            ] {
                assert_eq!(
                    prompt_hashes_after(&prev, &tokens, bs, XXH3_SEED),
                    prompt_hashes(&tokens, bs, XXH3_SEED),
                    "block size {bs}, {} tokens",
                    tokens.len()
                );
                // Told how many leading tokens are the previous prompt's, the same hashes.
                let known = common_prefix(&base, &tokens);
                for reused in [0, known / 2, known] {
                    let next = Tokenized::from_tokens(tokens.clone()).with_reused(reused);
                    assert_eq!(
                        prompt_hashes_extending(&prev, &next, bs, XXH3_SEED),
                        prompt_hashes(&tokens, bs, XXH3_SEED),
                        "block size {bs}, {reused} reused"
                    );
                    // The kept prompt taken whole or read, the same hashes.
                    for shared in [false, true] {
                        let arc = Arc::new(prev.clone());
                        let _other = shared.then(|| arc.clone());
                        let mut kept = KeptPrompt::new(arc);
                        assert_eq!(matches!(kept, KeptPrompt::Shared(_)), shared);
                        let (_, chain) = kept.split();
                        assert_eq!(
                            hashes_after(Some(chain), &next, bs, XXH3_SEED),
                            prompt_hashes(&tokens, bs, XXH3_SEED),
                            "block size {bs}, {reused} reused, shared {shared}"
                        );
                    }
                }
            }
        }
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        let long: Vec<u32> = (0..1000).collect();
        assert_eq!(common_prefix(&long, &long[..700]), 700);
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
