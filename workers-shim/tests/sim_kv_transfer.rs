//! KV transfer between two real simulated engines on loopback: vLLM NIXL-style prefill
//! and decode legs, fetch from an owner's cache, migration pre-copy and drop with epoch
//! fencing, recompute when the source is gone, and malformed bodies.
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::net::SocketAddr;

use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_shim::sim::config::SimSettings;
use ownerserve_shim::sim::server::{bind_publisher, serve};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// KV bytes of one 16-token block of Llama-3.1-8B (128 KiB per token).
const BLOCK_BYTES: u64 = 131_072 * 16;

/// One simulated engine serving on an ephemeral loopback port.
struct Sim {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Sim {
    async fn start() -> Self {
        let settings = SimSettings {
            instant: true,
            max_kv_blocks: 4096,
            ..SimSettings::default()
        };
        let cfg = settings.build().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let publisher = bind_publisher(&cfg).await.unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio_util::task::TaskTracker::new().spawn(serve(
            listener,
            cfg,
            publisher,
            shutdown.clone(),
        ));
        Self {
            addr,
            shutdown,
            task,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn post(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
        let mut call = reqwest::Client::new().post(self.url(path)).json(body);
        for (k, v) in headers {
            call = call.header(*k, *v);
        }
        Reply::read(call.send().await.unwrap()).await
    }

    async fn post_raw(&self, path: &str, body: &'static str) -> Reply {
        let call = reqwest::Client::new()
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body);
        Reply::read(call.send().await.unwrap()).await
    }

    async fn metric(&self, name: &str) -> f64 {
        let text = reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let prefix = format!("{name}{{");
        text.lines()
            .find(|l| l.starts_with(&prefix))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
            .parse()
            .unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
    }
}

/// A response read whole.
struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Reply {
    async fn read(r: reqwest::Response) -> Self {
        Self {
            status: r.status(),
            headers: r.headers().clone(),
            text: r.text().await.unwrap(),
        }
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("{e}: {}", self.text))
    }

    fn header(&self, name: &str) -> u64 {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }

    fn header_f64(&self, name: &str) -> f64 {
        self.headers[name].to_str().unwrap().parse().unwrap()
    }
}

fn chat_body(text: &str, max_tokens: u32) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
    })
}

/// A prompt long enough for a few dozen blocks, different per `seed`.
fn long_text(seed: u32) -> String {
    (0..120)
        .map(|i| format!("w{}x{} ", seed, i * 7 % 13))
        .collect()
}

/// The prefill leg exactly as a NIXL proxy sends it.
fn prefill_leg(mut body: Value) -> Value {
    body["max_tokens"] = json!(1);
    body["stream"] = json!(false);
    body["kv_transfer_params"] = json!({
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null
    });
    body
}

fn error_code(reply: &Reply) -> Value {
    reply.json()["error"]["code"].clone()
}

/// Tokens the engine serves from cache for a fully cached `prompt`-token prompt: every
/// full block except that the last prompt token is always computed.
fn cached_when_all_blocks_held(prompt: u64) -> u64 {
    (prompt - 1) / 16 * 16
}

#[tokio::test]
async fn prefill_then_decode_pulls_the_prompt_blocks_from_the_prefill_engine() {
    let (a, b) = (Sim::start().await, Sim::start().await);
    let original = chat_body(&long_text(1), 8);

    let p = a
        .post(
            "/v1/chat/completions",
            &prefill_leg(original.clone()),
            &[("x-request-id", "req-1")],
        )
        .await;
    assert_eq!(p.status, StatusCode::OK, "{}", p.text);
    let body = p.json();
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap();
    let full_blocks = prompt / 16;
    assert!(full_blocks >= 10, "prompt of {prompt} tokens");
    let params = body["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], json!(true));
    assert_eq!(params["do_remote_decode"], json!(false));
    assert_eq!(params["remote_port"], json!(a.addr.port()));
    assert_eq!(params["remote_host"], json!("127.0.0.1"));
    assert_eq!(params["remote_num_tokens"], json!(prompt));
    assert_eq!(params["remote_request_id"], json!("req-1"));
    assert_eq!(params["tp_size"], json!(1));
    assert_eq!(params["transfer_mode"], json!("pull"));
    assert_eq!(params["remote_blocks_expiry_time"], Value::Null);
    assert_eq!(
        params["remote_block_ids"].as_array().unwrap().len() as u64,
        full_blocks
    );
    assert_eq!(p.header("x-ownerserve-computed-tokens"), prompt);
    assert!(
        a.metric("vllm:kv_cache_usage_perc").await > 0.0,
        "the prompt blocks are pinned for the decode leg"
    );

    let mut decode = original.clone();
    decode["kv_transfer_params"] = params;
    let d = b
        .post(
            "/v1/chat/completions",
            &decode,
            &[("x-request-id", "req-1")],
        )
        .await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(d.header("x-ownerserve-prompt-tokens"), prompt);
    assert_eq!(
        d.header("x-ownerserve-cached-tokens"),
        cached_when_all_blocks_held(prompt)
    );
    assert!(d.header("x-ownerserve-computed-tokens") <= 16);
    assert_eq!(
        d.header("x-ownerserve-kv-received-bytes"),
        full_blocks * BLOCK_BYTES
    );
    let expected_ms = (10e-6 + (full_blocks * BLOCK_BYTES) as f64 / 50e9) * 1e3;
    assert!((d.header_f64("x-ownerserve-kv-transfer-ms") - expected_ms).abs() < 1e-3);
    assert_eq!(
        d.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        json!(cached_when_all_blocks_held(prompt))
    );
    assert_eq!(d.json()["usage"]["completion_tokens"], json!(8));

    let bytes = (full_blocks * BLOCK_BYTES) as f64;
    assert_eq!(b.metric("ownerserve_kv_received_bytes_total").await, bytes);
    assert_eq!(a.metric("ownerserve_kv_sent_bytes_total").await, bytes);
    assert_eq!(b.metric("ownerserve_kv_transfers_total").await, 1.0);
    assert!(b.metric("ownerserve_kv_transfer_seconds_total").await > 0.0);
    assert_eq!(
        b.metric("ownerserve_prefill_computed_tokens_total").await,
        (prompt - cached_when_all_blocks_held(prompt)) as f64
    );
    assert_eq!(
        a.metric("vllm:kv_cache_usage_perc").await,
        0.0,
        "the pull ended the pin"
    );

    // The streaming decode leg of another prompt reports the same way, in its headers.
    let original = chat_body(&long_text(2), 4);
    let p = a
        .post(
            "/v1/chat/completions",
            &prefill_leg(original.clone()),
            &[("x-request-id", "req-2")],
        )
        .await;
    let mut decode = original;
    decode["kv_transfer_params"] = p.json()["kv_transfer_params"].clone();
    decode["stream"] = json!(true);
    let prompt = p.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let d = b
        .post(
            "/v1/chat/completions",
            &decode,
            &[("x-request-id", "req-2")],
        )
        .await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(d.headers["content-type"], "text/event-stream");
    assert_eq!(
        d.header("x-ownerserve-cached-tokens"),
        cached_when_all_blocks_held(prompt)
    );
    assert_eq!(
        d.header("x-ownerserve-kv-received-bytes"),
        prompt / 16 * BLOCK_BYTES
    );
    assert!(d.text.trim_end().ends_with("data: [DONE]"), "{}", d.text);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn a_decode_leg_can_fetch_from_an_owner_cache_without_a_prefill_leg() {
    let (a, b) = (Sim::start().await, Sim::start().await);
    let body = chat_body(&long_text(3), 2);
    let warm = a.post("/v1/chat/completions", &body, &[]).await;
    assert_eq!(warm.status, StatusCode::OK);
    let prompt = warm.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(warm.header("x-ownerserve-cached-tokens"), 0);
    assert!(
        warm.json().get("kv_transfer_params").is_none(),
        "plain requests get no params"
    );

    let mut fetch = body.clone();
    fetch["kv_transfer_params"] = json!({
        "do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "owner",
        "remote_block_ids": [], "remote_request_id": null, "remote_host": "127.0.0.1",
        "remote_port": a.addr.port(), "remote_num_tokens": prompt, "tp_size": 1
    });
    let d = b.post("/v1/chat/completions", &fetch, &[]).await;
    assert_eq!(d.status, StatusCode::OK, "{}", d.text);
    assert_eq!(
        d.header("x-ownerserve-cached-tokens"),
        cached_when_all_blocks_held(prompt)
    );
    let bytes = (prompt / 16 * BLOCK_BYTES) as f64;
    assert_eq!(b.metric("ownerserve_kv_received_bytes_total").await, bytes);
    assert_eq!(a.metric("ownerserve_kv_sent_bytes_total").await, bytes);

    // Once cached here, the same leg pulls nothing more.
    let again = b.post("/v1/chat/completions", &fetch, &[]).await;
    assert_eq!(again.header("x-ownerserve-kv-received-bytes"), 0);
    assert_eq!(b.metric("ownerserve_kv_transfers_total").await, 1.0);
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn precopy_then_drop_fences_the_old_owner() {
    let (a, b) = (Sim::start().await, Sim::start().await);
    let tokens: Vec<u32> = (1..=160).collect();
    let hashes = prompt_hashes(&tokens, 16, XXH3_SEED);
    let completion = json!({"model": MODEL, "prompt": tokens, "max_tokens": 1});
    let warm = a.post("/v1/completions", &completion, &[]).await;
    assert_eq!(warm.status, StatusCode::OK, "{}", warm.text);

    let fetched = b
        .post(
            "/ownerserve/v1/kv/fetch",
            &json!({"remote_host": "127.0.0.1", "remote_port": a.addr.port(),
                    "block_hashes": hashes, "session": "s1", "epoch": 2}),
            &[],
        )
        .await;
    assert_eq!(fetched.status, StatusCode::OK, "{}", fetched.text);
    let f = fetched.json();
    assert_eq!(f["blocks"], json!(10));
    assert_eq!(f["bytes"], json!(10 * BLOCK_BYTES));
    assert_eq!(f["cached_blocks"], json!(10));
    assert!(f["transfer_ms"].as_f64().unwrap() > 0.0);
    let on_b = b.post("/v1/completions", &completion, &[]).await;
    assert_eq!(on_b.header("x-ownerserve-cached-tokens"), 144);
    assert_eq!(on_b.header("x-ownerserve-computed-tokens"), 16);

    let dropped = a
        .post(
            "/ownerserve/v1/kv/drop",
            &json!({"block_hashes": hashes, "session": "s1", "epoch": 3}),
            &[],
        )
        .await;
    assert_eq!(dropped.status, StatusCode::OK, "{}", dropped.text);
    assert_eq!(dropped.json(), json!({"dropped": 10}));
    assert_eq!(a.metric("ownerserve_kv_dropped_blocks_total").await, 10.0);

    let fenced = |epoch: &'static str| {
        [
            ("x-ownerserve-session", "s1"),
            ("x-ownerserve-epoch", epoch),
        ]
    };
    let stale = a.post("/v1/completions", &completion, &fenced("2")).await;
    assert_eq!(stale.status, StatusCode::CONFLICT, "{}", stale.text);
    assert_eq!(
        stale.json(),
        json!({"error": {
            "message": "stale epoch 2 for session s1: this worker has seen epoch 3",
            "type": "invalid_request_error", "param": null, "code": "stale_epoch"}})
    );
    assert_eq!(
        a.metric("ownerserve_stale_epoch_rejections_total").await,
        1.0
    );
    let current = a.post("/v1/completions", &completion, &fenced("3")).await;
    assert_eq!(current.status, StatusCode::OK, "{}", current.text);
    assert_eq!(
        current.header("x-ownerserve-cached-tokens"),
        0,
        "the dropped blocks are gone"
    );
    let other_session = [("x-ownerserve-session", "s2"), ("x-ownerserve-epoch", "0")];
    let other = a.post("/v1/completions", &completion, &other_session).await;
    assert_eq!(other.status, StatusCode::OK);

    // Stale pulls and drops are refused too, through their body fields.
    let pull = a
        .post(
            "/ownerserve/v1/kv/pull",
            &json!({"request_id": null, "block_hashes": hashes, "session": "s1", "epoch": 1}),
            &[],
        )
        .await;
    assert_eq!(pull.status, StatusCode::CONFLICT);
    assert_eq!(error_code(&pull), json!("stale_epoch"));
    let drop = a
        .post(
            "/ownerserve/v1/kv/drop",
            &json!({"block_hashes": hashes, "session": "s1", "epoch": 2}),
            &[],
        )
        .await;
    assert_eq!(drop.status, StatusCode::CONFLICT);
    let pull = a
        .post(
            "/ownerserve/v1/kv/pull",
            &json!({"request_id": null, "block_hashes": hashes}),
            &[],
        )
        .await;
    assert_eq!(pull.json()["blocks"], json!(10), "recomputed at epoch 3");
    assert_eq!(
        a.metric("ownerserve_stale_epoch_rejections_total").await,
        3.0
    );
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn an_unreachable_source_means_recompute_and_a_counted_failure() {
    let b = Sim::start().await;
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap().port()
    };
    for (seed, stream) in [(4, false), (5, true)] {
        // A new prompt each time: a cached one would need no pull.
        let mut body = chat_body(&long_text(seed), 3);
        body["kv_transfer_params"] = json!({
            "do_remote_prefill": true, "remote_host": "127.0.0.1", "remote_port": closed,
            "remote_request_id": "gone", "remote_num_tokens": 10_000
        });
        body["stream"] = json!(stream);
        let d = b.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(d.status, StatusCode::OK, "{}", d.text);
        assert_eq!(d.header("x-ownerserve-kv-received-bytes"), 0);
        if !stream {
            assert_eq!(
                d.header("x-ownerserve-computed-tokens"),
                d.header("x-ownerserve-prompt-tokens")
            );
        }
    }
    assert_eq!(b.metric("ownerserve_kv_transfer_failures_total").await, 2.0);
    assert_eq!(b.metric("ownerserve_kv_transfers_total").await, 0.0);
    let fetch = b
        .post(
            "/ownerserve/v1/kv/fetch",
            &json!({"remote_host": "127.0.0.1", "remote_port": closed, "block_hashes": [1, 2]}),
            &[],
        )
        .await;
    assert_eq!(fetch.status, StatusCode::BAD_GATEWAY, "{}", fetch.text);
    assert!(fetch.json()["error"]["message"].is_string());
    b.stop().await;
}

#[tokio::test]
async fn malformed_kv_bodies_and_fence_headers_are_400_json() {
    let a = Sim::start().await;
    let bad_bodies: &[&'static str] = &[
        "not json",
        "[1,2]",
        "{}",
        r#"{"block_hashes": "x"}"#,
        r#"{"block_hashes": [-1]}"#,
        r#"{"block_hashes": [1.5]}"#,
        r#"{"block_hashes": [1], "epoch": "seven"}"#,
        r#"{"block_hashes": [1], "session": 5, "epoch": 1}"#,
    ];
    let fetch_only: &[&'static str] = &[
        r#"{"block_hashes": [1], "remote_port": 80}"#,
        r#"{"block_hashes": [1], "remote_host": "h", "remote_port": 70000}"#,
    ];
    for path in [
        "/ownerserve/v1/kv/pull",
        "/ownerserve/v1/kv/fetch",
        "/ownerserve/v1/kv/drop",
    ] {
        let extra = if path.ends_with("fetch") {
            fetch_only
        } else {
            &[]
        };
        for body in bad_bodies.iter().chain(extra) {
            let r = a.post_raw(path, body).await;
            assert_eq!(
                r.status,
                StatusCode::BAD_REQUEST,
                "{path} {body}: {}",
                r.text
            );
            assert!(r.json()["error"]["message"].is_string(), "{path} {body}");
        }
    }
    let ok = json!({"block_hashes": [1]});
    let bad_epoch = [("x-ownerserve-session", "s"), ("x-ownerserve-epoch", "x1")];
    let r = a.post("/ownerserve/v1/kv/drop", &ok, &bad_epoch).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = a
        .post("/v1/chat/completions", &chat_body("hi", 1), &bad_epoch)
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    for params in [
        json!({"do_remote_prefill": true}),
        json!(5),
        json!({"do_remote_prefill": true, "remote_host": "h", "remote_port": "p"}),
    ] {
        let mut body = chat_body("hi", 1);
        body["kv_transfer_params"] = params;
        let r = a.post("/v1/chat/completions", &body, &[]).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        assert_eq!(r.json()["error"]["param"], json!("kv_transfer_params"));
    }
    let r = a.post("/ownerserve/v1/kv/pull", &ok, &[]).await;
    assert_eq!(r.status, StatusCode::OK, "still serving: {}", r.text);
    assert_eq!(r.json()["blocks"], json!(0));
    a.stop().await;
}
