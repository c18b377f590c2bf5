//! The identity stage's tests: sessions, forks, and the prompt each step gets through it.

use ownerserve_planner::hash::prompt_hashes;
use ownerserve_shim::openai::{parse, Endpoint};

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use ownerserve_planner::hash::{block_seed, XXH3_SEED};
use ownerserve_shim::hf_tokenizer::HfTokenizer;
use ownerserve_shim::openai::ParsedRequest;

use crate::config::ModelTokenizer;
use crate::fleet::registry::Registry;
use crate::prompt::engine_tokenize::TOKENIZE_PATH;
use crate::prompt::{Engines, Hashing, PromptHasher};
use crate::proxy::front::step_identity as identify;
use crate::upstream::EngineCalls;

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
        assert_eq!(
            hasher.kept_prompt("m\u{1f}s1").as_deref(),
            Some(&*id.prompt)
        );
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
    assert!(hasher.kept_prompt("m\u{1f}s1").is_none());
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
        let body =
            serde_json::to_vec(&serde_json::json!({"model": "tiny", "messages": case["messages"]}))
                .unwrap();
        let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
        let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        let want: Vec<u32> = serde_json::from_value(case["chat_ids"].clone()).unwrap();
        assert_eq!(id.prompt.tokenized.tokens, want);
        assert_eq!(id.hashes(), prompt_hashes(&want, 16, XXH3_SEED));
    }
    assert!(hasher.kept_prompt("tiny\u{1f}s1").is_some());
    // A template that refuses its input is the client's error, as the engine's would be.
    let bad = br#"{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": "yes"}"#;
    assert!(parse(bad, Endpoint::ChatCompletions).is_err());
}

#[tokio::test]
async fn a_new_session_starting_as_an_earlier_one_tokenizes_only_what_is_new() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../workers-shim/tests/fixtures/tokenizers/local"
    );
    let own = ModelTokenizer::Own(Arc::new(
        HfTokenizer::from_dir(std::path::Path::new(dir)).unwrap(),
    ));
    let new_hasher =
        || PromptHasher::new(16, 1 << 20, [("tiny".to_owned(), own.clone())].into(), None);
    let hasher = new_hasher();
    let rid = HeaderValue::from_static("r1");
    let system = "You are a coding agent. Tools: read, edit, run. ".repeat(60);
    let first_step = |task: &str, system: &str| {
        serde_json::to_vec(&serde_json::json!({"model": "tiny", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": task}]}))
        .unwrap()
    };
    let mut reused = Vec::new();
    for (session, task, system) in [
        ("s1", "fix the failing test", system.clone()),
        ("s2", "add a flag", system.clone()),
        ("s3", "add a flag", format!("Another agent. {system}")),
        ("s4", "rename the module", system.clone()),
    ] {
        let h = headers(match session {
            "s1" => &[(SESSION, "s1")],
            "s2" => &[(SESSION, "s2")],
            "s3" => &[(SESSION, "s3")],
            _ => &[(SESSION, "s4")],
        });
        let body = first_step(task, &system);
        let parsed = parse(&body, Endpoint::ChatCompletions).unwrap();
        let id = identify(&hasher, &h, &parsed, &rid, Hashing::Keep)
            .await
            .unwrap();
        // The same tokens and hashes as tokenizing the prompt whole.
        let (alone, no_session) = (new_hasher(), headers(&[]));
        let whole = identify(&alone, &no_session, &parsed, &rid, Hashing::Peek)
            .await
            .unwrap();
        assert_eq!(id.prompt.tokenized.tokens, whole.prompt.tokenized.tokens);
        assert_eq!(
            id.hashes(),
            prompt_hashes(&id.prompt.tokenized.tokens, 16, XXH3_SEED)
        );
        reused.push((
            id.prompt.tokenized.reused(),
            id.prompt.tokenized.tokens.len(),
        ));
        assert!(hasher
            .kept_prompt(&format!("tiny\u{1f}{session}"))
            .is_some());
    }
    // The first session and one with another system prompt start from nothing; the
    // others reuse the system prompt's tokens (all but the task's).
    assert_eq!(reused[0].0, 0);
    assert_eq!(reused[2].0, 0, "another start reuses nothing: {reused:?}");
    for (r, total) in [reused[1], reused[3]] {
        assert!(r > 0 && total - r < 40, "only the task is new: {reused:?}");
    }
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
        Box::pin(async move { Ok((axum::http::StatusCode::OK, Bytes::from(answer.to_string()))) })
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
    use crate::fleet::registry::ServedModel;
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
    let oov = serde_json::json!({"model": "tiny", "prompt": [[1, 2], [3, 4096]], "max_tokens": 1});
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

/// The coding agents' session headers and bodies.
mod agents {
    use axum::http::HeaderValue;
    use ownerserve_shim::openai::{parse, Endpoint};

    use super::super::*;

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
        // Older Claude Code: `user_<hash>_account__session_<uuid>`; an empty one names none.
        let body = br#"{"model":"m","max_tokens":8,"metadata":{"user_id":"user_ab_account__session_cc-2"},"messages":[{"role":"user","content":"hi"}]}"#;
        let p = parse(body, Endpoint::Messages).unwrap();
        assert_eq!(agent_ids(&none, &p).agent, Some("cc-2"));
        let body = br#"{"model":"m","max_tokens":8,"metadata":{"user_id":"user_ab_session_"},"messages":[{"role":"user","content":"hi"}]}"#;
        let p = parse(body, Endpoint::Messages).unwrap();
        assert_eq!(agent_ids(&none, &p).harness, Harness::Generic);
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

#[test]
fn a_client_closes_or_keeps_alive_its_session_by_header_or_dynamos_nvext() {
    use super::agent_ids;
    use super::control::session_control;
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"nvext":{"session_control":{"session_id":"dyn-1","action":"bind","timeout":90}}}"#;
    let p = parse(body, Endpoint::ChatCompletions).unwrap();
    let none = HeaderMap::new();
    assert_eq!(
        agent_ids(&none, &p).agent,
        Some("dyn-1"),
        "Dynamo's session id names it"
    );
    assert_eq!(
        session_control(&none, &p),
        Some((ownerserve_shim::openai::SessionAction::KeepAlive, 90))
    );
    let close = headers(&[("x-ownerserve-session-control", "close")]);
    assert_eq!(
        session_control(&close, &p),
        Some((ownerserve_shim::openai::SessionAction::Close, 300)),
        "the header wins over the body"
    );
    let keep = headers(&[("x-ownerserve-session-control", "Keep-Alive; timeout=20")]);
    assert_eq!(
        session_control(&keep, &p),
        Some((ownerserve_shim::openai::SessionAction::KeepAlive, 20))
    );
    let odd = headers(&[("x-ownerserve-session-control", "explode")]);
    assert_eq!(
        session_control(&odd, &p),
        None,
        "an unknown value asks nothing"
    );
    let plain_body = chat("hi", 1);
    let plain = parse(&plain_body, Endpoint::ChatCompletions).unwrap();
    assert_eq!(session_control(&none, &plain), None);
}
