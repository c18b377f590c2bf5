//! The prompt on the router's side: what a step's prompt is, in tokens and block hashes,
//! computed once per step as one [`HashedPrompt`] that every later stage reads (the view,
//! the dispatch legs, and the ownership records of the feedback stage).
//!
//! - [`backend`]: each model's tokenizer: its own (`tokenizer.json` and chat template, by
//!   `ownerserve_shim::hf_tokenizer`), its engine's `POST /tokenize` ([`engine_tokenize`]),
//!   or the built-in one.
//! - [`hashing`]: the block hashes (`ownerserve_planner::hash`), each model's hash seed, and
//!   the digest and key a prompt is kept under.
//! - [`cache`]: each session's last prompt. Its next step tokenizes and hashes only what it
//!   adds, extending the kept prompt's vectors in place when nobody else holds it
//!   (`PromptCache::take`, `KeptPrompt`); a closed session's go at once
//!   ([`PromptHasher::forget_session`]).
//! - [`flights`]: prompts over `OFFLOAD_PROMPT_BYTES` (16 KiB) are rendered, tokenized and
//!   hashed on the blocking pool, one computation per input at a time.
//! - [`error`]: why a prompt's computation failed, as the client's error.

pub mod backend;
pub mod cache;
pub mod engine_tokenize;
pub mod error;
pub mod flights;
pub mod hashing;

use std::collections::BTreeMap;
use std::sync::Arc;

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_shim::openai::{ParsedRequest, Prompt, PromptInput};

use crate::config::ModelTokenizer;
use crate::error::ApiError;
use cache::{InputDigest, PromptCache};
pub use engine_tokenize::Engines;
use error::flight_error;
pub use error::PromptError;
use flights::{FlightSettings, PromptFlights};

/// Prompts with more text than this are tokenized and hashed on the blocking pool, so a
/// 100K-token prompt (a millisecond or more of CPU) never stalls the runtime thread that
/// relays every other request's stream. Below it, the hand-off costs more than it saves.
const OFFLOAD_PROMPT_BYTES: usize = 16 * 1024;

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

/// A step's prompt, and the context it must fit in.
#[derive(Debug)]
pub struct Prompted {
    pub hashed: Arc<HashedPrompt>,
    /// The served model's context length (`max_model_len`), when the prompt's token count
    /// is exact (the model's own tokenizer or its engine's, or token ids): ingress refuses
    /// a request that does not fit.
    pub context_limit: Option<u32>,
    /// The tokens are the engine's own (the model's tokenizer or its engine's, or token
    /// ids): a request re-sending them hits the same cached blocks.
    pub exact: bool,
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

    /// Forgets the prompts kept for session `session` (every model's, every context
    /// window's): its client closed it, so no step will extend them. Returns the bytes
    /// freed.
    pub fn forget_session(&self, session: &str) -> usize {
        self.cache.forget(session)
    }

    /// Bytes of prompts kept now.
    pub fn cached_bytes(&self) -> usize {
        self.cache.bytes()
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

    /// The prompt of `parsed`, kept (with [`Hashing::Keep`]) under `kept_as` (the session's
    /// context window), else under its input's first bytes: the next prompt starting the
    /// same way (a shared system prompt, the same prompt again) reuses it. A session's
    /// first step (nothing kept under `kept_as` yet) starts from the last prompt that began
    /// as it does, and is kept under those first bytes too: a new session or subagent
    /// sending the system prompt and tools another has sent tokenizes only what is new.
    pub async fn prompt(
        &self,
        parsed: &ParsedRequest<'_>,
        kept_as: Option<&str>,
        hashing: Hashing,
    ) -> Result<Prompted, ApiError> {
        let input = match hashing {
            Hashing::Skip => None,
            _ => hashing::prompt_input(parsed),
        };
        let start = input.as_ref().map(hashing::content_key);
        let keys = match kept_as {
            Some(own) => Keys {
                own: Some(own),
                start: start.as_deref(),
            },
            None => Keys {
                own: start.as_deref(),
                start: None,
            },
        };
        let digest = input.as_ref().map_or(InputDigest::default(), |i| {
            InputDigest::of(&[parsed.model.as_bytes(), i.0, i.1, &[u8::from(i.2)]])
        });
        let served = self
            .engines
            .as_ref()
            .and_then(|e| e.registry.served(&parsed.model));
        let tokenizer = self.tokenizer_of(&parsed.model, served.as_ref());
        let by_model = match (hashing, tokenizer) {
            (Hashing::Skip, _) => Some(Arc::default()),
            (hashing, Some(ModelTokenizer::Own(t))) => {
                Some(self.hash_with(t, parsed, keys, hashing, digest).await?)
            }
            (hashing, Some(ModelTokenizer::Engine)) => {
                self.hash_by_engine(parsed, keys, hashing).await?
            }
            (_, None) => None,
        };
        // The built-in tokenizer: for models without their own, and when no engine answers.
        // Token ids are exact whichever tokenizer there is.
        let exact = by_model.is_some()
            || matches!(&parsed.prompt, Prompt::Completion(p) if matches!(p.first(), Some(PromptInput::Tokens(_))));
        let hashed = match by_model {
            Some(prompt) => prompt,
            None => {
                // An engine model's stand-in tokens are not its engine's: kept, never reused whole.
                let digest = match tokenizer {
                    Some(ModelTokenizer::Engine) => InputDigest::default(),
                    _ => digest,
                };
                let render = || parsed.rendered_prompts().into_iter().next();
                self.hash(render, &parsed.model, keys, hashing, digest)
                    .await?
            }
        };
        Ok(Prompted {
            hashed,
            context_limit: served.and_then(|m| m.max_model_len).filter(|_| exact),
            exact,
        })
    }

    /// Runs `work` (a prompt of `size` bytes) and keeps its result under `keep`: here for a
    /// small prompt, else as the one computation of its input in flight
    /// ([`PromptFlights`]), which keeps its result even when this request has gone.
    pub(super) async fn compute(
        &self,
        size: usize,
        digest: InputDigest,
        keep: KeepAs,
        work: impl FnOnce() -> Result<HashedPrompt, PromptError> + Send + 'static,
    ) -> Result<Arc<HashedPrompt>, ApiError> {
        if size < OFFLOAD_PROMPT_BYTES {
            let hashed = Arc::new(work().map_err(PromptError::into_api)?);
            keep.keep(&self.cache, &hashed, digest);
            return Ok(hashed);
        }
        let (cache, leader) = (self.cache.clone(), keep.clone());
        let done = move |hashed: &Arc<HashedPrompt>| leader.keep(&cache, hashed, digest);
        let hashed = self
            .flights
            .run(digest.0, work, done)
            .await
            .map_err(flight_error)?;
        // A request that joined another's computation keeps it under its own keys.
        keep.keep(&self.cache, &hashed, digest);
        Ok(hashed)
    }

    /// The last prompt to start this step's from, and where to keep this step's
    /// (nothing with [`Hashing::Peek`]). Kept per model: a prompt tokenized by another
    /// tokenizer is no base to extend.
    pub(super) fn kept(
        &self,
        model: &str,
        keys: Keys<'_>,
        hashing: Hashing,
        digest: InputDigest,
    ) -> Kept {
        let of_model = |name: &str| {
            let mut key = String::with_capacity(model.len() + 1 + name.len());
            key.push_str(model);
            key.push('\u{1f}');
            key.push_str(name);
            key
        };
        let own = keys.own.map(of_model);
        // A step that keeps its prompt takes the kept one out to extend it in place
        // (`PromptCache::take`; a step whose prompt then fails to compute loses it, and
        // the session's next step tokenizes whole); a dry run only reads it.
        let found = own.as_deref().and_then(|k| match hashing {
            Hashing::Keep => self.cache.take(k),
            _ => self.cache.lookup(k),
        });
        // Nothing of its own (a session's first step): the last prompt that started as
        // this one does, read and shared (other sessions start from it too).
        let (found, start) = match found {
            Some(found) => (Some(found), None),
            None => {
                let start = keys.start.map(of_model);
                let found = start.as_deref().and_then(|k| self.cache.lookup(k));
                (found, start)
            }
        };
        let same = found.as_ref().is_some_and(|(_, d)| d.matches(digest));
        let keep = match hashing {
            Hashing::Keep => KeepAs { own, start },
            _ => KeepAs::default(),
        };
        Kept {
            keep,
            prev: found.map(|(p, _)| p),
            seed: self.seed_of(model),
            same,
        }
    }
}

/// Where a step's prompt is looked for and kept: its own key (the session's context
/// window, or a sessionless prompt's first bytes), and a session's first bytes, read
/// when it has nothing of its own yet.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Keys<'a> {
    own: Option<&'a str>,
    start: Option<&'a str>,
}

/// The cache keys (model-qualified) a step's prompt is kept under.
#[derive(Debug, Clone, Default)]
pub(super) struct KeepAs {
    own: Option<String>,
    /// A session's first step is also kept as the start later sessions begin from.
    start: Option<String>,
}

impl KeepAs {
    /// Keeps `hashed` under every key.
    pub(super) fn keep(
        &self,
        cache: &PromptCache,
        hashed: &Arc<HashedPrompt>,
        digest: InputDigest,
    ) {
        for key in [&self.own, &self.start].into_iter().flatten() {
            cache.keep(key, hashed.clone(), digest);
        }
    }

    /// Whether the prompt is kept at all (then it keeps restart points and little spare
    /// capacity).
    pub(super) fn any(&self) -> bool {
        self.own.is_some() || self.start.is_some()
    }
}

/// The prompt a step starts from and where to keep the step's.
pub(super) struct Kept {
    keep: KeepAs,
    prev: Option<Arc<HashedPrompt>>,
    /// The model's hash seed ([`PromptHasher::seed_of`]).
    seed: u64,
    /// `prev` was computed from this request's very input: it is this prompt.
    same: bool,
}

impl PromptHasher {
    /// The prompt kept under `key` (`<model>\u{1f}<session>`).
    #[cfg(test)]
    pub(crate) fn kept_prompt(&self, key: &str) -> Option<Arc<HashedPrompt>> {
        self.cache.get(key)
    }
}

#[cfg(test)]
mod tests;
