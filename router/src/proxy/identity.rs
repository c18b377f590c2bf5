//! Identity: who a step belongs to. The session, a fork's child session and side requests
//! come from headers and body (below); the prompt is the prompt service's
//! ([`crate::prompt`]), keyed by [`AgentIds::kept_as`]; the front half
//! (`proxy::front`) runs them in order and lets ingress refuse a prompt over the model's
//! context before the identity is made.
//!
//! Sessions come from the coding agents' own headers and bodies, at two levels: the
//! **agent** (a thread or sub-agent: KV affinity and ownership follow it) and its **root**
//! session and **parent** (grouping: one conversation's sub-agents share a root).
//!
//! What each harness sends. Sources: the requests Claude Code 2.1.328, Codex CLI 0.169.0
//! and OpenCode 1.18.33 (npm) really sent to a loopback server, recorded in
//! `tests/fixtures/agents/` (root-agent headers and bodies: `X-Claude-Code-Session-Id`
//! and `metadata.user_id`; `session-id`, `thread-id`, `x-codex-window-id`,
//! `x-codex-turn-metadata`, `prompt_cache_key`; `x-session-id`, `x-session-affinity`);
//! the sub-agent headers (`x-claude-code-agent-id`, `x-claude-code-parent-agent-id`,
//! `x-codex-parent-thread-id`, `x-parent-session-id`) are from the harnesses' public
//! sources and changelogs as summarised in the team's agent notes, not yet recorded here.
//! Dynamo's and llm-d's routers derive sessions from the same headers.
//!
//! | harness | agent | root | parent |
//! |---|---|---|---|
//! | Claude Code | `x-claude-code-agent-id`, else `x-claude-code-session-id`, else `session_id` in `metadata.user_id` (a JSON string) | `x-claude-code-session-id` / `metadata.user_id` | `x-claude-code-parent-agent-id`, else the root for a sub-agent |
//! | Codex | `thread-id`, else `session-id`, else `prompt_cache_key` | `session-id` | `x-codex-parent-thread-id` |
//! | OpenCode | `x-session-id` (also ours), `x-session-affinity` | the parent, else itself | `x-parent-session-id` |
//! | ours | `x-session-id`, else OpenAI `user`, else `metadata.session_id` | itself | — |
//!
//! Headers are read in both spellings (`session-id` and `session_id`). Codex's
//! `x-codex-window-id` (`<thread>:<n>`) names the context window: a new `n` after a
//! compaction means the old prefix is gone, so the window, not the thread, keys the
//! prompt kept for incremental hashing.
//!
//! **Side requests** carry the session's id but not its conversation: OpenCode's title
//! request and Claude Code's topic/title requests (no `tools`, unlike every turn), and
//! Codex requests whose `x-codex-turn-metadata.request_kind` is not `turn` (a compaction).
//! They are served without the session, so they never claim, move or demote its owner.

use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_shim::openai::{ParsedRequest, SessionAction};

use crate::api::headers;

/// Who a step belongs to and its prompt.
#[derive(Debug)]
pub struct Identity<'a> {
    /// The session (the agent or thread; see [`agent_ids`]): `x-session-id`,
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
    /// The prompt's tokens are the engine's own (`Prompted::exact`).
    pub exact_tokens: bool,
    /// What the client asked of the session's life, and for how many seconds
    /// (`control::session_control`).
    pub control: Option<(SessionAction, u64)>,
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

/// The step's identity from its agent ids and its prompt (computed by the prompt service
/// for [`AgentIds::kept_as`]); `request_id` names an unnamed fork's child.
pub fn identify<'a>(
    ids: AgentIds<'a>,
    headers: &'a HeaderMap,
    parsed: &ParsedRequest<'_>,
    request_id: &HeaderValue,
    prompt: Arc<HashedPrompt>,
    exact_tokens: bool,
) -> Identity<'a> {
    let session = ids.session();
    let fork = fork_of(headers);
    let child = (fork.is_some() || parsed.sampling.n > 1)
        .then(|| session.map(|s| child_session(s, fork, request_id)))
        .flatten();
    Identity {
        session,
        root: ids.root,
        parent: ids.parent,
        side: ids.side,
        fork: fork.is_some(),
        child,
        prompt,
        exact_tokens,
        control: control::session_control(headers, parsed),
    }
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

/// Which client named the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Harness {
    ClaudeCode,
    Codex,
    OpenCode,
    /// `x-session-id`, `user` or `metadata.session_id` from any client.
    Generic,
}

/// A step's agent, its root session and its parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AgentIds<'a> {
    /// The agent or thread: the unit of KV affinity and ownership.
    pub agent: Option<&'a str>,
    /// The conversation's root session (the agent itself for a root agent).
    pub root: Option<&'a str>,
    /// The agent that spawned this one.
    pub parent: Option<&'a str>,
    /// Codex's context window (`<thread>:<n>`), new after a compaction.
    pub window: Option<&'a str>,
    /// A side request (title, compaction): served without the session.
    pub side: bool,
    pub harness: Harness,
}

impl<'a> AgentIds<'a> {
    /// The session the step is served for: the agent, unless this is a side request.
    pub fn session(&self) -> Option<&'a str> {
        self.agent.filter(|_| !self.side)
    }

    /// The key the prompt is kept under for the next step: the context window (a Codex
    /// compaction starts a new one, whose prefix shares nothing with the old), else the
    /// session.
    pub fn kept_as(&self) -> Option<&'a str> {
        self.window.or(self.session()).filter(|_| !self.side)
    }
}

/// The value of header `name` (lowercase, with hyphens), or else of its underscore
/// spelling, if non-empty. One pass over the request's few headers, without allocating:
/// this runs on every request for each of the harnesses' headers.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut underscored = None;
    for (n, v) in headers {
        let n = n.as_str();
        if n.len() != name.len() {
            continue;
        }
        if n == name {
            match value(v) {
                Some(v) => return Some(v),
                None => continue,
            }
        }
        if underscored.is_none()
            && n.bytes()
                .zip(name.bytes())
                .all(|(a, b)| a == b || (a == b'_' && b == b'-'))
        {
            underscored = Some(v);
        }
    }
    underscored.and_then(value)
}

fn value(v: &HeaderValue) -> Option<&str> {
    v.to_str().ok().filter(|v| !v.is_empty())
}

/// The agent identity of a request.
pub fn agent_ids<'a>(headers: &'a HeaderMap, parsed: &'a ParsedRequest<'_>) -> AgentIds<'a> {
    let no_tools = parsed.template.tools_json.is_none();
    // Claude Code.
    let claude_session =
        header(headers, "x-claude-code-session-id").or_else(|| session_in_user_id(parsed));
    if let Some(root) = claude_session {
        let agent = header(headers, "x-claude-code-agent-id");
        let parent = header(headers, "x-claude-code-parent-agent-id").or(agent.map(|_| root));
        return AgentIds {
            agent: Some(agent.unwrap_or(root)),
            root: Some(root),
            parent,
            window: None,
            side: no_tools,
            harness: Harness::ClaudeCode,
        };
    }
    // Codex.
    let codex_session = header(headers, "session-id");
    let thread = header(headers, "thread-id");
    if codex_session.is_some() || thread.is_some() {
        let kind = header(headers, "x-codex-turn-metadata")
            .and_then(|m| serde_json::from_str::<serde_json::Value>(m).ok())
            .and_then(|m| m["request_kind"].as_str().map(str::to_owned));
        return AgentIds {
            agent: thread.or(codex_session),
            root: codex_session.or(thread),
            parent: header(headers, "x-codex-parent-thread-id"),
            window: header(headers, "x-codex-window-id"),
            side: kind.is_some_and(|k| k != "turn"),
            harness: Harness::Codex,
        };
    }
    // OpenCode (its x-session-id is ours; x-session-affinity is its own).
    let affinity = header(headers, "x-session-affinity");
    let ours = header(headers, "x-session-id");
    if let Some(agent) = affinity.or(ours).filter(|_| affinity.is_some()) {
        let parent = header(headers, "x-parent-session-id");
        return AgentIds {
            agent: Some(agent),
            root: parent.or(Some(agent)),
            parent,
            window: None,
            side: no_tools,
            harness: Harness::OpenCode,
        };
    }
    let dynamo = parsed
        .session_control
        .as_ref()
        .and_then(|c| c.session_id.as_deref());
    let agent = ours
        .or(dynamo)
        .or(parsed.user.as_deref())
        .or(parsed.session_id.as_deref())
        .or(parsed.prompt_cache_key.as_deref());
    AgentIds {
        agent,
        root: agent,
        parent: header(headers, "x-parent-session-id"),
        window: None,
        side: false,
        harness: Harness::Generic,
    }
}

/// The session a Claude Code `metadata.user_id` names: a JSON string
/// `{"device_id", "account_uuid", "session_id"}`, or (older versions) `…_session_<uuid>`.
/// A `session_id` written with JSON escapes is not read (Claude Code's is a UUID).
fn session_in_user_id<'a>(parsed: &'a ParsedRequest<'_>) -> Option<&'a str> {
    #[derive(serde::Deserialize)]
    struct UserId<'a> {
        #[serde(borrow)]
        session_id: Option<&'a str>,
    }
    let user_id = parsed.metadata_user_id.as_deref()?;
    let session = if user_id.trim_start().starts_with('{') {
        serde_json::from_str::<UserId<'_>>(user_id)
            .ok()?
            .session_id?
    } else {
        user_id.rsplit_once("_session_")?.1
    };
    Some(session).filter(|s| !s.is_empty())
}

mod control;
#[cfg(test)]
mod tests;
