//! A text kept with its tokens, so that a text extending it (a session's next prompt)
//! is tokenized only from near where the two differ, not from the start.
//!
//! The built-in tokenizer splits text into pre-tokens one after the other, each decided by
//! the text from its start to one character past its end; pieces come from one pre-token
//! each. So up to a pre-token boundary whose decision lies inside the part two texts share,
//! both texts have the same tokens, and tokenizing the rest afresh from that boundary gives
//! what tokenizing the whole would.

use std::borrow::Cow;

use crate::tokenizer::{piece_id, pre_token_len, split_long};

/// Pre-token boundaries are remembered about this often (bytes of text).
const CHECKPOINT_BYTES: usize = 256;
/// A boundary is reused only this many bytes before the texts differ: past the one
/// character (at most 4 bytes) the pre-tokenizer looks ahead, with room to spare.
const LOOKAHEAD_BYTES: usize = 16;

/// A text, its tokens, and pre-token boundaries to restart from.
#[derive(Debug, Clone, Default)]
pub struct Tokenized {
    pub text: String,
    pub tokens: Vec<u32>,
    /// `(byte, tokens before it)` at pre-token boundaries, ascending, about every
    /// [`CHECKPOINT_BYTES`].
    checkpoints: Vec<(usize, usize)>,
    /// Leading tokens taken as they were from the text this was tokenized after (so equal
    /// to that text's): whoever hashes this next to it need not compare them. 0 when
    /// tokenized whole. Not part of equality.
    reused: usize,
}

impl PartialEq for Tokenized {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
            && self.tokens == other.tokens
            && self.checkpoints == other.checkpoints
    }
}

impl Tokenized {
    /// Tokenizes `text` whole.
    pub fn new(text: String) -> Self {
        let mut t = Self {
            tokens: Vec::with_capacity(text.len() / 3 + 1),
            text,
            checkpoints: Vec::new(),
            reused: 0,
        };
        t.encode_from(0);
        t
    }

    /// A text tokenized by another tokenizer (a model's own), with the `(byte, tokens
    /// before it)` points from which that tokenizer's result for the rest of the text does
    /// not depend on what comes before (ascending).
    pub fn from_parts(text: String, tokens: Vec<u32>, checkpoints: Vec<(usize, usize)>) -> Self {
        Self {
            text,
            tokens,
            checkpoints,
            reused: 0,
        }
    }

    /// This, with its first `tokens` taken as they were from the text it was tokenized
    /// after (`tokens` must be that text's tokens; clamped to this one's length).
    pub fn with_reused(mut self, tokens: usize) -> Self {
        self.reused = tokens.min(self.tokens.len());
        self
    }

    /// This, its leading tokens that equal `prev`'s counted as reused (compared: for tokens
    /// that were not tokenized after `prev`, such as a prompt sent as token ids).
    pub fn reusing(self, prev: &Tokenized) -> Self {
        let same = common_prefix(&prev.tokens, &self.tokens);
        self.with_reused(same)
    }

    /// Leading tokens taken as they were from the previous text (see [`Self::with_reused`]).
    pub fn reused(&self) -> usize {
        self.reused
    }

    /// The restart points.
    pub fn checkpoints(&self) -> &[(usize, usize)] {
        &self.checkpoints
    }

    /// Where a text `next` can be tokenized from, reusing this one's tokens: the last
    /// restart point at least `lookahead` bytes inside the part both texts start with, as
    /// `(byte, tokens before it, restart points kept)`; `None` when there is none.
    pub fn resume_point(&self, next: &str, lookahead: usize) -> Option<(usize, usize, usize)> {
        let shared = common_prefix(self.text.as_bytes(), next.as_bytes());
        let keep = self
            .checkpoints
            .partition_point(|&(byte, _)| byte + lookahead <= shared);
        let &(byte, tokens) = self.checkpoints.get(keep.checked_sub(1)?)?;
        Some((byte, tokens, keep))
    }

    /// Tokens given as ids (a completions prompt): nothing to reuse them by but the ids.
    pub fn from_tokens(tokens: Vec<u32>) -> Self {
        Self {
            text: String::new(),
            tokens,
            checkpoints: Vec::new(),
            reused: 0,
        }
    }

    /// Tokenizes `text`, reusing `prev`'s tokens up to the last boundary safely inside the
    /// part both texts start with. Same result as [`Tokenized::new`]. An owned `prev`'s
    /// vectors become this one's ([`Tokenized::into_prefix`]).
    pub fn after(prev: Cow<'_, Tokenized>, text: String) -> Self {
        let Some((byte, tokens, keep)) = prev.resume_point(&text, LOOKAHEAD_BYTES) else {
            return Self::new(text);
        };
        let more = (text.len() - byte) / 3 + 1;
        let (tokens_before, checkpoints) = Self::into_prefix(prev, tokens, keep, more);
        let mut t = Self {
            tokens: tokens_before,
            text,
            checkpoints,
            reused: tokens,
        };
        t.encode_from(byte);
        t
    }

    /// `prev`'s first `tokens` tokens and first `checkpoints` restart points (a
    /// [`Tokenized::resume_point`]), with room for `more` tokens: an owned `prev`'s own
    /// vectors cut back, so a session's step extends its kept prompt without copying it
    /// (a 100K-token prompt's tokens are 400 KB); a borrowed one's copied.
    pub fn into_prefix(
        prev: Cow<'_, Tokenized>,
        tokens: usize,
        checkpoints: usize,
        more: usize,
    ) -> (Vec<u32>, Vec<(usize, usize)>) {
        match prev {
            Cow::Owned(mut p) => {
                p.tokens.truncate(tokens);
                p.tokens.reserve(more);
                p.checkpoints.truncate(checkpoints);
                (p.tokens, p.checkpoints)
            }
            Cow::Borrowed(p) => {
                let tokens = &p.tokens[..tokens.min(p.tokens.len())];
                let mut all = Vec::with_capacity(tokens.len() + more);
                all.extend_from_slice(tokens);
                let checkpoints = &p.checkpoints[..checkpoints.min(p.checkpoints.len())];
                (all, checkpoints.to_vec())
            }
        }
    }

    /// Heap bytes held (for cache budgets).
    pub fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.tokens.capacity() * 4 + self.checkpoints.capacity() * 16
    }

    /// Releases spare capacity beyond [`with_headroom`] (a kept entry should cost about
    /// what it holds, yet its next step extends its tokens in place without reallocating
    /// them). The text is replaced by the next step's, not extended: none kept for it.
    pub fn shrink_to_keep(&mut self) {
        self.text.shrink_to_fit();
        self.tokens.shrink_to(with_headroom(self.tokens.len()));
        self.checkpoints
            .shrink_to(with_headroom(self.checkpoints.len()));
    }

    /// Appends the tokens of `text[start..]`, `start` being a pre-token boundary, and
    /// records boundaries on the way.
    fn encode_from(&mut self, start: usize) {
        let Self {
            text,
            tokens,
            checkpoints,
            ..
        } = self;
        let mut at = start;
        let mut next_mark = checkpoints.last().map_or(0, |&(b, _)| b) + CHECKPOINT_BYTES;
        while at < text.len() {
            if at >= next_mark {
                checkpoints.push((at, tokens.len()));
                next_mark = at + CHECKPOINT_BYTES;
            }
            let rest = &text[at..];
            let len = pre_token_len(rest);
            split_long(&rest[..len], &mut |p| tokens.push(piece_id(p)));
            at += len;
        }
    }
}

/// Capacity for `len` items that a session's next steps extend in place: a sixteenth
/// more, about eight steps of an agent's 100K-token prompt growing by 2 KB of text each
/// before the vector is reallocated (and copied) once.
pub fn with_headroom(len: usize) -> usize {
    len + len / 16 + 16
}

/// Length of the longest common prefix, compared a chunk at a time (a memcmp each for
/// bytes and integers).
pub(crate) fn common_prefix<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    const CHUNK: usize = 256;
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + CHUNK <= n && a[at..at + CHUNK] == b[at..at + CHUNK] {
        at += CHUNK;
    }
    at + a[at..n]
        .iter()
        .zip(&b[at..n])
        .take_while(|(x, y)| x == y)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::encode;

    /// Random text over the characters where pre-token rules differ.
    fn random_text(state: &mut u64, len: usize) -> String {
        let alphabet: Vec<char> = "aZs tdrevml1'  \n\t\r!.é中\u{a0}\u{2003}ï0"
            .chars()
            .collect();
        (0..len)
            .map(|_| {
                *state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                alphabet[((*state >> 33) % alphabet.len() as u64) as usize]
            })
            .collect()
    }

    #[test]
    fn reusing_a_previous_text_tokenizes_as_the_whole_text_would() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut reused = 0;
        for i in 0..3000 {
            let len = 200 + (state >> 54) as usize * 4;
            let base = random_text(&mut state, len);
            let prev = Tokenized::new(base.clone());
            assert_eq!(prev.tokens, encode(&base));
            // Cut the base at a char boundary and append a suffix: an extension (cut at
            // the end), an edit, a shorter text; runs of spaces and letters straddle the cut.
            let mut cut = (state >> 40) as usize % (base.len() + 1);
            if i % 3 == 0 {
                cut = base.len();
            }
            while !base.is_char_boundary(cut) {
                cut -= 1;
            }
            let len = (state >> 58) as usize * 8;
            let suffix = random_text(&mut state, len);
            let text = format!("{}{suffix}", &base[..cut]);
            let after = Tokenized::after(Cow::Borrowed(&prev), text.clone());
            assert_eq!(
                after.tokens,
                encode(&text),
                "{base:?} cut at {cut} + {suffix:?}"
            );
            let mut kept = prev.clone();
            kept.shrink_to_keep();
            let owned = Tokenized::after(Cow::Owned(kept), text.clone());
            assert_eq!(
                (&owned, owned.reused()),
                (&after, after.reused()),
                "a prompt taken whole extends as one read does"
            );
            assert_eq!(after, Tokenized::new(text), "the same boundaries too");
            let shared = common_prefix(base.as_bytes(), after.text.as_bytes());
            reused += usize::from(
                prev.checkpoints
                    .first()
                    .is_some_and(|&(b, _)| b + LOOKAHEAD_BYTES <= shared),
            );
        }
        assert!(reused > 1000, "the reuse path ran: {reused}");
    }

    #[test]
    fn a_session_step_retokenizes_only_its_tail() {
        let step1 = "<|user|>\nfix the bug in parser.rs\n".repeat(200) + "<|assistant|>\n";
        let prev = Tokenized::new(step1.clone());
        let step2 = format!("{step1}looking at it\n<|user|>\ntool output\n<|assistant|>\n");
        let after = Tokenized::after(Cow::Borrowed(&prev), step2.clone());
        assert_eq!(after.tokens, encode(&step2));
        let kept = after.checkpoints.last().map_or(0, |&(b, _)| b);
        assert!(
            kept + 2 * CHECKPOINT_BYTES >= step1.len(),
            "restarted at byte {kept} of {}",
            step1.len()
        );
        assert_eq!(common_prefix(b"abcd", b"abxd"), 2);
        let long = vec![7u8; 3000];
        assert_eq!(common_prefix(&long, &long[..2500]), 2500);
    }
}
