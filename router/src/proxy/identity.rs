//! Identity: who a step belongs to. The session (and a fork's child session) come from
//! headers and body ([`super::agent_identity`]); the prompt is the prompt service's
//! ([`crate::prompt`]), keyed by the session's context window, and refused by ingress when
//! it does not fit the model's context.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_shim::openai::ParsedRequest;

use crate::error::ApiError;
use crate::headers;
use crate::prompt::{Hashing, PromptHasher};

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

/// The step's identity, its prompt computed by `prompts`; `request_id` names an unnamed
/// fork's child.
pub async fn identify<'a>(
    prompts: &PromptHasher,
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
    let prompted = prompts.prompt(parsed, kept_as, hashing).await?;
    super::ingress::check_context(parsed, &prompted)?;
    let fork = fork_of(headers);
    let child = (fork.is_some() || parsed.sampling.n > 1)
        .then(|| session.map(|s| child_session(s, fork, request_id)))
        .flatten();
    Ok(Identity {
        session,
        root: ids.root,
        parent: ids.parent,
        side: ids.side,
        fork: fork.is_some(),
        child,
        prompt: prompted.hashed,
    })
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
mod tests;
