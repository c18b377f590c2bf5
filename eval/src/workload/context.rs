//! A growing prompt (conversation so far) that assigns block ids as text is appended.
//!
//! A block id names a block's full content, so when appended text lands in the previous
//! prompt's partial last block, that block gets a new id; a partial block's id is fresh at
//! each snapshot and never reused.

use super::tokens::IdAlloc;

/// The prompt so far: its length and the ids of its full blocks.
#[derive(Debug, Clone)]
pub(crate) struct Context {
    block: u32,
    tokens: u32,
    full_ids: Vec<u64>,
}

impl Context {
    /// An empty prompt over `block`-token blocks (`block` >= 1).
    pub(crate) fn new(block: u32) -> Self {
        Self {
            block: block.max(1),
            tokens: 0,
            full_ids: Vec::new(),
        }
    }

    /// Prompt length in tokens.
    pub(crate) fn tokens(&self) -> u32 {
        self.tokens
    }

    /// Appends `n` tokens of new content (text nobody else has at this position).
    pub(crate) fn append(&mut self, n: u32, ids: &mut IdAlloc) {
        self.tokens = self.tokens.saturating_add(n);
        let full = (self.tokens / self.block) as usize;
        while self.full_ids.len() < full {
            self.full_ids.push(ids.fresh());
        }
    }

    /// The hash ids of the prompt as it stands: the full blocks plus a fresh id for the
    /// partial last block, if any.
    pub(crate) fn hash_ids(&self, ids: &mut IdAlloc) -> Vec<u64> {
        let mut out = self.full_ids.clone();
        if !self.tokens.is_multiple_of(self.block) {
            out.push(ids.fresh());
        }
        out
    }
}
