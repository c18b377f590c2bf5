//! An engine's `POST /tokenize` (vLLM's and SGLang's): the prompt's tokens as an engine
//! serving the model tokenizes them, for models configured with `tokenizer = "engine"`.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use ownerserve_planner::hash::{hashes_after, HashedPrompt, KeptChain};
use ownerserve_planner::tokenized::Tokenized;
use ownerserve_shim::openai::{ParsedRequest, Prompt, PromptInput};

use super::cache::InputDigest;
use super::{Hashing, Keys, PromptHasher};
use crate::error::ApiError;
use crate::fleet::registry::Registry;
use crate::upstream::EngineCalls;

/// The engines a `tokenizer = "engine"` model asks.
pub struct Engines {
    pub calls: Arc<dyn EngineCalls>,
    pub registry: Arc<Registry>,
}

/// vLLM's (and SGLang's) tokenize endpoint.
pub(crate) const TOKENIZE_PATH: &str = "/tokenize";

/// What `/tokenize` is asked: a chat rendered through the engine's template, or a
/// completions prompt.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(super) enum TokenizeRequest<'a> {
    Chat {
        model: &'a str,
        messages: &'a RawValue,
        add_generation_prompt: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        tools: Option<&'a RawValue>,
    },
    Completion {
        model: &'a str,
        prompt: &'a str,
    },
}

/// An engine's `/tokenize` answer (its other fields are not needed).
#[derive(Debug, Deserialize)]
pub(super) struct TokenizeResponse {
    pub tokens: Vec<u32>,
}

/// The `/tokenize` request for `parsed`'s prompt, or its tokens when it is token ids
/// already; `None` when it has no prompt or its raw JSON does not parse.
pub(super) fn tokenize_request<'p>(
    parsed: &'p ParsedRequest<'_>,
) -> Option<Result<TokenizeRequest<'p>, Vec<u32>>> {
    let model = parsed.model.as_ref();
    Some(Ok(match &parsed.prompt {
        Prompt::Chat(_) => {
            let t = &parsed.template;
            let raw = |j: &'p str| serde_json::from_str::<&RawValue>(j).ok();
            TokenizeRequest::Chat {
                model,
                messages: raw(t.messages_json.as_deref().unwrap_or("[]"))?,
                add_generation_prompt: t.add_generation_prompt,
                tools: match t.tools_json.as_deref() {
                    Some(j) => Some(raw(j)?),
                    None => None,
                },
            }
        }
        Prompt::Completion(prompts) => match prompts.first()? {
            PromptInput::Text(t) => TokenizeRequest::Completion {
                model,
                prompt: t.as_ref(),
            },
            PromptInput::Tokens(t) => return Some(Err(t.clone())),
        },
    }))
}

impl PromptHasher {
    /// The prompt's tokens as an engine serving the model tokenizes them (its
    /// `POST /tokenize`); `None` when no engine answers, and the built-in tokenizer stands in.
    pub(super) async fn hash_by_engine(
        &self,
        parsed: &ParsedRequest<'_>,
        keys: Keys<'_>,
        hashing: Hashing,
    ) -> Result<Option<Arc<HashedPrompt>>, ApiError> {
        let Some(tokens) = self.engine_tokens(parsed).await else {
            return Ok(None);
        };
        let kept = self.kept(&parsed.model, keys, hashing, InputDigest::default());
        let tokenized = Tokenized::from_tokens(tokens);
        // The engine's tokens reuse nothing: compared with the kept prompt's whole.
        let chain = kept.prev.as_deref().map(KeptChain::Shared);
        let hashes = hashes_after(chain, &tokenized, self.block_size, kept.seed);
        let hashed = Arc::new(HashedPrompt { tokenized, hashes });
        kept.keep.keep(&self.cache, &hashed, InputDigest::default());
        Ok(Some(hashed))
    }

    /// Asks the first healthy engine serving the model.
    pub(super) async fn engine_tokens(&self, parsed: &ParsedRequest<'_>) -> Option<Vec<u32>> {
        let engines = self.engines.as_ref()?;
        let worker = engines
            .registry
            .candidates(&parsed.model, &[], None)
            .into_iter()
            .find(|w| w.healthy)?;
        let base = engines.registry.get(worker.id)?.spec.base_url.clone();
        let request = match tokenize_request(parsed)? {
            Ok(request) => request,
            Err(tokens) => return Some(tokens),
        };
        let body = serde_json::to_vec(&request).ok()?;
        let answer = engines
            .calls
            .post(&base, TOKENIZE_PATH, &[], Bytes::from(body))
            .await;
        let tokens = match answer {
            Ok((status, bytes)) if status.is_success() => {
                serde_json::from_slice::<TokenizeResponse>(&bytes)
                    .map(|a| a.tokens)
                    .ok()
            }
            _ => None,
        };
        if tokens.is_none() {
            tracing::warn!(model = %parsed.model, engine = %base, "the engine did not tokenize the prompt; the built-in tokenizer stands in");
        }
        tokens
    }
}
