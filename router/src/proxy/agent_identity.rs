//! Session identity from the coding agents' own headers and bodies, at two levels: the
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

use axum::http::{HeaderMap, HeaderValue};

use ownerserve_shim::openai::ParsedRequest;

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
        header(headers, "x-claude-code-session-id").or(parsed.user_id_session.as_deref());
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
    let agent = ours
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

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use ownerserve_shim::openai::{parse, Endpoint};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    const TOOLS: &str = r#","tools":[{"type":"function","function":{"name":"ls"}}]"#;

    fn chat(extra: &str) -> Vec<u8> {
        format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}]{extra}}}"#)
            .into_bytes()
    }

    #[test]
    fn each_harness_names_its_agent_root_and_parent_in_either_spelling() {
        let body = chat(TOOLS);
        let p = parse(&body, Endpoint::ChatCompletions).unwrap();
        type Ids = (
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
        );
        type Case = (&'static [(&'static str, &'static str)], Ids, Harness);
        let cases: &[Case] = &[
            (
                &[
                    ("x-claude-code-session-id", "cc"),
                    ("x-claude-code-agent-id", "a1"),
                ],
                (Some("a1"), Some("cc"), Some("cc")),
                Harness::ClaudeCode,
            ),
            (
                &[
                    ("x-claude-code-session-id", "cc"),
                    ("x-claude-code-agent-id", "a2"),
                    ("x-claude-code-parent-agent-id", "a1"),
                ],
                (Some("a2"), Some("cc"), Some("a1")),
                Harness::ClaudeCode,
            ),
            (
                &[
                    ("session_id", "s"),
                    ("thread_id", "t"),
                    ("x-codex-parent-thread-id", "s"),
                ],
                (Some("t"), Some("s"), Some("s")),
                Harness::Codex,
            ),
            (
                &[("session-id", "s")],
                (Some("s"), Some("s"), None),
                Harness::Codex,
            ),
            (
                &[
                    ("x-session-id", "ses_1"),
                    ("x-session-affinity", "ses_1"),
                    ("x-parent-session-id", "ses_0"),
                ],
                (Some("ses_1"), Some("ses_0"), Some("ses_0")),
                Harness::OpenCode,
            ),
            (
                &[("x-session-id", "mine")],
                (Some("mine"), Some("mine"), None),
                Harness::Generic,
            ),
        ];
        for (pairs, (agent, root, parent), harness) in cases {
            let h = headers(pairs);
            let ids = agent_ids(&h, &p);
            assert_eq!(
                (ids.agent, ids.root, ids.parent),
                (*agent, *root, *parent),
                "{pairs:?}"
            );
            assert_eq!(ids.harness, *harness);
            assert!(!ids.side);
        }
    }

    #[test]
    fn bodies_name_sessions_too_and_side_requests_are_marked() {
        let body = br#"{"model":"m","max_tokens":8,"metadata":{"user_id":"{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"cc-1\"}"},"messages":[{"role":"user","content":"hi"}]}"#;
        let p = parse(body, Endpoint::Messages).unwrap();
        let none = HeaderMap::new();
        let ids = agent_ids(&none, &p);
        assert_eq!(
            (ids.agent, ids.harness),
            (Some("cc-1"), Harness::ClaudeCode)
        );
        assert!(ids.side, "no tools: a title or topic request");
        let body = br#"{"model":"m","input":"hi","prompt_cache_key":"k"}"#;
        let p = parse(body, Endpoint::Responses).unwrap();
        assert_eq!(agent_ids(&none, &p).agent, Some("k"));
        let compact = headers(&[
            ("session-id", "s"),
            ("x-codex-turn-metadata", r#"{"request_kind":"compact"}"#),
        ]);
        assert!(agent_ids(&compact, &p).side);
        let turn = headers(&[
            ("session-id", "s"),
            ("x-codex-turn-metadata", r#"{"request_kind":"turn"}"#),
        ]);
        assert!(!agent_ids(&turn, &p).side);
        // Our own x-session-id without tools is a plain step, never a side request.
        let body = chat("");
        let p = parse(&body, Endpoint::ChatCompletions).unwrap();
        assert!(!agent_ids(&headers(&[("x-session-id", "s")]), &p).side);
        let title = headers(&[("x-session-id", "ses_1"), ("x-session-affinity", "ses_1")]);
        assert!(agent_ids(&title, &p).side);
    }

    /// What the three harnesses really sent (`tests/fixtures/agents/`): each capture
    /// parses on its endpoint and names its session; the title request is a side request.
    #[test]
    fn the_recorded_harness_requests_parse_and_name_their_sessions() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/agents");
        /// Per capture: its agent and whether it is a side request.
        type Want = &'static [(Option<&'static str>, bool)];
        let cases: &[(&str, Want, Harness)] = &[
            (
                "claude-code-2.1.328-messages.json",
                &[(Some("bb71fe19-4058-4aa7-a63d-95d5994d5d04"), false)],
                Harness::ClaudeCode,
            ),
            (
                "codex-0.169.0-responses-two-turns.json",
                &[
                    (Some("01a202fb-a207-7980-95dd-2ea181fa2e62"), false),
                    (Some("01a202fb-a207-7980-95dd-2ea181fa2e62"), false),
                ],
                Harness::Codex,
            ),
            (
                "opencode-1.18.33-chat-title-and-turn.json",
                &[
                    (Some("ses_dfd0439a4ffe5a1dJp2tfNLoqM"), true),
                    (Some("ses_dfd0439a4ffe5a1dJp2tfNLoqM"), false),
                ],
                Harness::OpenCode,
            ),
        ];
        for (file, want, harness) in cases {
            let text = std::fs::read_to_string(format!("{dir}/{file}")).unwrap();
            let captures: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
            assert_eq!(captures.len(), want.len(), "{file}");
            for (c, (agent, side)) in captures.iter().zip(*want) {
                let path = c["path"].as_str().unwrap();
                let endpoint = match path.split('?').next().unwrap() {
                    "/v1/messages" => Endpoint::Messages,
                    "/v1/responses" => Endpoint::Responses,
                    _ => Endpoint::ChatCompletions,
                };
                let body = serde_json::to_vec(&c["body"]).unwrap();
                let parsed = parse(&body, endpoint).unwrap_or_else(|e| panic!("{file}: {e}"));
                assert!(!parsed.prompt_tokens()[0].is_empty());
                let mut h = HeaderMap::new();
                for (k, v) in c["headers"].as_object().unwrap() {
                    h.insert(
                        axum::http::HeaderName::from_bytes(k.to_lowercase().as_bytes()).unwrap(),
                        HeaderValue::from_str(v.as_str().unwrap()).unwrap(),
                    );
                }
                let ids = agent_ids(&h, &parsed);
                assert_eq!(
                    (ids.agent, ids.side, ids.harness),
                    (*agent, *side, *harness),
                    "{file}"
                );
            }
        }
    }
}
