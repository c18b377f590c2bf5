//! Each model's tokenizer: its own (`tokenizer.json` and chat template, by
//! `ownerserve_shim::hf_tokenizer`; a LoRA adapter tokenizes as its base), its engine's
//! `/tokenize` ([`super::engine_tokenize`]), or the built-in one (`ownerserve_planner`'s,
//! through the parsed request's rendered prompt).

use std::borrow::Cow;
use std::sync::Arc;

use ownerserve_planner::hash::{hashes_after, HashedPrompt, KeptPrompt};
use ownerserve_planner::tokenized::Tokenized;
use ownerserve_shim::hf_tokenizer::HfTokenizer;
use ownerserve_shim::openai::{ParsedRequest, Prompt, PromptInput, RenderedPrompt, RequestError};

use super::cache::InputDigest;
use super::error::PromptError;
use super::{Hashing, Kept, Keys, PromptHasher};
use crate::config::ModelTokenizer;
use crate::error::ApiError;
use crate::fleet::registry::ServedModel;

/// What a model's own tokenizer is asked to tokenize.
enum ModelInput {
    /// A chat, to render through the template (its special tokens are in the text).
    Chat(ChatInput),
    /// A completions prompt (the tokenizer adds its special tokens).
    Text(String),
    Tokens(Vec<u32>),
}

/// A chat's messages and tools as JSON arrays, and whether the generation prompt is added.
struct ChatInput {
    messages: String,
    tools: Option<String>,
    generation: bool,
}

impl ModelInput {
    /// Bytes of input, what the work grows with.
    fn size(&self) -> usize {
        match self {
            ModelInput::Chat(c) => c.messages.len() + c.tools.as_ref().map_or(0, String::len),
            ModelInput::Text(t) => t.len(),
            ModelInput::Tokens(t) => t.len() * 4,
        }
    }
}

impl PromptHasher {
    /// The prompt's tokens and block hashes by the model's own tokenizer.
    pub(super) async fn hash_with(
        &self,
        tokenizer: &Arc<HfTokenizer>,
        parsed: &ParsedRequest<'_>,
        keys: Keys<'_>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        let Kept {
            keep: keep_as,
            prev,
            seed,
            same,
        } = self.kept(&parsed.model, keys, hashing, digest);
        // This very input's prompt: a taken one goes back to the cache as it is.
        if let (true, Some(prev)) = (same, &prev) {
            keep_as.keep(&self.cache, prev, digest);
            return Ok(prev.clone());
        }
        let input = model_input(tokenizer, parsed)?;
        let keep = keep_as.any();
        let (tokenizer, block_size) = (tokenizer.clone(), self.block_size);
        let size = input.size();
        let work = move || -> Result<HashedPrompt, PromptError> {
            let mut prev = prev.map(KeptPrompt::new);
            let (base, chain) = prev.as_mut().map(KeptPrompt::split).unzip();
            // Tokens not tokenized after the kept prompt are compared with it.
            let compared = |t: Tokenized, base: Option<Cow<'_, Tokenized>>| match base {
                Some(base) => t.reusing(&base),
                None => t,
            };
            let mut tokenized = match input {
                ModelInput::Chat(chat) => {
                    let text = tokenizer
                        .render_chat(&chat.messages, chat.tools.as_deref(), chat.generation)
                        .map_err(|e| PromptError::Template(e.to_string()))?;
                    match base {
                        Some(base) => tokenizer.encode_after(base, text),
                        None => tokenizer.encode(text, false),
                    }
                    .map_err(PromptError::encode)?
                }
                ModelInput::Text(text) => compared(
                    tokenizer.encode(text, true).map_err(PromptError::encode)?,
                    base,
                ),
                ModelInput::Tokens(tokens) => compared(Tokenized::from_tokens(tokens), base),
            };
            if keep {
                tokenized.shrink_to_keep();
            }
            let hashes = hashes_after(chain, &tokenized, block_size, seed);
            Ok(HashedPrompt { tokenized, hashes })
        };
        self.compute(size, digest, keep_as, work).await
    }

    /// The prompt's tokens and block hashes by the built-in tokenizer; `render` makes the
    /// prompt, only when the cache does not hold this very input already (rendering a
    /// chat is most of what a prompt sent again would cost). No prompt: no tokens.
    pub(super) async fn hash(
        &self,
        render: impl FnOnce() -> Option<RenderedPrompt>,
        model: &str,
        keys: Keys<'_>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        let Kept {
            keep: keep_as,
            prev,
            seed,
            same,
        } = self.kept(model, keys, hashing, digest);
        // This very input's prompt: a taken one goes back to the cache as it is.
        if let (true, Some(prev)) = (same, &prev) {
            keep_as.keep(&self.cache, prev, digest);
            return Ok(prev.clone());
        }
        let Some(prompt) = render() else {
            return Ok(Arc::default());
        };
        let keep = keep_as.any();
        let block_size = self.block_size;
        let prompt_len = prompt.text_len();
        let work = move || {
            let mut prev = prev.map(KeptPrompt::new);
            let (base, chain) = prev.as_mut().map(KeptPrompt::split).unzip();
            // Only a kept prompt needs restart points, and should hold little spare
            // capacity (the tokenizer reserves for a dense text).
            let tokenized = if keep {
                let mut t = prompt.into_tokenized(base);
                t.shrink_to_keep();
                t
            } else {
                // A dry run: the kept prompt is read (shared: the cache still holds it).
                Tokenized::from_tokens(prompt.into_tokens())
            };
            let hashes = hashes_after(chain, &tokenized, block_size, seed);
            Ok(HashedPrompt { tokenized, hashes })
        };
        self.compute(prompt_len, digest, keep_as, work).await
    }

    /// The tokenizer of `model`: its own entry, else its base model's (a LoRA adapter
    /// tokenizes as its base).
    pub(super) fn tokenizer_of(
        &self,
        model: &str,
        served: Option<&ServedModel>,
    ) -> Option<&ModelTokenizer> {
        self.tokenizers.get(model).or_else(|| {
            served
                .and_then(|m| m.parent.as_deref())
                .and_then(|p| self.tokenizers.get(p))
        })
    }
}

/// What the model's own tokenizer tokenizes for `parsed`: its chat template rendered, or
/// the first completions prompt.
fn model_input(
    tokenizer: &HfTokenizer,
    parsed: &ParsedRequest<'_>,
) -> Result<ModelInput, ApiError> {
    Ok(match &parsed.prompt {
        Prompt::Chat(_) => {
            let t = &parsed.template;
            ModelInput::Chat(ChatInput {
                messages: t.messages_json.as_deref().unwrap_or("[]").to_owned(),
                tools: t.tools_json.as_deref().map(str::to_owned),
                generation: t.add_generation_prompt,
            })
        }
        Prompt::Completion(prompts) => {
            // Every token-id prompt of the batch must be in the vocabulary (the engine
            // would refuse the request, after queueing it).
            let vocab = tokenizer.vocab_size();
            for p in prompts {
                if let PromptInput::Tokens(t) = p {
                    if let Some(&id) = t.iter().find(|&&id| id as usize >= vocab) {
                        return Err(RequestError::token_out_of_vocabulary(id, vocab).into());
                    }
                }
            }
            match prompts.first() {
                Some(PromptInput::Text(t)) => ModelInput::Text(t.to_string()),
                Some(PromptInput::Tokens(t)) => ModelInput::Tokens(t.clone()),
                None => ModelInput::Tokens(Vec::new()),
            }
        }
    })
}
