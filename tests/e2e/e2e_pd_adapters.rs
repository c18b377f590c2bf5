//! The P/D adapters on the wire: a real router with `policy = "static_pd"` in front of
//! minimal fake engines (axum on 127.0.0.1:0) that record every completion request. They
//! replay vLLM's NixlConnector two-step (WIRE_FORMATS.md §4.1) and SGLang's bootstrap
//! protocol (§4.5), and the tests compare whole request bodies, headers and timing with
//! what those sections prescribe, including the fall-back to a whole request.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use common::{client, eventually, get_json, get_text, metric, temp_config, Proc, MODEL};
use serde_json::{json, Map, Value};
use tokio::sync::{oneshot, Notify};

/// How long the vLLM prefill fake holds its answer: a router that sent the decode leg
/// without waiting for it would be caught in the act.
const PREFILL_HOLD: Duration = Duration::from_millis(200);
/// How long a SGLang fake waits for its peer leg before answering anyway.
const RENDEZVOUS: Duration = Duration::from_secs(3);
/// `bootstrap_port` configured on the SGLang prefill worker.
const BOOTSTRAP_PORT: u16 = 8998;

// ----------------------------------------------------------------------------------------
// Fake engines

/// One request a fake engine received on a completions endpoint.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    path: String,
    headers: HeaderMap,
    body: Value,
    arrived: Instant,
    /// When the fake returned its answer (None while held or if the router hung up).
    answered: Option<Instant>,
    /// Whether the peer leg arrived while this one was held (SGLang rendezvous).
    met_peer: bool,
}

impl Seen {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map_or("", |v| v.to_str().unwrap_or("<not text>"))
    }
}

/// How a fake answers a completion request.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// vLLM prefill: a one-token completion plus top-level `kv_transfer_params`.
    NixlPrefill,
    /// A plain completion (SGLang prefill), or SSE frames when the request streams.
    Completion,
    /// An error status.
    Fail(StatusCode),
}

/// A fake engine's behaviour.
struct Behaviour {
    name: &'static str,
    reply: Reply,
    hold: Duration,
    /// Notified when a completion request arrives.
    announce: Option<Arc<Notify>>,
    /// Held until this is notified (at most `RENDEZVOUS`).
    wait_for: Option<Arc<Notify>>,
}

impl Behaviour {
    fn new(name: &'static str, reply: Reply) -> Self {
        Behaviour {
            name,
            reply,
            hold: Duration::ZERO,
            announce: None,
            wait_for: None,
        }
    }

    fn hold(mut self, d: Duration) -> Self {
        self.hold = d;
        self
    }

    fn rendezvous(mut self, announce: &Arc<Notify>, wait_for: &Arc<Notify>) -> Self {
        self.announce = Some(announce.clone());
        self.wait_for = Some(wait_for.clone());
        self
    }
}

struct FakeState {
    b: Behaviour,
    seen: Mutex<Vec<Seen>>,
}

/// A fake engine listening on 127.0.0.1.
struct Fake {
    url: String,
    state: Arc<FakeState>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Fake {
    async fn start(b: Behaviour) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(FakeState {
            b,
            seen: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/health", get(|| async { StatusCode::OK }))
            // SGLang's readiness check, which the router probes for SGLang workers.
            .route("/ready", get(|| async { StatusCode::OK }))
            .route(
                "/v1/models",
                get(|| async {
                    Json(json!({"object": "list", "data": [{"id": MODEL, "object": "model"}]}))
                }),
            )
            .route("/v1/chat/completions", post(completion))
            .route("/v1/completions", post(completion))
            .with_state(state.clone());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio_util::task::TaskTracker::new().spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Fake {
            url,
            state,
            stop: Some(stop),
            task,
        }
    }

    fn requests(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// The one request this fake received.
    fn only_request(&self) -> Seen {
        let seen = self.requests();
        assert_eq!(
            seen.len(),
            1,
            "{} should get exactly one request: {seen:#?}",
            self.state.b.name
        );
        seen.into_iter().next().unwrap()
    }

    /// Stops listening: the port is closed from now on.
    async fn close(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .expect("fake engine shuts down")
            .unwrap();
    }
}

async fn completion(
    State(f): State<Arc<FakeState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    raw: Bytes,
) -> Response {
    let arrived = Instant::now();
    let body: Value = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&raw).into_owned()));
    let stream = body["stream"] == true;
    let chat = uri.path() == "/v1/chat/completions";
    let i = {
        let mut seen = f.seen.lock().unwrap();
        seen.push(Seen {
            method,
            path: uri.path().to_owned(),
            headers,
            body,
            arrived,
            answered: None,
            met_peer: false,
        });
        seen.len() - 1
    };
    if let Some(n) = &f.b.announce {
        n.notify_one();
    }
    if let Some(n) = &f.b.wait_for {
        let met = tokio::time::timeout(RENDEZVOUS, n.notified()).await.is_ok();
        f.seen.lock().unwrap()[i].met_peer = met;
    }
    tokio::time::sleep(f.b.hold).await;
    let resp = match f.b.reply {
        Reply::NixlPrefill => {
            let mut answer = completion_json(f.b.name, chat, "length");
            answer["kv_transfer_params"] = prefill_params();
            Json(answer).into_response()
        }
        Reply::Completion if stream => (
            [(header::CONTENT_TYPE, "text/event-stream")],
            sse_frames(f.b.name),
        )
            .into_response(),
        Reply::Completion => Json(completion_json(f.b.name, chat, "stop")).into_response(),
        Reply::Fail(status) => (
            status,
            Json(json!({"error": {"message": "prefill exploded", "type": "internal"}})),
        )
            .into_response(),
    };
    f.seen.lock().unwrap()[i].answered = Some(Instant::now());
    resp
}

/// A non-streamed answer naming the fake that wrote it.
fn completion_json(name: &str, chat: bool, finish: &str) -> Value {
    let text = format!("answer from {name}");
    let choice = if chat {
        json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish})
    } else {
        json!({"index": 0, "text": text, "finish_reason": finish})
    };
    json!({
        "id": format!("cmpl-{name}"),
        "object": if chat { "chat.completion" } else { "text_completion" },
        "model": MODEL,
        "choices": [choice],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    })
}

/// The SSE stream a decoding fake sends.
fn sse_frames(name: &str) -> String {
    let chunk = |content: &str, finish: Value| {
        json!({
            "id": format!("chatcmpl-{name}"),
            "object": "chat.completion.chunk",
            "model": MODEL,
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]
        })
    };
    format!(
        "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
        chunk(&format!("streamed by {name}"), Value::Null),
        chunk("", json!("stop"))
    )
}

/// The modern `kv_transfer_params` a vLLM prefill returns (§4.1 step 2), with HMA block
/// groups and keys the router cannot know about, which must travel unchanged.
fn prefill_params() -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": [[1, 2, 3], [40, 41]],
        "remote_engine_id": "9b2e5d0c-6f1a-4c7e-9a43-5c2d1e0f7a11",
        "remote_request_id": "cmpl-prefill-internal-0",
        "remote_host": "10.1.2.3",
        "remote_port": 5601,
        "tp_size": 2,
        "dcp_size": 1,
        "pp_size": 1,
        "remote_num_tokens": 37,
        "remote_blocks_expiry_time": null,
        "transfer_mode": "pull",
        "x_vendor_extension": {"lease": 18_446_744_073_709_551_615_u64, "ratio": 0.25, "tags": ["a", null]}
    })
}

// ----------------------------------------------------------------------------------------
// Router and client helpers

/// A router with `static_pd` over one prefill and one decode worker of `engine`.
async fn pd_router(tag: &str, engine: &str, prefill: &Fake, decode: &Fake) -> Proc {
    pd_router_with(tag, engine, prefill, decode, "").await
}

/// [`pd_router`] with `extra` lines in its `[router]` table.
async fn pd_router_with(
    tag: &str,
    engine: &str,
    prefill: &Fake,
    decode: &Fake,
    extra: &str,
) -> Proc {
    let bootstrap = if engine == "sglang" {
        format!("bootstrap_port = {BOOTSTRAP_PORT}\n")
    } else {
        String::new()
    };
    let cfg = temp_config(
        &format!("pd-{tag}.toml"),
        &format!(
            "[router]\npolicy = \"static_pd\"\nhealth_interval_ms = 60000\nscrape_interval_ms = 0\n{extra}\n\
             [[workers]]\nname = \"p0\"\nurl = \"{}\"\nrole = \"prefill\"\nengine = \"{engine}\"\n{bootstrap}\n\
             [[workers]]\nname = \"d0\"\nurl = \"{}\"\nrole = \"decode\"\nengine = \"{engine}\"\n",
            prefill.url, decode.url
        ),
    );
    // Proc::router blocks this thread; the fakes answer its health checks on the
    // runtime's worker threads.
    let router = Proc::router(&[], &["--config", &cfg]);
    let url = router.url.clone();
    eventually(Duration::from_secs(10), "both workers healthy", || {
        let url = url.clone();
        async move {
            let w = get_json(&format!("{url}/admin/v1/workers")).await;
            w["workers"]
                .as_array()
                .is_some_and(|ws| ws.len() == 2 && ws.iter().all(|w| w["healthy"] == true))
        }
    })
    .await;
    router
}

async fn ask(
    router: &Proc,
    path: &str,
    body: &Value,
    request_id: Option<&str>,
) -> reqwest::Response {
    let mut req = client().post(format!("{}{path}", router.url)).json(body);
    if let Some(id) = request_id {
        req = req.header("x-request-id", id);
    }
    req.send().await.unwrap()
}

/// `(plans, fallbacks)` of the `remote_prefill` action in the router's `/metrics`.
async fn remote_prefill_counts(router: &Proc) -> (f64, f64) {
    let text = get_text(&format!("{}/metrics", router.url)).await;
    let labels = "{action=\"remote_prefill\",policy=\"static_pd\"}";
    (
        metric(&text, &format!("ownerserve_plans_total{labels} ")),
        metric(&text, &format!("ownerserve_plan_fallbacks_total{labels} ")),
    )
}

fn object(v: &Value) -> Map<String, Value> {
    v.as_object().expect("a JSON object").clone()
}

// ----------------------------------------------------------------------------------------
// vLLM NixlConnector (§4.1)

/// The prefill leg's body, written from §4.1 step 1.
fn nixl_prefill_body(client_body: &Value) -> Value {
    let mut o = object(client_body);
    o.remove("stream_options");
    o.remove("min_tokens");
    o.remove("min_completion_tokens");
    o.insert("stream".into(), json!(false));
    o.insert("max_tokens".into(), json!(1));
    if o.contains_key("max_completion_tokens") {
        o.insert("max_completion_tokens".into(), json!(1));
    }
    if o.get("n").and_then(Value::as_u64).is_some_and(|n| n > 1) {
        o.insert("n".into(), json!(1));
    }
    o.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null
        }),
    );
    Value::Object(o)
}

/// Both legs of one NIXL two-step: bodies, endpoint, shared request id, and order.
/// Returns the request id they shared.
fn check_nixl_legs(client_body: &Value, path: &str, prefill: &Fake, decode: &Fake) -> String {
    let p = prefill.only_request();
    let d = decode.only_request();
    for leg in [&p, &d] {
        assert_eq!(leg.method, Method::POST);
        assert_eq!(leg.path, path, "each leg goes to the client's endpoint");
        assert_eq!(leg.header("content-type"), "application/json");
    }
    assert_eq!(p.body, nixl_prefill_body(client_body), "prefill leg body");
    let mut want_decode = object(client_body);
    want_decode.insert("kv_transfer_params".into(), prefill_params());
    assert_eq!(
        d.body,
        Value::Object(want_decode),
        "decode leg = the original body plus the prefill's params, unchanged"
    );
    let id = p.header("x-request-id").to_owned();
    assert!(!id.is_empty(), "the prefill leg carries an X-Request-Id");
    assert_eq!(
        d.header("x-request-id"),
        id,
        "both legs share the X-Request-Id"
    );
    let answered = p.answered.expect("the prefill leg was answered");
    assert!(
        d.arrived >= answered,
        "the decode leg went out only after the prefill answered ({:?} early)",
        answered - d.arrived
    );
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_streaming_chat_prefills_then_decodes_with_the_returned_params() {
    let p = Fake::start(Behaviour::new("p0", Reply::NixlPrefill).hold(PREFILL_HOLD)).await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router("nixl-chat", "vllm", &p, &d).await;
    let body = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is disaggregated serving?"}
        ],
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": 64,
        "max_completion_tokens": 64,
        "min_tokens": 4,
        "min_completion_tokens": 4,
        "n": 2,
        "temperature": 0.7,
        "seed": 11,
        "logprobs": true,
        "top_logprobs": 2,
        "stop": ["\n\n"]
    });
    let resp = ask(
        &router,
        "/v1/chat/completions",
        &body,
        Some("client-req-42"),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ownerserve-worker"], "d0");
    let ctype = resp.headers()[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(ctype.starts_with("text/event-stream"), "{ctype}");
    assert_eq!(
        resp.text().await.unwrap(),
        sse_frames("d0"),
        "decode's SSE relayed"
    );
    let id = check_nixl_legs(&body, "/v1/chat/completions", &p, &d);
    assert_eq!(
        id, "client-req-42",
        "the client's X-Request-Id is passed through"
    );
    assert_eq!(remote_prefill_counts(&router).await, (1.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_completion_without_a_request_id_gets_one_shared_by_both_legs() {
    let p = Fake::start(Behaviour::new("p0", Reply::NixlPrefill).hold(PREFILL_HOLD)).await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router("nixl-completion", "vllm", &p, &d).await;
    let body = json!({
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 16,
        "temperature": 0.0,
        "echo": false
    });
    let resp = ask(&router, "/v1/completions", &body, None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ownerserve-worker"], "d0");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        answer,
        completion_json("d0", false, "stop"),
        "decode's answer relayed"
    );
    check_nixl_legs(&body, "/v1/completions", &p, &d);
    assert_eq!(remote_prefill_counts(&router).await, (1.0, 0.0));
}

/// The client's request ran whole on the decode worker after the prefill leg failed.
async fn check_nixl_fallback(router: &Proc, decode: &Fake, body: &Value, resp: reqwest::Response) {
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ownerserve-worker"], "d0");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer, completion_json("d0", true, "stop"));
    let d = decode.only_request();
    assert_eq!(
        &d.body, body,
        "the decode worker gets the original body, no params"
    );
    assert_eq!(d.header("x-request-id"), "fallback-1");
    assert_eq!(remote_prefill_counts(router).await, (1.0, 1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_prefill_error_falls_back_to_a_whole_request_on_decode() {
    let p = Fake::start(Behaviour::new(
        "p0",
        Reply::Fail(StatusCode::INTERNAL_SERVER_ERROR),
    ))
    .await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router("nixl-500", "vllm", &p, &d).await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "n": 3
    });
    let resp = ask(&router, "/v1/chat/completions", &body, Some("fallback-1")).await;
    let tried = p.only_request();
    assert_eq!(
        tried.body,
        nixl_prefill_body(&body),
        "n = 1 on the prefill leg"
    );
    check_nixl_fallback(&router, &d, &body, resp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nixl_prefill_on_a_closed_port_falls_back_to_a_whole_request_on_decode() {
    let mut p = Fake::start(Behaviour::new("p0", Reply::NixlPrefill)).await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router("nixl-closed", "vllm", &p, &d).await;
    p.close().await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_completion_tokens": 8
    });
    let resp = ask(&router, "/v1/chat/completions", &body, Some("fallback-1")).await;
    assert!(p.requests().is_empty());
    check_nixl_fallback(&router, &d, &body, resp).await;
}

// ----------------------------------------------------------------------------------------
// SGLang PD (§4.5)

/// A room as SGLang draws them: a u64 in [0, 2^63 - 1].
fn room(v: &Value) -> u64 {
    let r = v
        .as_u64()
        .unwrap_or_else(|| panic!("bootstrap_room {v} is not a u64"));
    assert!(r <= i64::MAX as u64, "bootstrap_room {r} > 2^63-1");
    r
}

/// Fakes for a SGLang pair that each hold their answer until the other leg arrived.
async fn sglang_pair() -> (Fake, Fake) {
    let (p_in, d_in) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let p = Fake::start(Behaviour::new("p0", Reply::Completion).rendezvous(&p_in, &d_in)).await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion).rendezvous(&d_in, &p_in)).await;
    (p, d)
}

/// Both legs got the same body, `client_body` plus the bootstrap triple (built by
/// `triple` from the rooms the router drew), concurrently. Returns the rooms.
fn check_sglang_legs(
    client_body: &Value,
    path: &str,
    prefill: &Fake,
    decode: &Fake,
    triple: impl Fn(&Value) -> (Value, Value, Value),
) -> Value {
    let p = prefill.only_request();
    let d = decode.only_request();
    let rooms = p.body["bootstrap_room"].clone();
    let (host, port, room) = triple(&rooms);
    let mut want = object(client_body);
    want.insert("bootstrap_host".into(), host);
    want.insert("bootstrap_port".into(), port);
    want.insert("bootstrap_room".into(), room);
    let want = Value::Object(want);
    for (leg, name) in [(&p, "prefill"), (&d, "decode")] {
        assert_eq!(leg.method, Method::POST);
        assert_eq!(leg.path, path);
        assert_eq!(leg.header("content-type"), "application/json");
        assert_eq!(leg.body, want, "{name} leg body");
    }
    assert_eq!(p.header("x-request-id"), d.header("x-request-id"));
    assert!(
        p.met_peer && d.met_peer,
        "both legs must be in flight at once (prefill saw decode: {}, decode saw prefill: {})",
        p.met_peer,
        d.met_peer
    );
    let last_in = p.arrived.max(d.arrived);
    let first_out = p.answered.unwrap().min(d.answered.unwrap());
    assert!(
        last_in <= first_out,
        "both legs arrived before either answered"
    );
    rooms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_sends_one_bootstrap_body_to_both_legs_concurrently() {
    let (p, d) = sglang_pair().await;
    let router = pd_router("sglang-chat", "sglang", &p, &d).await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Explain bootstrap rooms."}],
        "max_tokens": 32,
        "stream": true,
        "temperature": 0.2
    });
    let resp = ask(&router, "/v1/chat/completions", &body, None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ownerserve-worker"], "d0");
    assert_eq!(
        resp.text().await.unwrap(),
        sse_frames("d0"),
        "decode's SSE relayed"
    );
    check_sglang_legs(&body, "/v1/chat/completions", &p, &d, |r| {
        room(r);
        (json!("127.0.0.1"), json!(BOOTSTRAP_PORT), r.clone())
    });
    assert_eq!(remote_prefill_counts(&router).await, (1.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_batch_gets_one_room_per_item() {
    let (p, d) = sglang_pair().await;
    let router = pd_router("sglang-batch", "sglang", &p, &d).await;
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "n": 2});
    let resp = ask(&router, "/v1/completions", &body, None).await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer, completion_json("d0", false, "stop"));
    let rooms = check_sglang_legs(&body, "/v1/completions", &p, &d, |r| {
        let rooms = r.as_array().expect("bootstrap_room is an array for n = 2");
        assert_eq!(rooms.len(), 2);
        (
            json!(["127.0.0.1", "127.0.0.1"]),
            json!([BOOTSTRAP_PORT, BOOTSTRAP_PORT]),
            r.clone(),
        )
    });
    let rooms = rooms.as_array().unwrap();
    assert_ne!(
        room(&rooms[0]),
        room(&rooms[1]),
        "one distinct room per item"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_prefill_error_retries_the_whole_request_on_decode() {
    let p = Fake::start(Behaviour::new(
        "p0",
        Reply::Fail(StatusCode::INTERNAL_SERVER_ERROR),
    ))
    .await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router("sglang-500", "sglang", &p, &d).await;
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8
    });
    let resp = ask(&router, "/v1/chat/completions", &body, None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-ownerserve-worker"], "d0");
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer, completion_json("d0", true, "stop"));
    let paired = p.only_request().body;
    room(&paired["bootstrap_room"]);
    // The decode leg of the pair may or may not have reached the decode worker before the
    // router cancelled it; the retry must have, without the bootstrap fields.
    let seen = d.requests();
    let (whole, paired_legs): (Vec<_>, Vec<_>) = seen
        .iter()
        .partition(|s| s.body.get("bootstrap_room").is_none());
    assert_eq!(whole.len(), 1, "one whole-request retry: {seen:#?}");
    assert_eq!(whole[0].body, body, "the retry is the client's body");
    assert!(paired_legs.len() <= 1 && paired_legs.iter().all(|s| s.body == paired));
    assert_eq!(remote_prefill_counts(&router).await, (1.0, 1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_keys_stay_at_the_router_and_the_engines_get_the_engine_key() {
    let p = Fake::start(Behaviour::new("p0", Reply::NixlPrefill)).await;
    let d = Fake::start(Behaviour::new("d0", Reply::Completion)).await;
    let router = pd_router_with(
        "keys",
        "vllm",
        &p,
        &d,
        "api_keys = [\"client-key-123\", \"client-key-456\"]\nengine_api_key = \"engine-key-789\"\n",
    )
    .await;
    let body = json!({"model": MODEL, "prompt": "The capital of France is", "max_tokens": 4});
    let url = format!("{}/v1/completions", router.url);
    // No key, or a wrong one: OpenAI's 401, and no engine sees anything.
    for req in [
        client().post(&url),
        client().post(&url).bearer_auth("client-key-999"),
    ] {
        let resp = req.json(&body).send().await.unwrap();
        assert_eq!(resp.status(), 401);
        let err: Value = resp.json().await.unwrap();
        assert_eq!(err["error"]["code"], "invalid_api_key");
    }
    assert!(p.requests().is_empty() && d.requests().is_empty());
    // A key as a bearer token (OpenAI clients) or in x-api-key (Anthropic clients).
    let bearer = client()
        .post(&url)
        .bearer_auth("client-key-123")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(bearer.status(), 200);
    let x_api_key = client()
        .post(&url)
        .header("x-api-key", "client-key-456")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(x_api_key.status(), 200);
    // Before, the client's Authorization went on to the engines; now both legs carry the
    // engine's key and nothing of the client's.
    for seen in p.requests().iter().chain(d.requests().iter()) {
        assert_eq!(
            seen.header("authorization"),
            "Bearer engine-key-789",
            "{}",
            seen.path
        );
        assert_eq!(seen.header("x-api-key"), "");
    }
    assert_eq!(p.requests().len(), 2);
    assert_eq!(d.requests().len(), 2);
}
