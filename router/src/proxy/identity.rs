//! Identity: who a step belongs to and what its prompt is. The session (and a fork's
//! child session) come from headers and body; the prompt's tokens and block hashes are
//! computed once, as one [`HashedPrompt`] that every later stage reads (the view, the
//! dispatch legs, and the ownership records of the feedback stage).
//!
//! A session's prompt is kept for its next step, which then tokenizes and hashes only
//! what it adds, extending the kept prompt's vectors in place when nobody else holds it
//! (`PromptCache::take`, [`KeptPrompt`]). Prompts over `OFFLOAD_PROMPT_BYTES` (16 KiB)
//! are rendered, tokenized and hashed on the blocking pool, one computation per input at
//! a time ([`PromptFlights`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};

use bytes::Bytes;
use ownerserve_planner::hash::{
    block_seed, hashes_after, HashedPrompt, KeptChain, KeptPrompt, XXH3_SEED,
};
use ownerserve_planner::tokenized::Tokenized;

use ownerserve_shim::hf_tokenizer::{HfTokenizer, HfTokenizerError};
use ownerserve_shim::openai::{ParsedRequest, Prompt, PromptInput, RenderedPrompt, RequestError};

use crate::config::ModelTokenizer;
use crate::error::ApiError;
use crate::headers;
use crate::prompt_cache::{InputDigest, PromptCache};
use crate::prompt_flights::{FlightError, FlightSettings, PromptFlights};
use crate::registry::{Registry, ServedModel};
use crate::upstream::EngineCalls;

/// Prompts with more text than this are tokenized and hashed on the blocking pool, so a
/// 100K-token prompt (a millisecond or more of CPU) never stalls the runtime thread that
/// relays every other request's stream. Below it, the hand-off costs more than it saves.
const OFFLOAD_PROMPT_BYTES: usize = 16 * 1024;

/// Who a step belongs to and its prompt.
#[derive(Debug)]
pub struct Identity<'a> {
    /// The session (the agent or thread; see [`super::agent_identity`]): `x-session-id`,
    /// a coding agent's own headers, OpenAI's `user`, `metadata.session_id`. `None` for a
    /// side request (a title, a compaction), which must not move the session's owner.
    pub session: Option<&'a str>,
    /// The conversation's root session and the agent's parent (grouping).
    pub root: Option<&'a str>,
    pub parent: Option<&'a str>,
    /// A side request of `root`'s conversation.
    pub side: bool,
    /// The client marked the step as a fork of its session.
    pub fork: bool,
    /// The child session a fork (`n > 1` or the fork header) starts; the parent stays put.
    pub child: Option<String>,
    /// Tokens and block hashes (empty when nothing downstream reads them).
    pub prompt: Arc<HashedPrompt>,
}

impl Identity<'_> {
    /// The session this step's activity counts for: a fork's child, else the session.
    pub fn tracked(&self) -> Option<&str> {
        self.child.as_deref().or(self.session)
    }

    /// Prompt length in tokens (0 when not tokenized).
    pub fn prompt_tokens(&self) -> u32 {
        u32::try_from(self.prompt.tokenized.tokens.len()).unwrap_or(u32::MAX)
    }

    pub fn hashes(&self) -> &[u64] {
        &self.prompt.hashes
    }
}

/// What the identity stage does with the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hashing {
    /// Nothing downstream reads tokens or hashes: skip the work.
    Skip,
    /// Tokenize and hash; keep a session's prompt for its next step.
    Keep,
    /// Tokenize and hash, reusing a kept prompt but keeping nothing (a dry run).
    Peek,
}

/// Tokenizes and hashes prompts, keeping each session's last one.
pub struct PromptHasher {
    block_size: usize,
    cache: Arc<PromptCache>,
    /// Long prompts' computations: one per input at a time, bounded, waited for within a limit.
    flights: PromptFlights<HashedPrompt, PromptError>,
    /// Models not tokenized with the built-in tokenizer.
    tokenizers: BTreeMap<String, ModelTokenizer>,
    /// How `engine` models reach an engine's `/tokenize`.
    engines: Option<Engines>,
}

/// The engines a `tokenizer = "engine"` model asks.
pub struct Engines {
    pub calls: Arc<dyn EngineCalls>,
    pub registry: Arc<Registry>,
}

/// vLLM's (and SGLang's) tokenize endpoint.
const TOKENIZE_PATH: &str = "/tokenize";

/// An engine's `/tokenize` answer (its other fields are not needed).
#[derive(serde::Deserialize)]
struct TokenizeAnswer {
    tokens: Vec<u32>,
}

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
    /// Hashes in blocks of `block_size` tokens, keeping up to `cache_bytes` of prompts;
    /// `tokenizers` names the models with their own tokenizer.
    pub fn new(
        block_size: usize,
        cache_bytes: usize,
        tokenizers: BTreeMap<String, ModelTokenizer>,
        engines: Option<Engines>,
    ) -> Self {
        Self {
            block_size,
            cache: Arc::new(PromptCache::new(cache_bytes)),
            flights: PromptFlights::new(FlightSettings::default()),
            tokenizers,
            engines,
        }
    }

    /// Whether a prompt is being computed on the blocking pool right now.
    pub fn handing_off(&self) -> bool {
        self.flights.in_flight() > 0
    }

    /// Long prompts computed with these settings.
    pub fn with_flights(mut self, settings: FlightSettings) -> Self {
        self.flights = PromptFlights::new(settings);
        self
    }

    /// The prompt's tokens as an engine serving the model tokenizes them (its
    /// `POST /tokenize`); `None` when no engine answers, and the built-in tokenizer stands in.
    async fn hash_by_engine(
        &self,
        parsed: &ParsedRequest<'_>,
        session: Option<&str>,
        hashing: Hashing,
    ) -> Result<Option<Arc<HashedPrompt>>, ApiError> {
        let Some(tokens) = self.engine_tokens(parsed).await else {
            return Ok(None);
        };
        let kept = self.kept(&parsed.model, session, hashing, InputDigest::default());
        let tokenized = Tokenized::from_tokens(tokens);
        // The engine's tokens reuse nothing: compared with the kept prompt's whole.
        let chain = kept.prev.as_deref().map(KeptChain::Shared);
        let hashes = hashes_after(chain, &tokenized, self.block_size, kept.seed);
        let hashed = Arc::new(HashedPrompt { tokenized, hashes });
        self.remember(kept.key, &hashed, InputDigest::default());
        Ok(Some(hashed))
    }

    /// Asks the first healthy engine serving the model.
    async fn engine_tokens(&self, parsed: &ParsedRequest<'_>) -> Option<Vec<u32>> {
        let engines = self.engines.as_ref()?;
        let worker = engines
            .registry
            .candidates(&parsed.model, &[], None)
            .into_iter()
            .find(|w| w.healthy)?;
        let base = engines.registry.get(worker.id)?.spec.base_url.clone();
        let model = serde_json::to_string(parsed.model.as_ref()).ok()?;
        let body = match &parsed.prompt {
            Prompt::Chat(_) => {
                let t = &parsed.template;
                let tools = t
                    .tools_json
                    .as_deref()
                    .map(|j| format!(r#","tools":{j}"#))
                    .unwrap_or_default();
                format!(
                    r#"{{"model":{model},"messages":{},"add_generation_prompt":{}{tools}}}"#,
                    t.messages_json.as_deref().unwrap_or("[]"),
                    t.add_generation_prompt
                )
            }
            Prompt::Completion(prompts) => match prompts.first()? {
                PromptInput::Text(t) => format!(
                    r#"{{"model":{model},"prompt":{}}}"#,
                    serde_json::to_string(t.as_ref()).ok()?
                ),
                PromptInput::Tokens(t) => return Some(t.clone()),
            },
        };
        let answer = engines
            .calls
            .post(&base, TOKENIZE_PATH, &[], Bytes::from(body))
            .await;
        let tokens = match answer {
            Ok((status, bytes)) if status.is_success() => {
                serde_json::from_slice::<TokenizeAnswer>(&bytes)
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

    /// The prompt's tokens and block hashes by the model's own tokenizer.
    async fn hash_with(
        &self,
        tokenizer: &Arc<HfTokenizer>,
        parsed: &ParsedRequest<'_>,
        session: Option<&str>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        let Kept {
            key,
            prev,
            seed,
            same,
        } = self.kept(&parsed.model, session, hashing, digest);
        // This very input's prompt: a taken one goes back to the cache as it is.
        if let (true, Some(prev)) = (same, &prev) {
            self.remember(key, prev, digest);
            return Ok(prev.clone());
        }
        let input = model_input(tokenizer, parsed)?;
        let keep = key.is_some();
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
        self.compute(size, digest, key, work).await
    }

    /// The prompt's tokens and block hashes by the built-in tokenizer; `render` makes the
    /// prompt, only when the cache does not hold this very input already (rendering a
    /// chat is most of what a prompt sent again would cost). No prompt: no tokens.
    pub async fn hash(
        &self,
        render: impl FnOnce() -> Option<RenderedPrompt>,
        model: &str,
        session: Option<&str>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        let Kept {
            key,
            prev,
            seed,
            same,
        } = self.kept(model, session, hashing, digest);
        // This very input's prompt: a taken one goes back to the cache as it is.
        if let (true, Some(prev)) = (same, &prev) {
            self.remember(key, prev, digest);
            return Ok(prev.clone());
        }
        let Some(prompt) = render() else {
            return Ok(Arc::default());
        };
        let keep = key.is_some();
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
        self.compute(prompt_len, digest, key, work).await
    }

    /// Runs `work` (a prompt of `size` bytes) and keeps its result under `key`: here for a
    /// small prompt, else as the one computation of its input in flight
    /// ([`PromptFlights`]), which keeps its result even when this request has gone.
    async fn compute(
        &self,
        size: usize,
        digest: InputDigest,
        key: Option<String>,
        work: impl FnOnce() -> Result<HashedPrompt, PromptError> + Send + 'static,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        if size < OFFLOAD_PROMPT_BYTES {
            let hashed = Arc::new(work().map_err(PromptError::into_api)?);
            self.remember(key, &hashed, digest);
            return Ok(hashed);
        }
        let (cache, leader) = (self.cache.clone(), key.clone());
        let done = move |hashed: &Arc<HashedPrompt>| {
            if let Some(k) = leader {
                cache.keep(&k, hashed.clone(), digest);
            }
        };
        let hashed = self
            .flights
            .run(digest.0, work, done)
            .await
            .map_err(flight_error)?;
        // A request that joined another's computation keeps it under its own key.
        self.remember(key, &hashed, digest);
        Ok(hashed)
    }

    /// The session's last prompt of this model, and the key to keep this step's under
    /// (`None`: nothing is kept). Kept per model: a prompt tokenized by another
    /// tokenizer is no base to extend.
    fn kept(
        &self,
        model: &str,
        session: Option<&str>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Kept {
        let key = session.map(|s| {
            let mut key = String::with_capacity(model.len() + 1 + s.len());
            key.push_str(model);
            key.push('\u{1f}');
            key.push_str(s);
            key
        });
        // A step that keeps its prompt takes the kept one out to extend it in place
        // (`PromptCache::take`; a step whose prompt then fails to compute loses it, and
        // the session's next step tokenizes whole); a dry run only reads it.
        let found = key.as_deref().and_then(|k| match hashing {
            Hashing::Keep => self.cache.take(k),
            _ => self.cache.lookup(k),
        });
        let same = found.as_ref().is_some_and(|(_, d)| d.matches(digest));
        Kept {
            key: key.filter(|_| hashing == Hashing::Keep),
            prev: found.map(|(p, _)| p),
            seed: self.seed_of(model),
            same,
        }
    }

    /// The hash seed of `model`'s blocks: a LoRA adapter's KV is its own (the engine keys
    /// its blocks by the adapter's name, and the index chains them apart), so its blocks
    /// never match the base model's.
    fn seed_of(&self, model: &str) -> u64 {
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

    /// The tokenizer of `model`: its own entry, else its base model's (a LoRA adapter
    /// tokenizes as its base).
    fn tokenizer_of(&self, model: &str, served: Option<&ServedModel>) -> Option<&ModelTokenizer> {
        self.tokenizers.get(model).or_else(|| {
            served
                .and_then(|m| m.parent.as_deref())
                .and_then(|p| self.tokenizers.get(p))
        })
    }

    /// Keeps `hashed` as the session's last prompt, under a key from [`Self::kept`].
    fn remember(&self, key: Option<String>, hashed: &Arc<HashedPrompt>, digest: InputDigest) {
        if let Some(k) = key {
            self.cache.keep(&k, hashed.clone(), digest);
        }
    }
}

/// A session's last prompt and where to keep its next one.
struct Kept {
    key: Option<String>,
    prev: Option<Arc<HashedPrompt>>,
    /// The model's hash seed ([`PromptHasher::seed_of`]).
    seed: u64,
    /// `prev` was computed from this request's very input: it is this prompt.
    same: bool,
}

/// Why a prompt's computation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PromptError {
    /// The chat template refused the request (the client's error, as the engine's would be).
    #[error("{0}")]
    Template(String),
    #[error("{0}")]
    Encode(String),
}

impl PromptError {
    fn encode(e: HfTokenizerError) -> Self {
        PromptError::Encode(e.to_string())
    }

    fn into_api(self) -> ApiError {
        match self {
            PromptError::Template(e) => ApiError::BadRequest(RequestError::chat_template(e)),
            PromptError::Encode(e) => ApiError::Internal(e),
        }
    }
}

/// A computation in flight that gave no prompt, as the client's error.
fn flight_error(e: FlightError<PromptError>) -> ApiError {
    match e {
        FlightError::Full { .. } => ApiError::RouterBusy {
            why: "too many long prompts are being tokenized or waiting to be",
        },
        FlightError::TimedOut { after } => ApiError::TokenizeTimeout { after },
        FlightError::Lost(e) => ApiError::Internal(format!("tokenizing failed: {e}")),
        FlightError::Work(e) => e.into_api(),
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

/// The step's identity; `request_id` names an unnamed fork's child.
pub async fn identify<'a>(
    hasher: &PromptHasher,
    headers: &'a HeaderMap,
    parsed: &'a ParsedRequest<'_>,
    request_id: &HeaderValue,
    hashing: Hashing,
) -> Result<Identity<'a>, ApiError> {
    let ids = super::agent_identity::agent_ids(headers, parsed);
    let session = ids.agent.filter(|_| !ids.side);
    // The prompt kept for the next step: per context window (a Codex compaction starts a
    // new one, whose prefix shares nothing with the old).
    let kept_as = ids.window.or(session).filter(|_| !ids.side);
    // Without a session, a prompt is kept under its first bytes: the next one starting
    // the same way (a shared system prompt, the same prompt again) reuses it.
    let input = match hashing {
        Hashing::Skip => None,
        _ => prompt_input(parsed),
    };
    let content_key = match (kept_as, &input) {
        (None, Some(i)) => Some(content_key(i)),
        _ => None,
    };
    let kept_as = kept_as.or(content_key.as_deref());
    let digest = input.as_ref().map_or(InputDigest::default(), |i| {
        InputDigest::of(&[parsed.model.as_bytes(), i.0, i.1, &[u8::from(i.2)]])
    });
    let fork = fork_of(headers);
    let child = (fork.is_some() || parsed.sampling.n > 1)
        .then(|| session.map(|s| child_session(s, fork, request_id)))
        .flatten();
    let served = hasher
        .engines
        .as_ref()
        .and_then(|e| e.registry.served(&parsed.model));
    let by_model = match (hashing, hasher.tokenizer_of(&parsed.model, served.as_ref())) {
        (Hashing::Skip, _) => Some(Arc::default()),
        (hashing, Some(ModelTokenizer::Own(t))) => Some(
            hasher
                .hash_with(t, parsed, kept_as, hashing, digest)
                .await?,
        ),
        (hashing, Some(ModelTokenizer::Engine)) => {
            hasher.hash_by_engine(parsed, kept_as, hashing).await?
        }
        (_, None) => None,
    };
    // The built-in tokenizer: for models without their own, and when no engine answers.
    // Token ids are exact whichever tokenizer there is.
    let exact = by_model.is_some()
        || matches!(&parsed.prompt, Prompt::Completion(p) if matches!(p.first(), Some(PromptInput::Tokens(_))));
    let prompt = match by_model {
        Some(prompt) => prompt,
        None => {
            // An engine model's stand-in tokens are not its engine's: kept, never reused whole.
            let digest = match hasher.tokenizer_of(&parsed.model, served.as_ref()) {
                Some(ModelTokenizer::Engine) => InputDigest::default(),
                _ => digest,
            };
            let render = || parsed.rendered_prompts().into_iter().next();
            hasher
                .hash(render, &parsed.model, kept_as, hashing, digest)
                .await?
        }
    };
    if let Some(limit) = served.and_then(|m| m.max_model_len).filter(|_| exact) {
        let (tokens, completion) = (
            prompt.tokenized.tokens.len(),
            parsed.sampling.max_tokens.unwrap_or(1),
        );
        if tokens + completion as usize > limit as usize {
            return Err(RequestError::context_length(limit, tokens, completion).into());
        }
    }
    Ok(Identity {
        session,
        root: ids.root,
        parent: ids.parent,
        side: ids.side,
        fork: fork.is_some(),
        child,
        prompt,
    })
}

/// Bytes of a sessionless prompt's input its cache key is made of.
const CONTENT_KEY_BYTES: usize = 2048;

/// What a prompt is computed from: chat's messages and tools (as sent) and whether the
/// generation prompt is added, or the first completions prompt's text; `None` for token
/// ids (nothing to render or tokenize).
fn prompt_input<'p>(parsed: &'p ParsedRequest<'_>) -> Option<(&'p [u8], &'p [u8], bool)> {
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
fn content_key(input: &(&[u8], &[u8], bool)) -> String {
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

/// The fork a request asks for: `x-ownerserve-fork: <child session>` (or `1`/`true`);
/// empty, `0` and `false` ask for none.
fn fork_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(headers::FORK)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && !matches!(*v, "0" | "false"))
}

/// The child session of a fork of `session`: the header's name, or one made up from the
/// request id (`x-ownerserve-fork: 1`, or `n > 1` without the header).
fn child_session(session: &str, fork: Option<&str>, request_id: &HeaderValue) -> String {
    match fork {
        Some(named) if !matches!(named, "1" | "true") => named.to_owned(),
        _ => format!("{session}/fork-{}", request_id.to_str().unwrap_or("fork")),
    }
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::hash::prompt_hashes;
    use ownerserve_shim::openai::{parse, Endpoint};

    use super::*;
    use crate::upstream::EngineCalls;

    #[test]
    fn a_content_key_is_the_hash_of_the_first_bytes_in_hex() {
        let body = b"0123456789";
        let key = content_key(&(&body[..], &b""[..], false));
        let hash = xxhash_rust::xxh3::xxh3_64(body);
        assert_eq!(key, format!("#{hash:016x}"));
    }

    fn chat(text: &str, n: u32) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "model": "m", "n": n, "messages": [{"role": "user", "content": text}]
        }))
        .unwrap()
    }

    type Pairs = &'static [(&'static str, &'static str)];

    const SESSION: &str = "x-session-id";
    const FORK: &str = "x-ownerserve-fork";

    fn headers(pairs: Pairs) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[tokio::test]
    async fn a_session_step_hashes_like_a_fresh_prompt_and_is_kept_for_the_next() {
        let hasher = PromptHasher::new(16, 1 << 20, BTreeMap::new(), None);
        let h = headers(&[(SESSION, "s1")]);
        let rid = HeaderValue::from_static("r1");
        let long = "tool output line\n".repeat(400);
        let mut texts = vec![
            long.clone(),
            format!("{long} and then more"),
            "unrelated".into(),
        ];
        texts.push(format!("{long}{}", "x".repeat(20_000)));
        for text in texts {
            let body = chat(&text, 1);
            let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
            let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
                .await
                .unwrap();
            let whole = parsed.prompt_tokens().remove(0);
            assert_eq!(id.session, Some("s1"));
            assert_eq!(id.prompt.tokenized.tokens, whole);
            assert_eq!(id.hashes(), prompt_hashes(&whole, 16, XXH3_SEED));
            assert_eq!(hasher.cache.get("m\u{1f}s1").as_deref(), Some(&*id.prompt));
        }
    }

    #[tokio::test]
    async fn a_sessionless_prompt_sent_again_is_reused_whole_and_one_starting_alike_extends_it() {
        let hasher = PromptHasher::new(16, 1 << 20, BTreeMap::new(), None);
        let (h, rid) = (headers(&[]), HeaderValue::from_static("r1"));
        let system = "You are a coding agent. ".repeat(200);
        let first = chat(&format!("{system} fix the bug"), 1);
        let parsed = parse(&first, Endpoint::ChatCompletions).unwrap();
        let a = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        let b = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        assert!(
            Arc::ptr_eq(&a.prompt, &b.prompt),
            "the same input is not computed again"
        );
        // Another prompt with the same start: computed (from the kept one), as from scratch.
        for text in [
            format!("{system} add a test"),
            format!("{system} fix the bug "),
        ] {
            let body = chat(&text, 1);
            let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
            let c = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
                .await
                .unwrap();
            let whole = parsed.prompt_tokens().remove(0);
            assert_eq!(c.prompt.tokenized.tokens, whole);
            assert_eq!(c.hashes(), prompt_hashes(&whole, 16, XXH3_SEED));
            assert!(!Arc::ptr_eq(&a.prompt, &c.prompt));
        }
        // Another model's same input is its own.
        let other = serde_json::to_vec(&serde_json::json!({
            "model": "m2", "messages": [{"role": "user", "content": format!("{system} fix the bug")}]
        }))
        .unwrap();
        let parsed = parse(&other, Endpoint::ChatCompletions).unwrap();
        let d = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        assert!(!Arc::ptr_eq(&a.prompt, &d.prompt));
    }

    #[tokio::test]
    async fn a_dry_run_keeps_nothing_and_skipping_hashes_nothing() {
        let hasher = PromptHasher::new(16, 1 << 20, BTreeMap::new(), None);
        let h = headers(&[(SESSION, "s1")]);
        let rid = HeaderValue::from_static("r1");
        let body = chat("hello there", 1);
        let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
        let peek = identify(&hasher, &h, &parsed, &rid, Hashing::Peek)
            .await
            .unwrap();
        assert!(!peek.prompt.tokenized.tokens.is_empty());
        assert!(hasher.cache.get("m\u{1f}s1").is_none());
        let skip = identify(&hasher, &h, &parsed, &rid, Hashing::Skip)
            .await
            .unwrap();
        assert_eq!(skip.prompt_tokens(), 0);
        assert!(skip.hashes().is_empty());
    }

    #[tokio::test]
    async fn a_model_with_its_own_tokenizer_gets_the_engines_ids_and_keeps_them_per_session() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../workers-shim/tests/fixtures/tokenizers"
        );
        let local = HfTokenizer::from_dir(&std::path::Path::new(dir).join("local")).unwrap();
        let own = ModelTokenizer::Own(Arc::new(local));
        let hasher = PromptHasher::new(16, 1 << 20, [("tiny".to_owned(), own)].into(), None);
        let golden = std::fs::read_to_string(format!("{dir}/local.jsonl")).unwrap();
        let h = headers(&[(SESSION, "s1")]);
        let rid = HeaderValue::from_static("r1");
        // Golden conversations as successive steps of one session: each step's ids are
        // transformers' ids, whether tokenized whole or from the step before.
        for line in golden.lines().take(20) {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let body = serde_json::to_vec(
                &serde_json::json!({"model": "tiny", "messages": case["messages"]}),
            )
            .unwrap();
            let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
            let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
                .await
                .unwrap();
            let want: Vec<u32> = serde_json::from_value(case["chat_ids"].clone()).unwrap();
            assert_eq!(id.prompt.tokenized.tokens, want);
            assert_eq!(id.hashes(), prompt_hashes(&want, 16, XXH3_SEED));
        }
        assert!(hasher.cache.get("tiny\u{1f}s1").is_some());
        // A template that refuses its input is the client's error, as the engine's would be.
        let bad = br#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": "yes"}"#;
        assert!(parse(bad, Endpoint::ChatCompletions).is_err());
    }

    #[tokio::test]
    async fn agent_api_bodies_render_through_the_models_chat_template_like_chat() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../workers-shim/tests/fixtures/tokenizers/local"
        );
        let own = ModelTokenizer::Own(Arc::new(
            HfTokenizer::from_dir(std::path::Path::new(dir)).unwrap(),
        ));
        let hasher = PromptHasher::new(16, 1 << 20, [("tiny".to_owned(), own)].into(), None);
        let (h, rid) = (headers(&[]), HeaderValue::from_static("r1"));
        let chat = br#"{"model":"tiny","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"list the files"}]}"#;
        let messages = br#"{"model":"tiny","max_tokens":8,"system":[{"type":"text","text":"be brief"}],"messages":[{"role":"user","content":[{"type":"text","text":"list the files"}]}]}"#;
        let responses = br#"{"model":"tiny","instructions":"be brief","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"list the files"}]}]}"#;
        let mut tokens = Vec::new();
        for (body, endpoint) in [
            (&chat[..], Endpoint::ChatCompletions),
            (&messages[..], Endpoint::Messages),
            (&responses[..], Endpoint::Responses),
        ] {
            let parsed = parse(body, endpoint).unwrap();
            let id = identify(&hasher, &h, &parsed, &rid, Hashing::Peek)
                .await
                .unwrap();
            tokens.push(id.prompt.tokenized.tokens.clone());
        }
        assert!(!tokens[0].is_empty());
        assert_eq!(tokens[0], tokens[1], "Messages renders as chat");
        assert_eq!(tokens[0], tokens[2], "Responses renders as chat");
    }

    /// An engine whose `/tokenize` answers fixed tokens, recording each body.
    struct TokenizingEngine(std::sync::Mutex<Vec<serde_json::Value>>);

    impl EngineCalls for TokenizingEngine {
        fn post<'a>(
            &'a self,
            _base_url: &'a str,
            path: &'a str,
            _headers: &'a [(axum::http::HeaderName, HeaderValue)],
            body: Bytes,
        ) -> crate::upstream::BoxFuture<
            'a,
            Result<crate::upstream::SmallAnswer, crate::upstream::ForwardError>,
        > {
            assert_eq!(path, TOKENIZE_PATH);
            self.0
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&body).unwrap());
            let answer = serde_json::json!({"count": 40, "max_model_len": 8192, "tokens": (0..40).collect::<Vec<u32>>()});
            Box::pin(
                async move { Ok((axum::http::StatusCode::OK, Bytes::from(answer.to_string()))) },
            )
        }
    }

    #[tokio::test]
    async fn an_engine_model_is_tokenized_by_the_engine_and_without_one_by_the_builtin() {
        use crate::config::WorkerSpec;
        use ownerserve_planner::ids::{EngineKind, Role};
        let registry = Arc::new(Registry::new(vec![WorkerSpec::new(
            "e",
            "http://127.0.0.1:1",
            Role::Hybrid,
            EngineKind::Vllm,
        )]));
        let engine = Arc::new(TokenizingEngine(std::sync::Mutex::default()));
        let engines = Engines {
            calls: engine.clone(),
            registry: registry.clone(),
        };
        let hasher = PromptHasher::new(
            16,
            1 << 20,
            [("m".to_owned(), ModelTokenizer::Engine)].into(),
            Some(engines),
        );
        let body = br#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}"#;
        let parsed = parse(body, Endpoint::ChatCompletions).unwrap();
        let (h, rid) = (headers(&[(SESSION, "s1")]), HeaderValue::from_static("r1"));
        // No healthy engine: the built-in tokenizer stands in.
        let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        assert_eq!(id.prompt.tokenized.tokens, parsed.prompt_tokens().remove(0));
        assert!(engine.0.lock().unwrap().is_empty());
        registry.all()[0].mark_healthy(vec!["m".into()]);
        let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        assert_eq!(id.prompt.tokenized.tokens, (0..40).collect::<Vec<u32>>());
        assert_eq!(id.hashes().len(), 2);
        let sent = engine.0.lock().unwrap()[0].clone();
        assert_eq!(sent["model"], "m");
        assert_eq!(sent["messages"][0]["content"], "hi");
        assert_eq!(sent["tools"][0]["type"], "function");
        assert_eq!(sent["add_generation_prompt"], true);
    }

    /// A hasher with the tiny model's own tokenizer for `tiny`, in front of one healthy
    /// worker serving `tiny` (context 64) and its LoRA adapter `tiny-lora`.
    fn hasher_for_lora_and_limits() -> PromptHasher {
        use crate::config::WorkerSpec;
        use crate::registry::ServedModel;
        use ownerserve_planner::ids::{EngineKind, Role};
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../workers-shim/tests/fixtures/tokenizers/local"
        );
        let own = ModelTokenizer::Own(Arc::new(
            HfTokenizer::from_dir(std::path::Path::new(dir)).unwrap(),
        ));
        let registry = Arc::new(Registry::new(vec![WorkerSpec::new(
            "e",
            "http://127.0.0.1:1",
            Role::Hybrid,
            EngineKind::Vllm,
        )]));
        registry.all()[0].mark_healthy(vec![
            ServedModel {
                max_model_len: Some(64),
                ..ServedModel::from("tiny")
            },
            ServedModel {
                parent: Some("tiny".into()),
                ..ServedModel::from("tiny-lora")
            },
        ]);
        let engines = Engines {
            calls: Arc::new(TokenizingEngine(std::sync::Mutex::default())),
            registry,
        };
        PromptHasher::new(
            16,
            1 << 20,
            [("tiny".to_owned(), own)].into(),
            Some(engines),
        )
    }

    #[tokio::test]
    async fn a_lora_adapter_tokenizes_as_its_base_and_hashes_its_own_chain() {
        let hasher = hasher_for_lora_and_limits();
        let text = "def route(request): return the worker that holds the prefix ".repeat(3);
        let (h, rid) = (headers(&[]), HeaderValue::from_static("r1"));
        let mut ids = Vec::new();
        for model in ["tiny", "tiny-lora"] {
            let body = serde_json::to_vec(&serde_json::json!({
                "model": model, "max_tokens": 1, "messages": [{"role": "user", "content": text}]
            }))
            .unwrap();
            let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
            ids.push(
                identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
                    .await
                    .unwrap()
                    .prompt,
            );
        }
        let (base, lora) = (&ids[0], &ids[1]);
        assert_eq!(
            base.tokenized.tokens, lora.tokenized.tokens,
            "the base's tokenizer"
        );
        assert!(!base.hashes.is_empty());
        assert_eq!(
            base.hashes,
            prompt_hashes(&base.tokenized.tokens, 16, XXH3_SEED)
        );
        // The index chains an engine's blocks computed with the adapter under this seed.
        let seed = block_seed(Some("tiny-lora"), None);
        assert_eq!(lora.hashes, prompt_hashes(&lora.tokenized.tokens, 16, seed));
        assert!(base.hashes.iter().all(|h| !lora.hashes.contains(h)));
    }

    #[tokio::test]
    async fn a_prompt_over_the_engines_context_is_refused_before_any_engine_sees_it() {
        let hasher = hasher_for_lora_and_limits();
        let (h, rid) = (headers(&[]), HeaderValue::from_static("r1"));
        let run = |body: serde_json::Value, endpoint| {
            let bytes = serde_json::to_vec(&body).unwrap();
            let hasher = &hasher;
            let (h, rid) = (&h, &rid);
            async move {
                let parsed = parse(&bytes, endpoint).unwrap();
                identify(hasher, h, &parsed, rid, Hashing::Keep)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
        };
        // Token ids are exact with any tokenizer: 60 + 4 fits in 64, 60 + 5 does not.
        let ids = |n: u32| (0..n).collect::<Vec<u32>>();
        let fits = serde_json::json!({"model": "tiny", "prompt": ids(60), "max_tokens": 4});
        assert_eq!(run(fits, Endpoint::Completions).await, Ok(()));
        let over = serde_json::json!({"model": "tiny", "prompt": ids(60), "max_tokens": 5});
        assert_eq!(
            run(over, Endpoint::Completions).await,
            Err("This model's maximum context length is 64 tokens. However, you requested 65 tokens (60 in the messages, 5 in the completion). Please reduce the length of the messages or completion.".into())
        );
        // A token id past the model's vocabulary (4,096 here) never reaches an engine.
        let oov =
            serde_json::json!({"model": "tiny", "prompt": [[1, 2], [3, 4096]], "max_tokens": 1});
        assert_eq!(
            run(oov, Endpoint::Completions).await,
            Err("token id 4096 is outside the model's vocabulary of 4096 tokens".into())
        );
        // Chat with the model's own tokenizer: exact too.
        let long = "word ".repeat(200);
        let chat =
            serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": long}]});
        assert!(run(chat, Endpoint::ChatCompletions)
            .await
            .unwrap_err()
            .contains("maximum context length is 64"));
    }

    #[tokio::test]
    async fn forks_start_a_child_session_named_by_the_header_or_the_request_id() {
        let hasher = PromptHasher::new(16, 0, BTreeMap::new(), None);
        let rid = HeaderValue::from_static("r9");
        let one = chat("hi", 1);
        let three = chat("hi", 3);
        let parsed_one = parse(&one, Endpoint::ChatCompletions).unwrap();
        let parsed_three = parse(&three, Endpoint::ChatCompletions).unwrap();
        type Case<'a> = (Pairs, &'a ParsedRequest<'a>, Option<&'a str>);
        let cases: [Case<'_>; 5] = [
            (&[(SESSION, "s")], &parsed_one, None),
            (
                &[(SESSION, "s"), (FORK, "1")],
                &parsed_one,
                Some("s/fork-r9"),
            ),
            (&[(SESSION, "s"), (FORK, "kid")], &parsed_one, Some("kid")),
            (&[(SESSION, "s"), (FORK, "false")], &parsed_one, None),
            (&[(SESSION, "s")], &parsed_three, Some("s/fork-r9")),
        ];
        for (pairs, parsed, child) in cases {
            let h = headers(pairs);
            let id = identify(&hasher, &h, parsed, &rid, Hashing::Skip)
                .await
                .unwrap();
            assert_eq!(id.child.as_deref(), child, "{pairs:?}");
            assert_eq!(id.tracked(), child.or(Some("s")));
        }
        // Without a session there is nothing to fork.
        let h = headers(&[(FORK, "1")]);
        let id = identify(&hasher, &h, &parsed_one, &rid, Hashing::Skip)
            .await
            .unwrap();
        assert_eq!((id.fork, id.child), (true, None));
    }
}
