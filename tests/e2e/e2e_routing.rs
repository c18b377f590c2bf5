//! Routing policies end to end: `kv_aware` over real ZMQ KV events and over the approximate
//! index, `session_affinity`, busy gating, and `ownerserve`'s wait for KV on a full decoder
//! at the decode lifetime the router observed, with real `ownerserve` processes.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{chat_body, client, eventually, get_json, get_text, metric, temp_config, Proc};
use serde_json::{json, Value};

/// Sends a chat request; returns the worker that served it.
async fn route(router: &str, body: &Value, session: Option<&str>) -> String {
    let mut req = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(body);
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200, "{:?}", resp.text().await);
    resp.headers()["x-ownerserve-worker"]
        .to_str()
        .unwrap()
        .to_owned()
}

async fn worker_url(router: &str, name: &str) -> String {
    let w = get_json(&format!("{router}/admin/v1/workers")).await;
    w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == name)
        .unwrap()["url"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn prefix_hits(worker: &str) -> f64 {
    metric(
        &get_text(&format!("{worker}/metrics")).await,
        "vllm:prefix_cache_hits_total",
    )
}

fn long_prefix(tag: &str) -> String {
    (0..400).map(|i| format!("{tag} line {i}; ")).collect()
}

/// Waits until the router's index holds blocks for `worker`.
async fn indexed(router: &str, worker: &str) {
    let (router, worker) = (router.to_owned(), worker.to_owned());
    eventually(
        Duration::from_secs(10),
        "blocks indexed from KV events",
        || {
            let (router, worker) = (router.clone(), worker.clone());
            async move {
                let kv = get_json(&format!("{router}/admin/v1/kv")).await;
                kv["workers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|w| w["id"] == worker && w["blocks"].as_u64().unwrap_or(0) > 50)
            }
        },
    )
    .await;
}

#[tokio::test]
async fn kv_aware_follows_the_prefix_through_real_kv_events_and_spreads_the_rest() {
    let stack = Proc::up(&["--instant", "true", "--policy", "kv_aware"]);
    let prefix = long_prefix("repo-A");
    let first = route(
        &stack.url,
        &chat_body(&format!("{prefix} question one"), 2),
        None,
    )
    .await;
    indexed(&stack.url, &first).await;
    let kv = get_json(&format!("{}/admin/v1/kv", stack.url)).await;
    assert!(kv["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["mode"] == "events"));

    let holder = worker_url(&stack.url, &first).await;
    let hits_before = prefix_hits(&holder).await;
    for q in ["question two", "question three"] {
        let served = route(&stack.url, &chat_body(&format!("{prefix} {q}"), 2), None).await;
        assert_eq!(served, first, "same prefix goes to the worker holding it");
    }
    let hits = prefix_hits(&holder).await - hits_before;
    assert!(
        hits >= 2.0 * 800.0,
        "the holder's prefix cache was hit: {hits} tokens"
    );

    // Unrelated prompts spread over the decode and hybrid workers.
    let mut served = HashSet::new();
    for i in 0..6 {
        served.insert(
            route(
                &stack.url,
                &chat_body(&long_prefix(&format!("other-{i}")), 2),
                None,
            )
            .await,
        );
    }
    assert!(served.len() >= 2, "unrelated prompts spread: {served:?}");
    assert!(
        !served.contains("prefill-0"),
        "plain requests avoid prefill workers"
    );
}

/// Two instant sim workers `a` and `b` (no KV events) behind a `kv_aware` router.
fn kv_aware_over_two_workers_without_events() -> (Proc, Proc, Proc) {
    let a = Proc::sim_worker(&["--instant"]);
    let b = Proc::sim_worker(&["--instant"]);
    let router = Proc::router(
        &[
            format!("{},role=decode,name=a", a.url),
            format!("{},role=decode,name=b", b.url),
        ],
        &["--policy", "kv_aware"],
    );
    (a, b, router)
}

#[tokio::test]
async fn kv_aware_uses_the_approximate_index_for_workers_without_events() {
    let (_a, _b, router) = kv_aware_over_two_workers_without_events();
    let prefix = long_prefix("doc");
    let first = route(&router.url, &chat_body(&format!("{prefix} q1"), 2), None).await;
    for q in ["q2", "q3", "q4"] {
        assert_eq!(
            route(&router.url, &chat_body(&format!("{prefix} {q}"), 2), None).await,
            first
        );
    }
    let kv = get_json(&format!("{}/admin/v1/kv", router.url)).await;
    assert!(kv["workers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["mode"] == "approximate"));
    assert!(kv["blocks"].as_u64().unwrap() > 50);
}

/// A long prompt (over 16 KiB) is tokenized off the router's thread, and a session's next
/// step reuses the block hashes of its previous prompt: both must match the prefix exactly as a
/// freshly hashed short prompt does, or `kv_aware` would send the step to the empty worker
/// (the smaller index wins a tie).
#[tokio::test]
async fn long_prompts_and_later_session_steps_match_their_prefix() {
    let (_a, _b, router) = kv_aware_over_two_workers_without_events();
    let prefix: String = (0..5000)
        .map(|i| format!("src/lib.rs line {i}; "))
        .collect();
    assert!(prefix.len() > 64 * 1024);
    let first = route(
        &router.url,
        &chat_body(&format!("{prefix} q1"), 2),
        Some("s"),
    )
    .await;
    let mut step = format!("{prefix} q1");
    for q in ["q2", "q3"] {
        step.push_str(&format!(" tool output for {q}"));
        assert_eq!(
            route(&router.url, &chat_body(&step, 2), Some("s")).await,
            first,
            "step {q} of the session"
        );
    }
    // Another session with the same prefix, hashed from scratch.
    assert_eq!(
        route(
            &router.url,
            &chat_body(&format!("{prefix} q9"), 2),
            Some("t")
        )
        .await,
        first
    );
}

#[tokio::test]
async fn session_affinity_keeps_a_session_on_one_worker() {
    let stack = Proc::up(&["--instant", "true", "--policy", "session_affinity"]);
    for session in ["s-1", "s-2", "s-3"] {
        let mut served = HashSet::new();
        for turn in 0..4 {
            let body = chat_body(&format!("{session} turn {turn}"), 2);
            served.insert(route(&stack.url, &body, Some(session)).await);
        }
        assert_eq!(served.len(), 1, "{session} moved: {served:?}");
    }
    // The OpenAI `user` field names a session too.
    let mut body = chat_body("hello", 2);
    body["user"] = json!("alice");
    let first = route(&stack.url, &body, None).await;
    for _ in 0..3 {
        assert_eq!(route(&stack.url, &body, None).await, first);
    }
}

#[tokio::test]
async fn saturated_workers_get_429_with_retry_after() {
    let w = Proc::sim_worker(&["--instant"]);
    // KV usage is always >= 0: every worker counts as saturated once scraped.
    let cfg = temp_config(
        "busy.toml",
        &format!(
            "[router]\npolicy = \"kv_aware\"\nbusy_max_kv_usage = 0.0\nscrape_interval_ms = 100\n\n\
             [[workers]]\nurl = \"{}\"\nrole = \"decode\"\n",
            w.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let url = router.url.clone();
    eventually(Duration::from_secs(10), "a 429", || {
        let url = url.clone();
        async move {
            let resp = client()
                .post(format!("{url}/v1/chat/completions"))
                .json(&chat_body("hi", 2))
                .send()
                .await
                .unwrap();
            if resp.status() != 429 {
                return false;
            }
            assert_eq!(resp.headers()["retry-after"], "1");
            let err: Value = resp.json().await.unwrap();
            err["error"]["code"] == "all_workers_busy"
        }
    })
    .await;
}

/// A router in front of one instant sim worker whose model `MODEL` is tokenized by the
/// test model's own tokenizer, with long prompts computed under these limits.
fn router_tokenizing_with(max: usize, timeout_ms: u64) -> (Proc, Proc) {
    let worker = Proc::sim_worker(&["--instant"]);
    let tokenizer = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../workers-shim/tests/fixtures/tokenizers/local"
    );
    let cfg = temp_config(
        &format!("tokenizing-{max}-{timeout_ms}.toml"),
        &format!(
            "[router]\npolicy = \"kv_aware\"\ntokenize_threads = 1\nmax_tokenizing_prompts = {max}\n\
             tokenize_timeout_ms = {timeout_ms}\n\n[router.tokenizers]\n\"{}\" = \"{tokenizer}\"\n\n\
             [[workers]]\nurl = \"{}\"\nrole = \"decode\"\n",
            common::MODEL,
            worker.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    (worker, router)
}

async fn post_chat(router: &str, content: &str) -> (u16, Value) {
    let resp = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(&chat_body(content, 2))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// ~170 KB of varied text: tens of milliseconds of the model tokenizer's time at least.
fn agent_sized(tag: &str) -> String {
    (0..6000)
        .map(|i| format!("{tag} src/mod_{i}.rs: fn step_{i}() {{}} "))
        .collect()
}

/// Many clients sending the same long prompt at once share one computation: with room
/// for a single computation in flight, every one of them is served.
#[tokio::test]
async fn identical_long_prompts_at_once_are_tokenized_once() {
    let (_worker, router) = router_tokenizing_with(1, 30_000);
    let prompt = agent_sized("same");
    let sends = (0..8).map(|_| post_chat(&router.url, &prompt));
    for (status, body) in futures_util::future::join_all(sends).await {
        assert_eq!(status, 200, "{body}");
    }
}

/// A request waits for its prompt's computation within `tokenize_timeout_ms` (then a 503
/// `tokenize_timeout`); one more computation than `max_tokenizing_prompts` is refused at
/// once (503 `overloaded`); and a computation whose client gave up is kept, so the retry
/// is served at once.
#[tokio::test]
async fn long_prompts_wait_for_tokenizing_within_limits_and_a_given_up_one_is_kept() {
    let (_worker, router) = router_tokenizing_with(1, 1);
    let first = agent_sized("first");
    let (status, body) = post_chat(&router.url, &first).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "tokenize_timeout", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tokenizing the prompt did not finish within 1ms"));
    // The first computation is still running: another prompt finds no room.
    let (status, body) = post_chat(&router.url, &agent_sized("second")).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("too many long prompts are being tokenized"));
    // The first one's result was kept: sent again, it is served (computing it anew could
    // not finish within 1 ms).
    let router_url = router.url.clone();
    eventually(
        Duration::from_secs(30),
        "the first prompt served from its kept computation",
        || {
            let (url, prompt) = (router_url.clone(), first.clone());
            async move { post_chat(&url, &prompt).await.0 == 200 }
        },
    )
    .await;
}

/// A streamed chat request to `router`; returns the response once its first chunk arrived.
async fn first_chunk_of(router: &str, content: &str, max_tokens: u32) -> reqwest::Response {
    let mut body = chat_body(content, max_tokens);
    body["ignore_eos"] = json!(true);
    common::first_chunk(router, body).await.0
}

/// `ownerserve`'s plan for a chat request with `content` (the explain API).
async fn explain(router: &str, content: &str) -> Value {
    let resp = client()
        .post(format!("{router}/admin/v1/plan/explain"))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&chat_body(content, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The live router feeds its policy the decode lifetime the simulator feeds it
/// (`Policy::observe_decode`): a streamed response's first frame to its end, scaled to
/// the planner's time. The admission model waits that long for a decoder whose running
/// sequences hold the KV a step needs: here the prompt is larger than `a`'s whole
/// configured capacity, so it waits for everything running there to be released (one
/// lifetime) and for as much again as it needs beyond one pool (a lifetime per pool): the
/// plan's wait is the observed lifetime times prompt over capacity.
#[tokio::test]
async fn ownerserve_waits_for_kv_on_a_full_decoder_for_the_decode_lifetime_it_observed() {
    // Four simulated seconds per wall-clock second, ~10 ms of simulated time per token.
    let a = Proc::sim_worker(&["--time-scale", "4"]);
    let capacity = 2048u64;
    let cfg = temp_config(
        "decode_lifetime.toml",
        &format!(
            "[router]\npolicy = \"ownerserve\"\nplanner_time_scale = 4\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"decode\"\n\
             kv_capacity_tokens = {capacity}\n",
            a.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let running: String = (0..170).map(|i| format!("running step {i}; ")).collect();
    let large = running.repeat(4);
    let tokens = |plan: &Value| plan["inputs"]["prompt_tokens"].as_u64().unwrap();
    let a_tokens = tokens(&explain(&router.url, &running).await);
    let large_tokens = tokens(&explain(&router.url, &large).await);
    assert!(
        a_tokens < capacity && large_tokens >= capacity,
        "{a_tokens} running, {large_tokens} asked, {capacity} in all"
    );

    // One stream decodes to its end: its first chunk to its last is the lifetime.
    let mut first = first_chunk_of(&router.url, "tell me a story", 200).await;
    let started = Instant::now();
    while first.chunk().await.unwrap().is_some() {}
    let lifetime_s = 4.0 * started.elapsed().as_secs_f64();

    // Another holds most of `a`'s KV while the large prompt is planned.
    let _holder = first_chunk_of(&router.url, &running, 2000).await;
    let plan = explain(&router.url, &large).await;
    let wait_s = plan["chosen"]["cost"]["queue_s"].as_f64().unwrap();
    let expected_s = lifetime_s * large_tokens as f64 / capacity as f64;
    assert!(
        (wait_s - expected_s).abs() <= 0.25 * expected_s,
        "planned wait {wait_s} s against {expected_s} s (an observed decode lifetime of \
         {lifetime_s} s, {large_tokens} tokens asked of {capacity}): {plan:#}"
    );
}

/// Streams `n` chat requests of `max_tokens` at once to their end: `n` decode lifetimes
/// the router observes.
async fn decode_to_the_end(router: &str, n: usize, max_tokens: u32) {
    let streams = (0..n).map(|i| async move {
        let mut resp =
            first_chunk_of(router, &format!("story {i} of {max_tokens}"), max_tokens).await;
        while resp.chunk().await.unwrap().is_some() {}
    });
    futures_util::future::join_all(streams).await;
}

/// The live router counts how long each stream has decoded on its worker, in the
/// planner's time (`registry::Worker::decode_ages`), and the admission model reads it
/// (`kv_release`): once the observed lifetimes are heavy-tailed (most decodes end at once,
/// one in five runs long), the KV a stream holds is expected back soon while it is young,
/// and later once it has run past the short decodes: the same step on the same full
/// decoder is planned to wait longer.
#[tokio::test]
async fn ownerserve_waits_longer_for_kv_held_by_a_stream_that_has_decoded_longer() {
    let a = Proc::sim_worker(&["--time-scale", "4"]);
    let cfg = temp_config(
        "decode_ages.toml",
        &format!(
            "[router]\npolicy = \"ownerserve\"\nplanner_time_scale = 4\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"decode\"\n\
             kv_capacity_tokens = 2048\n",
            a.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    // 20 short decodes (~0.2 simulated seconds) and 5 long ones (~7 s).
    decode_to_the_end(&router.url, 20, 20).await;
    decode_to_the_end(&router.url, 5, 800).await;

    // A stream holds most of `a`'s KV; a step that needs more than is left waits for it.
    let running: String = (0..290).map(|i| format!("running step {i}; ")).collect();
    let probe: String = (0..120).map(|i| format!("probe step {i}; ")).collect();
    let tokens = |plan: &Value| plan["inputs"]["prompt_tokens"].as_u64().unwrap();
    let held = tokens(&explain(&router.url, &running).await);
    let asked = tokens(&explain(&router.url, &probe).await);
    assert!(
        held < 2048 && asked > 2048 - held && asked < held,
        "{held} held, {asked} asked of 2048"
    );
    let _holder = first_chunk_of(&router.url, &running, 2000).await;
    let young = explain(&router.url, &probe).await["chosen"]["cost"]["queue_s"]
        .as_f64()
        .unwrap();
    // Half a second of wall clock is two simulated seconds: past every short decode, a
    // long one (they have a few seconds more to run).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let plan = explain(&router.url, &probe).await;
    let old = plan["chosen"]["cost"]["queue_s"].as_f64().unwrap();
    assert!(young > 0.0, "the probe must wait for KV: {plan:#}");
    assert!(
        old > 1.5 * young,
        "planned wait {young} s behind a young stream, {old} s behind the same stream \
         older: {plan:#}"
    );
}
