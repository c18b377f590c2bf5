//! Engine-aware and passive health on the wire: a real router in front of small engines
//! (axum on 127.0.0.1:0) whose `/health` is slow, as SGLang's always is (a generation probe
//! that waits at least 1 s) and vLLM's can be under load.
//!
//! - an SGLang worker is probed at `/ready`, so a slow `/health` never takes it down, even
//!   idle, with the default health settings;
//! - a worker whose probe times out stays up while it serves proxied requests, and goes
//!   down once it stops serving (so the first half can fail), and a fast probe brings it
//!   back.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use common::{client, eventually, get_json, temp_config, Proc, MODEL};

/// What the engine does, shared with its handlers.
#[derive(Default)]
struct Engine {
    /// `/health` sleeps 3 s before answering.
    slow_health: AtomicBool,
    health_calls: AtomicU32,
    ready_calls: AtomicU32,
}

/// Starts an engine on 127.0.0.1; its URL and state.
async fn engine(slow_health: bool) -> (String, Arc<Engine>) {
    let state = Arc::new(Engine::default());
    state.slow_health.store(slow_health, Ordering::Relaxed);
    let app = Router::new()
        .route(
            "/health",
            get(|State(e): State<Arc<Engine>>| async move {
                e.health_calls.fetch_add(1, Ordering::Relaxed);
                if e.slow_health.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                StatusCode::OK
            }),
        )
        .route(
            "/ready",
            get(|State(e): State<Arc<Engine>>| async move {
                e.ready_calls.fetch_add(1, Ordering::Relaxed);
                StatusCode::OK
            }),
        )
        .route(
            "/v1/models",
            get(|| async { Json(json!({"object": "list", "data": [{"id": MODEL}]})) }),
        )
        .route(
            "/v1/completions",
            post(|| async {
                Json(json!({
                    "id": "cmpl-1", "object": "text_completion", "model": MODEL,
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
                }))
            }),
        )
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // The engine lives as long as the test's runtime.
    tokio_util::task::TaskTracker::new()
        .spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, state)
}

/// A router in front of one worker, `[router]` lines `extra`; it waits for the worker up.
async fn router(tag: &str, url: &str, engine: &str, extra: &str) -> Proc {
    let cfg = temp_config(
        &format!("health-{tag}.toml"),
        &format!(
            "[router]\nscrape_interval_ms = 0\n{extra}\n\
             [[workers]]\nname = \"{tag}-engine\"\nurl = \"{url}\"\nrole = \"hybrid\"\nengine = \"{engine}\"\n"
        ),
    );
    // Proc::router blocks this thread; the engines answer on the runtime's other threads.
    let r = Proc::router(&[], &["--config", &cfg]);
    wait_up(&r.url, true).await;
    r
}

async fn worker(router: &str) -> Value {
    get_json(&format!("{router}/admin/v1/workers")).await["workers"][0].clone()
}

async fn wait_up(router: &str, up: bool) {
    let router = router.to_owned();
    eventually(
        Duration::from_secs(10),
        &format!("worker healthy = {up}"),
        || {
            let router = router.clone();
            async move { worker(&router).await["healthy"] == up }
        },
    )
    .await;
}

async fn complete(router: &str) -> u16 {
    let body = json!({"model": MODEL, "prompt": "hello", "max_tokens": 1});
    let resp = client()
        .post(format!("{router}/v1/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    resp.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_worker_is_probed_at_ready_and_stays_up_with_default_settings() {
    let (url, e) = engine(true).await;
    let r = router("sglang", &url, "sglang", "").await;
    // Idle for 4 default probe intervals: a /health probe would time out (1 s) every time.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let w = worker(&r.url).await;
    assert_eq!(w["healthy"], true, "{w}");
    assert_eq!(w["consecutive_failures"], 0, "{w}");
    assert_eq!(
        e.health_calls.load(Ordering::Relaxed),
        0,
        "never its slow /health"
    );
    assert!(e.ready_calls.load(Ordering::Relaxed) >= 3);
    assert_eq!(complete(&r.url).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_worker_whose_probe_times_out_stays_up_until_it_stops_serving() {
    let (url, e) = engine(false).await;
    let r = router(
        "vllm",
        &url,
        "vllm",
        "health_interval_ms = 200\nhealth_timeout_ms = 300\nhealth_failure_threshold = 2\n",
    )
    .await;
    // From now on every probe times out: without passive health the worker would be down
    // within 2 intervals + 2 timeouts (1 s).
    e.slow_health.store(true, Ordering::Relaxed);
    let end = Instant::now() + Duration::from_secs(3);
    let mut statuses = Vec::new();
    while Instant::now() < end {
        statuses.push(complete(&r.url).await);
        assert_eq!(worker(&r.url).await["healthy"], true, "down while serving");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert!(
        e.health_calls.load(Ordering::Relaxed) >= 5,
        "probed all along"
    );
    // Idle, the failed probes count: suspect, then down.
    wait_up(&r.url, false).await;
    // A fast probe brings it back.
    e.slow_health.store(false, Ordering::Relaxed);
    wait_up(&r.url, true).await;
}

/// Sends `n` streams at once through `router`; how many each worker served.
async fn spread(router: &str, n: usize) -> std::collections::BTreeMap<String, usize> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let url = format!("{router}/v1/chat/completions");
            tokio_util::task::TaskTracker::new().spawn(async move {
                let mut body = common::chat_body(&format!("new prompt {i} about the repo"), 300);
                body["stream"] = serde_json::json!(true);
                let resp = common::client().post(url).json(&body).send().await.unwrap();
                let worker = resp.headers()["x-ownerserve-worker"]
                    .to_str()
                    .unwrap()
                    .to_owned();
                resp.bytes().await.unwrap();
                worker
            })
        })
        .collect();
    let mut out = std::collections::BTreeMap::new();
    for t in tasks {
        *out.entry(t.await.unwrap()).or_default() += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_back_up_warms_up_instead_of_taking_every_new_prompt() {
    let ports: Vec<String> = (0..3).map(|_| common::free_port().to_string()).collect();
    let mut workers: Vec<Proc> = ports.iter().map(|p| Proc::sim_worker_on(p, &[])).collect();
    let flags: Vec<String> = ports
        .iter()
        .zip(["a", "b", "c"])
        .map(|(p, n)| format!("http://127.0.0.1:{p},role=hybrid,name={n}"))
        .collect();
    let router_with = |warmup: &str| {
        let cfg = common::temp_config(
            &format!("warmup-{warmup}.toml"),
            &format!(
                "[router]\npolicy = \"least_loaded\"\n\n[router.health]\ninterval_ms = 100\n\
                 failure_threshold = 1\nwarmup_s = {warmup}\n"
            ),
        );
        Proc::router(&flags, &["--config", &cfg])
    };
    let warming = router_with("60");
    let baseline = router_with("0");
    for r in [&warming.url, &baseline.url] {
        common::eventually(Duration::from_secs(10), "three workers up", || {
            let url = format!("{r}/admin/v1/workers");
            async move {
                let w = common::get_json(&url).await;
                w["workers"]
                    .as_array()
                    .is_some_and(|ws| ws.iter().filter(|w| w["healthy"] == true).count() == 3)
            }
        })
        .await;
    }
    // Both routers start with all three new: none is held back. Then c goes down and comes
    // back, for both; the warming router's warm peers are a and b.
    tokio::time::sleep(Duration::from_secs(1)).await;
    workers[2].kill();
    for r in [&warming.url, &baseline.url] {
        common::eventually(Duration::from_secs(10), "c down", || {
            let url = format!("{r}/admin/v1/workers");
            async move { common::get_json(&url).await["workers"][2]["healthy"] == false }
        })
        .await;
    }
    workers[2] = Proc::sim_worker_on(&ports[2], &[]);
    for r in [&warming.url, &baseline.url] {
        common::eventually(Duration::from_secs(10), "c back", || {
            let url = format!("{r}/admin/v1/workers");
            async move { common::get_json(&url).await["workers"][2]["healthy"] == true }
        })
        .await;
    }
    let held = spread(&warming.url, 24).await;
    let open = spread(&baseline.url, 24).await;
    eprintln!("24 new streams, c just back: warming {held:?}, without warm-up {open:?}");
    let on_c = |m: &std::collections::BTreeMap<String, usize>| m.get("c").copied().unwrap_or(0);
    assert!(on_c(&open) >= 6, "least loaded spreads evenly: {open:?}");
    assert!(
        on_c(&held) <= 2,
        "c warms up with a request or two: {held:?}"
    );
}
