//! The prompt's block hashes: chained by `ownerserve_planner::hash` from each model's seed,
//! and the digest and key a prompt is kept under.

use ownerserve_planner::hash::{block_seed, XXH3_SEED};
use ownerserve_shim::openai::{ParsedRequest, Prompt, PromptInput};

use super::PromptHasher;

impl PromptHasher {
    /// The hash seed of `model`'s blocks: a LoRA adapter's KV is its own (the engine keys
    /// its blocks by the adapter's name, and the index chains them apart), so its blocks
    /// never match the base model's.
    pub(super) fn seed_of(&self, model: &str) -> u64 {
        let lora = self
            .engines
            .as_ref()
            .and_then(|e| e.registry.served(model))
            .is_some_and(|m| m.parent.is_some());
        if lora {
            block_seed(Some(model), None)
        } else {
            XXH3_SEED
        }
    }
}

/// Bytes of a sessionless prompt's input its cache key is made of.
const CONTENT_KEY_BYTES: usize = 2048;

/// What a prompt is computed from: chat's messages and tools (as sent) and whether the
/// generation prompt is added, or the first completions prompt's text; `None` for token
/// ids (nothing to render or tokenize).
pub(super) fn prompt_input<'p>(
    parsed: &'p ParsedRequest<'_>,
) -> Option<(&'p [u8], &'p [u8], bool)> {
    match &parsed.prompt {
        Prompt::Chat(_) => {
            let t = &parsed.template;
            let messages = t.messages_json.as_deref()?;
            let tools = t.tools_json.as_deref().unwrap_or_default();
            Some((
                messages.as_bytes(),
                tools.as_bytes(),
                t.add_generation_prompt,
            ))
        }
        Prompt::Completion(prompts) => match prompts.first()? {
            PromptInput::Text(t) => Some((t.as_bytes(), &[], false)),
            PromptInput::Tokens(_) => None,
        },
    }
}

/// The prompt cache's key for a sessionless prompt: its first bytes' hash.
pub(super) fn content_key(input: &(&[u8], &[u8], bool)) -> String {
    let head = &input.0[..input.0.len().min(CONTENT_KEY_BYTES)];
    let hash = xxhash_rust::xxh3::xxh3_64(head);
    // `#` and 16 hex digits, written by hand: `format!` took ~0.6 µs of every request.
    let mut key = String::with_capacity(17);
    key.push('#');
    for shift in (0..16).rev() {
        key.push(char::from(
            b"0123456789abcdef"[((hash >> (4 * shift)) & 0xf) as usize],
        ));
    }
    key
}
