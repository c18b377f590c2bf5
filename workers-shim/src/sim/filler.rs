//! Deterministic generated text: the engine "samples" pieces of a fixed passage, so the
//! output is reproducible and re-tokenizes to about the same number of tokens.

use ownerserve_planner::tokenizer;

const PASSAGE: &str = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod \
tempor incididunt ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud \
exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat. Duis aute irure dolor in \
reprehenderit in voluptate velit esse cillum dolore eu fugiat nulla pariatur. ";

/// The passage cut into tokenizer pieces with their ids.
#[derive(Debug, Clone)]
pub struct Filler {
    pieces: Vec<(&'static str, u32)>,
}

impl Default for Filler {
    fn default() -> Self {
        let mut pieces = Vec::new();
        tokenizer::for_each_piece(PASSAGE, |p| pieces.push(p));
        Self {
            pieces: pieces
                .into_iter()
                .map(|p| (p, tokenizer::piece_id(p)))
                .collect(),
        }
    }
}

impl Filler {
    /// The `i`-th generated piece of a sequence whose sampling stream starts at `offset`.
    pub fn piece(&self, offset: u64, i: usize) -> (&'static str, u32) {
        let n = self.pieces.len();
        self.pieces[((offset % n as u64) as usize + i) % n]
    }
}

/// Natural response length in tokens (where the model would emit end-of-sequence) for a
/// sampling stream: 32 to 287 tokens, fixed per stream.
pub fn natural_length(stream_seed: u64) -> u32 {
    32 + (stream_seed % 256) as u32
}

/// Seed of choice `index`'s sampling stream. At temperature 0 every choice is the same
/// greedy stream, as with a real engine.
pub fn stream_seed(prompt: &[u32], seed: Option<u64>, temperature: f64, index: u32) -> u64 {
    let mut h = fnv_prompt(prompt) ^ seed.unwrap_or(0);
    if temperature > 0.0 {
        h = h.rotate_left(17) ^ (u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    }
    h
}

fn fnv_prompt(prompt: &[u32]) -> u64 {
    // FNV-1a over the ids: cheap, and only needs to be deterministic.
    prompt.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_choices_agree_and_sampled_ones_differ() {
        let p = [1, 2, 3];
        assert_eq!(stream_seed(&p, None, 0.0, 0), stream_seed(&p, None, 0.0, 1));
        assert_ne!(stream_seed(&p, None, 0.7, 0), stream_seed(&p, None, 0.7, 1));
        assert_ne!(
            stream_seed(&p, Some(1), 0.0, 0),
            stream_seed(&p, Some(2), 0.0, 0)
        );
    }

    #[test]
    fn pieces_are_real_tokens() {
        let f = Filler::default();
        let (text, id) = f.piece(3, 5);
        assert_eq!(tokenizer::encode(text), vec![id]);
    }
}
