//! `[router.prompt.tokenizers]`: per served model, the tokenizer the router computes
//! tokens and block hashes with, loaded before the router starts.

use std::sync::Arc;

use ownerserve_shim::hf_tokenizer::HfTokenizer;

use super::{ConfigError, RouterSettings};

/// How the router tokenizes one served model (other than with the built-in tokenizer).
#[derive(Debug, Clone)]
pub enum ModelTokenizer {
    /// The model's own `tokenizer.json` and chat template, loaded at startup.
    Own(Arc<HfTokenizer>),
    /// The engine's `POST /tokenize`, asked per request (for a template the router cannot
    /// render, or no local copy of the tokenizer).
    Engine,
}

/// Each `router.tokenizers` entry but `builtin`; a model directory is loaded now, so a
/// missing or broken tokenizer stops the router before it starts.
pub(super) fn load_tokenizers(
    s: &RouterSettings,
) -> Result<std::collections::BTreeMap<String, ModelTokenizer>, ConfigError> {
    s.tokenizers
        .iter()
        .filter(|(_, v)| v.as_str() != "builtin")
        .map(|(model, value)| {
            if value == "engine" {
                return Ok((model.clone(), ModelTokenizer::Engine));
            }
            let key = format!("tokenizers.{model}");
            let tokenizer = HfTokenizer::from_dir(std::path::Path::new(value))
                .map_err(|e| ConfigError::invalid("router", key, with_causes(&e)))?;
            Ok((model.clone(), ModelTokenizer::Own(Arc::new(tokenizer))))
        })
        .collect()
}

/// An error and its causes on one line (`cannot read X: No such file or directory`).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        line.push_str(": ");
        line.push_str(&c.to_string());
        cause = c.source();
    }
    line
}
