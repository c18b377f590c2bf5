//! A model's own tokenizer: its `tokenizer.json` (the `tokenizers` crate, pure Rust) and its
//! chat template, so the router computes exactly the token ids the engine will, and hence
//! the engine's block hashes.
//!
//! A session's next prompt repeats the previous one and adds a little. The tokenizer
//! splits text at added tokens (the special tokens a chat template puts around every
//! message) before anything else, and tokenizes the text after one independently of what
//! precedes it. So [`HfTokenizer::encode_after`] keeps the previous prompt's tokens up to
//! the end of the last added token both texts share (with room for the longest added
//! token, so the match itself cannot differ) and tokenizes only the rest; a differential
//! test checks it equals tokenizing the whole. (Not the start of that token: the text
//! before an added token tokenizes differently when the next text extends it.)
//!
//! - [`chat_template`]: the Jinja template rendered as `transformers` renders it.
//! - `fast_encode`: the same ids as the `tokenizers` crate's pipeline for byte-level BPE
//!   tokenizers with regex splits, several times faster on long prompts; `added_split`:
//!   its split at added tokens; `piece_cache`: the ids of pieces it has encoded;
//!   `segment_cache`: long texts between added tokens it has encoded, whose ids a new text
//!   that ends the same way takes from a restart point inside that shared end.
//! - `json_array`: the elements of the messages' JSON array, found by its structure, for
//!   the chat template to parse (or find kept) one by one.

mod added_split;
pub mod chat_template;
mod fast_encode;
mod json_array;
mod piece_cache;
mod segment_cache;

use std::borrow::Cow;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use ownerserve_planner::tokenized::Tokenized;

use chat_template::{ChatTemplate, TemplateField};

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum HfTokenizerError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid {}: {reason}", path.display())]
    Invalid { path: PathBuf, reason: String },
    #[error("the tokenizer has no chat template")]
    NoChatTemplate,
    #[error("chat template: {0}")]
    Template(String),
    #[error("tokenizing failed: {0}")]
    Encode(String),
}

/// The parts of `tokenizer_config.json` that matter here.
#[derive(Debug, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    chat_template: Option<TemplateField>,
    #[serde(default)]
    bos_token: Option<Value>,
    #[serde(default)]
    eos_token: Option<Value>,
    #[serde(default)]
    unk_token: Option<Value>,
    #[serde(default)]
    pad_token: Option<Value>,
}

/// A special token as the config writes it: a string, or `{"content": ...}`.
fn token_text(v: Option<Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `(byte, tokens before it)`: where tokenizing can restart.
type RestartPoint = (usize, usize);

/// A model's tokenizer and chat template.
pub struct HfTokenizer {
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    /// Ids of the added tokens, after which tokenizing restarts.
    added: HashSet<u32>,
    /// How far past a restart point two texts must agree for the tokenizer to have matched
    /// the same added tokens before it: the longest added token's bytes, or none when no
    /// added token contains another nor takes in what follows it (`rstrip`,
    /// `single_word`): then the match that ends at a restart point is decided by the bytes
    /// before it (leftmost-longest matching finds it, and nothing longer, in both texts).
    lookahead: usize,
    /// The faster pipeline, when this tokenizer's is one it reproduces.
    fast: Option<fast_encode::FastEncode>,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.template.is_some())
            .finish()
    }
}

/// [`HfTokenizer::lookahead`] for these added tokens.
fn added_token_lookahead<'t>(added: impl Iterator<Item = &'t tokenizers::AddedToken>) -> usize {
    let added: Vec<&tokenizers::AddedToken> = added.collect();
    let longest = added.iter().map(|t| t.content.len()).max().unwrap_or(0);
    let absorbs = added.iter().any(|t| t.rstrip || t.single_word);
    let nested = added.iter().any(|a| {
        added
            .iter()
            .any(|b| b.content.len() > a.content.len() && b.content.contains(a.content.as_str()))
    });
    match absorbs || nested {
        true => longest,
        false => 0,
    }
}

impl HfTokenizer {
    /// Token ids the model knows, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(true)
    }

    /// Loads `DIR/tokenizer.json` and `DIR/tokenizer_config.json` (a model directory).
    pub fn from_dir(dir: &Path) -> Result<Self, HfTokenizerError> {
        Self::from_files(
            &dir.join("tokenizer.json"),
            &dir.join("tokenizer_config.json"),
        )
    }

    /// Loads a `tokenizer.json` and a `tokenizer_config.json` (chat template, special
    /// tokens); the config may be missing, and then chat prompts cannot be rendered.
    pub fn from_files(tokenizer_json: &Path, config_json: &Path) -> Result<Self, HfTokenizerError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| HfTokenizerError::Read {
                path: path.to_owned(),
                source,
            })
        };
        let invalid = |path: &Path, reason: String| HfTokenizerError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let bytes = read(tokenizer_json)?;
        let fast = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|json| fast_encode::FastEncode::for_tokenizer(&json));
        let tokenizer = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| invalid(tokenizer_json, e.to_string()))?;
        let config: Option<TokenizerConfig> = match config_json.exists() {
            true => Some(
                serde_json::from_slice(&read(config_json)?)
                    .map_err(|e| invalid(config_json, e.to_string()))?,
            ),
            false => None,
        };
        let template = match config {
            Some(TokenizerConfig {
                chat_template: Some(field),
                bos_token,
                eos_token,
                unk_token,
                pad_token,
            }) => {
                let special = [
                    ("bos_token", bos_token),
                    ("eos_token", eos_token),
                    ("unk_token", unk_token),
                    ("pad_token", pad_token),
                ]
                .into_iter()
                .filter_map(|(name, v)| Some((name, token_text(v)?)))
                .collect();
                Some(ChatTemplate::compile(field, special)?)
            }
            _ => None,
        };
        let decoder = tokenizer.get_added_tokens_decoder();
        let lookahead = added_token_lookahead(decoder.values());
        Ok(Self {
            tokenizer,
            template,
            added: decoder.into_keys().collect(),
            lookahead,
            fast,
        })
    }

    /// The chat prompt the engine builds from `messages` (and `tools`), as JSON arrays.
    pub fn render_chat(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
    ) -> Result<String, HfTokenizerError> {
        self.template
            .as_ref()
            .ok_or(HfTokenizerError::NoChatTemplate)?
            .render(messages_json, tools_json, add_generation_prompt)
    }

    /// Tokenizes `text` whole. `add_special_tokens` adds what the tokenizer's
    /// post-processor adds (a completions prompt; a rendered chat template has its own).
    pub fn encode(
        &self,
        text: String,
        add_special_tokens: bool,
    ) -> Result<Tokenized, HfTokenizerError> {
        let (tokens, checkpoints) = self.encode_part(&text, 0, 0, add_special_tokens)?;
        Ok(match add_special_tokens {
            // Tokens the post-processor adds have no place in the text to restart from.
            true => Tokenized::from_parts(text, tokens, Vec::new()),
            false => Tokenized::from_parts(text, tokens, checkpoints),
        })
    }

    /// Tokenizes `text` (no special tokens added), reusing `prev`'s tokens up to the last
    /// added token well inside the part both texts start with. Same result as
    /// [`HfTokenizer::encode`]. An owned `prev`'s vectors become the result's
    /// ([`Tokenized::into_prefix`]: nothing copied).
    pub fn encode_after(
        &self,
        prev: Cow<'_, Tokenized>,
        text: String,
    ) -> Result<Tokenized, HfTokenizerError> {
        let Some((byte, tokens, keep)) = prev.resume_point(&text, self.lookahead) else {
            return self.encode(text, false);
        };
        let (tail, tail_checkpoints) = self.encode_part(&text, byte, tokens, false)?;
        let (mut all, mut checkpoints) = Tokenized::into_prefix(prev, tokens, keep, tail.len());
        all.extend(tail);
        checkpoints.extend(tail_checkpoints);
        Ok(Tokenized::from_parts(text, all, checkpoints).with_reused(tokens))
    }

    /// Whether prompts are tokenized by the faster pipeline (`fast_encode`).
    pub fn is_fast(&self) -> bool {
        self.fast.is_some()
    }

    /// The ids of `text` by the `tokenizers` crate's own pipeline, whatever this one uses
    /// (for comparisons).
    pub fn encode_by_crate(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, HfTokenizerError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| HfTokenizerError::Encode(e.to_string()))
    }

    /// Tokens of `text[from..]` and the restart points among them (just past each added
    /// token), numbered as if `before` tokens came first.
    fn encode_part(
        &self,
        text: &str,
        from: usize,
        before: usize,
        add_special_tokens: bool,
    ) -> Result<(Vec<u32>, Vec<RestartPoint>), HfTokenizerError> {
        let part = text.get(from..).unwrap_or_default();
        if let (Some(fast), false) = (&self.fast, add_special_tokens) {
            let (ids, points) = fast
                .encode(&self.tokenizer, part, |id| self.added.contains(&id))
                .map_err(|e| HfTokenizerError::Encode(e.to_string()))?;
            let points = points
                .into_iter()
                .map(|(end, n)| (from + end, before + n))
                .collect();
            return Ok((ids, points));
        }
        let encoding = self
            .tokenizer
            .encode(part, add_special_tokens)
            .map_err(|e| HfTokenizerError::Encode(e.to_string()))?;
        let ids = encoding.get_ids();
        let checkpoints = ids
            .iter()
            .zip(encoding.get_offsets())
            .enumerate()
            .filter(|(_, (id, _))| self.added.contains(id))
            .map(|(i, (_, &(_, end)))| (from + end, before + i + 1))
            .collect();
        Ok((ids.to_vec(), checkpoints))
    }
}
