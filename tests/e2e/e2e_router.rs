//! The router as a black box: real `ownerserve` processes on loopback.
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::{Duration, Instant};

use common::{chat_body, client, dead_address, eventually, get_json, temp_config, Proc, MODEL};
use serde_json::{json, Value};

async fn workers(url: &str) -> Value {
    get_json(&format!("{url}/admin/v1/workers")).await
}

#[tokio::test]
async fn round_robin_spreads_requests_over_decode_and_hybrid_workers() {
    let stack = Proc::up(&["--instant", "true", "--policy", "round_robin"]);
    let c = client();
    let mut served = Vec::new();
    for i in 0..6 {
        let resp = c
            .post(format!("{}/v1/chat/completions", stack.url))
            .json(&chat_body(&format!("question {i}"), 4))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        served.push(
            resp.headers()["x-ownerserve-worker"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["usage"]["completion_tokens"], 4);
    }
    assert_eq!(
        served,
        ["decode-0", "decode-1", "hybrid-0", "decode-0", "decode-1", "hybrid-0"]
    );
    let w = workers(&stack.url).await;
    assert_eq!(w["policy"], "round_robin");
    let rows = w["workers"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for row in rows {
        for key in ["id", "url", "role", "engine", "healthy"] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["healthy"], true);
        assert_eq!(row["engine"], "sim");
    }
    let models = get_json(&format!("{}/v1/models", stack.url)).await;
    assert_eq!(models["data"][0]["id"], MODEL);
}

#[tokio::test]
async fn streams_pass_through_chunk_by_chunk() {
    // Real time: ~10 ms per decode step, so 100 tokens take about a second.
    let stack = Proc::up(&[]);
    let mut body = chat_body("tell me a story", 100);
    body["ignore_eos"] = json!(true);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let mut resp = client()
        .post(format!("{}/v1/chat/completions", stack.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let start = Instant::now();
    let mut first = None;
    let mut text = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        first.get_or_insert(start.elapsed());
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let total = start.elapsed();
    let first = first.unwrap();
    // A buffering proxy would deliver everything at once at the end.
    assert!(
        total - first > Duration::from_millis(300),
        "first chunk at {first:?}, end at {total:?}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"));
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 100);
    let content_chunks = events
        .iter()
        .filter(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        })
        .count();
    assert_eq!(content_chunks, 100);
}

#[tokio::test]
async fn malformed_requests_get_openai_errors_and_the_router_survives() {
    let stack = Proc::up(&["--instant", "true"]);
    let c = client();
    let chat = format!("{}/v1/chat/completions", stack.url);
    let big = "x".repeat(33 * 1024 * 1024);
    let cases: Vec<(&str, String, Vec<u8>, u16)> = vec![
        ("POST", chat.clone(), b"{not json".to_vec(), 400),
        ("POST", chat.clone(), b"[1,2,3]".to_vec(), 400),
        ("POST", chat.clone(), b"".to_vec(), 400),
        ("POST", chat.clone(), vec![0xff, 0xfe, 0x00], 400),
        ("POST", chat.clone(), br#"{"messages":[{"role":"user","content":"x"}]}"#.to_vec(), 400),
        ("POST", chat.clone(), br#"{"model":42,"messages":[]}"#.to_vec(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}"}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[]}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":{{"role":"user"}}}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"robot","content":"x"}}]}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":{{"a":1}}}}]}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"max_tokens":-1}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"max_tokens":"many"}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"n":1000}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"temperature":-1}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"stream":1}}"#).into_bytes(), 400),
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"stop":[1]}}"#).into_bytes(), 400),
        // Passes the router; the worker refuses it (context length), and the router relays that.
        ("POST", chat.clone(), format!(r#"{{"model":"{MODEL}","messages":[{{"role":"user","content":"x"}}],"max_tokens":4000000}}"#).into_bytes(), 400),
        ("POST", chat.clone(), br#"{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}"#.to_vec(), 404),
        ("POST", format!("{}/v1/completions", stack.url), format!(r#"{{"model":"{MODEL}","prompt":{{}}}}"#).into_bytes(), 400),
        ("POST", chat.clone(), big.into_bytes(), 413),
        ("POST", format!("{}/v1/nope", stack.url), b"{}".to_vec(), 404),
        ("GET", chat.clone(), Vec::new(), 405),
    ];
    for (method, url, body, status) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        let resp = c
            .request(method.parse().unwrap(), &url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("{shown}: {e}"));
        assert_eq!(resp.status().as_u16(), status, "{method} {url} {shown}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/json",
            "{shown}"
        );
        let err: Value = resp.json().await.unwrap();
        let e = &err["error"];
        assert!(
            e["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{shown}: {err}"
        );
        assert!(e["type"].is_string(), "{shown}: {err}");
        assert!(
            e.get("param").is_some() && e.get("code").is_some(),
            "{shown}: {err}"
        );
    }
    let ok = c
        .post(&chat)
        .json(&chat_body("still alive?", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
}

#[tokio::test]
async fn unreachable_workers_get_503_not_a_hang() {
    let router = Proc::router(&[format!("{},role=decode", dead_address())], &[]);
    let start = Instant::now();
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat_body("hello", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "no_healthy_worker");
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(workers(&router.url).await["workers"][0]["healthy"], false);
}

#[tokio::test]
async fn a_dead_worker_is_skipped_and_marked_down_then_back_up() {
    let mut a = Proc::sim_worker(&["--instant"]);
    let b = Proc::sim_worker(&["--instant"]);
    let a_port = a.url.rsplit(':').next().unwrap().to_owned();
    let router = Proc::router(
        &[
            format!("{},role=decode,name=a", a.url),
            format!("{},role=decode,name=b", b.url),
        ],
        &[],
    );
    a.kill();
    // Until the health check notices, requests routed to `a` fail to connect and are retried on `b`.
    let c = client();
    for _ in 0..4 {
        let resp = c
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&chat_body("hi", 2))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["x-ownerserve-worker"], "b");
    }
    let url = router.url.clone();
    eventually(Duration::from_secs(10), "a marked down", || {
        let url = url.clone();
        async move { workers(&url).await["workers"][0]["healthy"] == false }
    })
    .await;
    let _a2 = Proc::sim_worker_on(&a_port, &["--instant"]);
    eventually(Duration::from_secs(10), "a healthy again", || {
        let url = url.clone();
        async move { workers(&url).await["workers"][0]["healthy"] == true }
    })
    .await;
}

#[tokio::test]
async fn a_worker_that_never_answers_times_out_with_504() {
    let silent = SilentAfterHealth::start();
    let cfg = temp_config(
        "silent.toml",
        &format!(
            "[router]\nrequest_timeout_s = 1\n\n\
             [[workers]]\nurl = \"{}\"\nrole = \"decode\"\nengine = \"vllm\"\n",
            silent.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let start = Instant::now();
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&chat_body("hello", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    let err: Value = resp.json().await.unwrap();
    assert_eq!(err["error"]["code"], "upstream_timeout");
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// A fake worker that passes health checks and lists the model, then never answers a
/// completion request.
struct SilentAfterHealth {
    url: String,
}

impl SilentAfterHealth {
    fn start() -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let mut buf = [0u8; 4096];
                let n = s.read(&mut buf).unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                let body = if head.starts_with("GET /health") {
                    String::new()
                } else if head.starts_with("GET /v1/models") {
                    format!(r#"{{"object":"list","data":[{{"id":"{MODEL}","object":"model"}}]}}"#)
                } else {
                    held.push(s);
                    continue;
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        Self { url }
    }
}

/// A long streamed chat through `router`, its first chunk read.
async fn open_long_stream(router: &str) -> reqwest::Response {
    let (resp, first) = common::first_chunk(router, chat_body("a long answer please", 2000)).await;
    assert!(first.starts_with(b"data: "));
    resp
}

/// The rest of a stream, which must end within 10 s after `what`.
async fn rest_of_stream(mut resp: reqwest::Response, what: &str) -> String {
    let mut rest = String::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(chunk)) = resp.chunk().await {
            rest.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await;
    assert!(read.is_ok(), "the stream hung after {what}");
    rest
}

#[tokio::test]
async fn a_worker_dying_mid_stream_ends_the_stream_with_an_error_event() {
    let mut w = Proc::sim_worker(&[]);
    let router = Proc::router(&[format!("{},role=decode", w.url)], &[]);
    let resp = open_long_stream(&router.url).await;
    w.kill();
    let rest = rest_of_stream(resp, "the worker died").await;
    assert!(rest.contains("upstream_unreachable"), "{rest}");
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
}

#[tokio::test]
async fn a_worker_going_silent_mid_stream_ends_the_stream_and_is_suspected() {
    let w = Proc::sim_worker(&[]);
    let cfg = temp_config(
        "silent-worker.toml",
        "[router]\nstream_idle_timeout_s = 1\nhealth_interval_ms = 60000\nhealth_failure_threshold = 1\n",
    );
    let router = Proc::router(&[format!("{},role=decode", w.url)], &["--config", &cfg]);
    let resp = open_long_stream(&router.url).await;
    // A hung host: the process stops without closing its sockets. Before, the client's
    // stream hung forever (the timeout covered response headers only).
    w.signal("-STOP");
    let stopped = Instant::now();
    let rest = rest_of_stream(resp, "the worker went silent").await;
    w.signal("-CONT");
    assert!(stopped.elapsed() < Duration::from_secs(5));
    assert!(rest.contains("upstream_timeout"), "{rest}");
    assert!(rest.ends_with("data: [DONE]\n\n"), "{rest}");
    // The silence counted as a failed health check (threshold 1: marked down).
    let workers = get_json(&format!("{}/admin/v1/workers", router.url)).await;
    assert_eq!(workers["workers"][0]["healthy"], false, "{workers}");
}

#[tokio::test]
async fn policy_is_chosen_by_flag_or_env_and_bad_names_fail_fast() {
    let stack = Proc::up(&["--instant", "true", "--policy", "least_loaded"]);
    assert_eq!(workers(&stack.url).await["policy"], "least_loaded");
    drop(stack);
    let env = Proc::spawn(
        &["up", "--port", "0", "--instant", "true"],
        &[("OWNERSERVE_POLICY", "least_loaded")],
        "ownerserve router listening on",
    );
    assert_eq!(workers(&env.url).await["policy"], "least_loaded");
    drop(env);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ownerserve"))
        .args(["up", "--port", "0", "--policy", "bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bogus") && err.contains("round_robin"),
        "{err}"
    );
}

/// The binary's allocator reports what it holds: live bytes, and resident at least as many.
#[tokio::test]
async fn the_binary_exports_its_live_and_resident_heap() {
    let stack = Proc::up(&["--instant", "true"]);
    let text = common::get_text(&format!("{}/metrics", stack.url)).await;
    let live = common::metric(&text, "ownerserve_heap_allocated_bytes");
    let resident = common::metric(&text, "ownerserve_heap_resident_bytes");
    assert!(live > 1e6, "live heap {live} B");
    assert!(
        resident >= live,
        "resident {resident} B below live {live} B"
    );
}

#[tokio::test]
async fn up_stops_cleanly_on_ctrl_c() {
    let mut stack = Proc::up(&["--instant", "true"]);
    stack.interrupt();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = stack.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "up did not exit after SIGINT");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let lines: Vec<String> = stack.stdout.try_iter().collect();
    assert!(lines.iter().any(|l| l == "ownerserve stopped"), "{lines:?}");
}

#[tokio::test]
async fn the_admin_api_needs_a_token_and_a_generated_one_is_printed() {
    let stack = Proc::up(&["--instant", "true"]);
    let url = format!("{}/admin/v1/workers", stack.url);
    let c = client();
    let anonymous = c.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let err: Value = anonymous.json().await.unwrap();
    assert_eq!(err["error"]["code"], "invalid_token");
    assert_eq!(
        c.get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        c.get(&url)
            .bearer_auth(common::READ_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        c.get(&url)
            .bearer_auth(common::ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The scheme is case-insensitive (it was a 401).
    let lower = c
        .get(&url)
        .header("authorization", format!("bearer {}", common::READ_TOKEN))
        .send()
        .await
        .unwrap();
    assert_eq!(lower.status(), 200);
    // The explain API is a dry run: the read token may call it (it was a 403); a drain
    // still needs the admin token.
    let explain = c
        .post(format!("{}/admin/v1/plan/explain", stack.url))
        .bearer_auth(common::READ_TOKEN)
        .json(&common::chat_body("hi", 2))
        .send()
        .await
        .unwrap();
    assert_eq!(explain.status(), 200);
    let drain = c
        .post(format!("{}/admin/v1/workers/decode-0/drain", stack.url))
        .bearer_auth(common::READ_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(drain.status(), 403);
    // axum's own rejections (a bad path parameter, a body that is not the JSON expected)
    // were plain text; every error is JSON now.
    for req in [
        c.get(format!("{}/admin/v1/leases/not-a-number", stack.url)),
        c.post(format!("{}/admin/v1/cluster/learners", stack.url))
            .header("content-type", "application/json")
            .body("{not json"),
    ] {
        let resp = req.bearer_auth(common::ADMIN_TOKEN).send().await.unwrap();
        assert!(resp.status().is_client_error(), "{}", resp.status());
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let err: Value = resp.json().await.unwrap();
        assert!(
            !err["error"]["message"].as_str().unwrap().is_empty(),
            "{err}"
        );
    }
    drop(stack);

    // Without any configured token, `up` generates one, prints it, and it works.
    let stack = Proc::spawn(
        &["up", "--port", "0", "--instant", "true"],
        &[
            ("OWNERSERVE_ADMIN_TOKEN", ""),
            ("OWNERSERVE_READ_TOKEN", ""),
        ],
        "ownerserve router listening on",
    );
    let token = stack
        .printed("`Authorization: Bearer ...`): ")
        .expect("token printed");
    assert_eq!(token.len(), 32);
    let url = format!("{}/admin/v1/workers", stack.url);
    assert_eq!(
        c.get(&url)
            .bearer_auth(common::ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        c.get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

/// Reads what the server sends until it closes the connection (or `within` passes).
async fn read_until_closed(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(within, stream.read_to_end(&mut got)).await;
    read.ok()
        .map(|_| String::from_utf8_lossy(&got).into_owned())
}

#[tokio::test]
async fn slow_and_idle_clients_are_cut_off_and_connections_are_capped() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let w = Proc::sim_worker(&["--instant"]);
    let cfg = temp_config(
        "limits.toml",
        "[router]\nmax_connections = 8\nreserved_probe_connections = 1\nheader_read_timeout_s = 1\nbody_read_timeout_s = 1\n",
    );
    let router = Proc::router(&[format!("{},role=decode", w.url)], &["--config", &cfg]);
    let addr = router.url.trim_start_matches("http://").to_owned();
    // Before: idle, header-dripping and body-dripping connections stayed open 90 s+.
    let started = Instant::now();
    let mut idle = TcpStream::connect(&addr).await.unwrap();
    assert!(
        read_until_closed(&mut idle, Duration::from_secs(5))
            .await
            .is_some(),
        "idle connection kept"
    );
    assert!(started.elapsed() < Duration::from_secs(4));

    let mut drip = TcpStream::connect(&addr).await.unwrap();
    drip.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let mut cut = false;
    for _ in 0..20 {
        // The drip itself (a header line every 250 ms), what the timeout must cut.
        tokio::time::sleep(Duration::from_millis(250)).await;
        if drip.write_all(b"x-drip: 1\r\n").await.is_err() {
            cut = true;
            break;
        }
    }
    let closed = cut
        || read_until_closed(&mut drip, Duration::from_secs(3))
            .await
            .is_some();
    assert!(closed, "a header-dripping client kept its connection");
    assert!(started.elapsed() < Duration::from_secs(6));

    let mut body_drip = TcpStream::connect(&addr).await.unwrap();
    body_drip
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":")
        .await
        .unwrap();
    let answer = read_until_closed(&mut body_drip, Duration::from_secs(5))
        .await
        .unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout"), "{answer}");

    // Eight connections fill the router; the ninth is the one reserved for probes (it
    // answers anything else 503), and a tenth gets a 503 at once and is closed.
    let mut held = Vec::new();
    for _ in 0..8 {
        held.push(TcpStream::connect(&addr).await.unwrap());
    }
    // Time for the router to accept the eight: nothing shows it from outside without a
    // connection of our own, and that would be the ninth.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut ninth = TcpStream::connect(&addr).await.unwrap();
    ninth
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let not_a_probe = read_until_closed(&mut ninth, Duration::from_secs(2))
        .await
        .unwrap_or_default();
    assert!(not_a_probe.starts_with("HTTP/1.1 503"), "{not_a_probe}");
    let mut probe = TcpStream::connect(&addr).await.unwrap();
    let mut tenth = TcpStream::connect(&addr).await.unwrap();
    let refused = read_until_closed(&mut tenth, Duration::from_secs(2))
        .await
        .unwrap_or_default();
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("overloaded"), "{refused}");
    probe
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let healthy = read_until_closed(&mut probe, Duration::from_secs(2))
        .await
        .unwrap_or_default();
    assert!(healthy.starts_with("HTTP/1.1 200"), "{healthy}");
    // The idle eight are cut after the header timeout; the router serves again: a request
    // that is not a probe (the reserved connection answers only probes) gets its answer.
    let models = format!("{}/v1/models", router.url);
    eventually(
        Duration::from_secs(5),
        "the idle eight cut after the header timeout",
        || async {
            let resp = client()
                .get(&models)
                .bearer_auth(common::ADMIN_TOKEN)
                .send()
                .await;
            resp.is_ok_and(|r| r.status() == 200)
        },
    )
    .await;
    let health = client()
        .get(format!("{}/health", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    drop(held);
}

#[tokio::test]
async fn metrics_and_worker_urls_need_the_read_token_unless_made_public() {
    let w = Proc::sim_worker(&["--instant"]);
    let router = Proc::router(&[format!("{},role=decode", w.url)], &[]);
    let c = reqwest::Client::new();
    for path in ["/metrics", "/metrics/targets"] {
        let url = format!("{}{path}", router.url);
        // Before: open to anyone (worker URLs included).
        assert_eq!(c.get(&url).send().await.unwrap().status(), 401, "{path}");
        let read = c
            .get(&url)
            .bearer_auth(common::READ_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(read.status(), 200, "{path}");
    }
    drop(router);
    let cfg = temp_config("metrics-public.toml", "[router]\nmetrics_public = true\n");
    let public = Proc::router(&[format!("{},role=decode", w.url)], &["--config", &cfg]);
    let open = c
        .get(format!("{}/metrics", public.url))
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_is_shed_with_429_or_503_and_retry_after_while_health_answers() {
    let w = Proc::sim_worker(&[]);
    let cfg = temp_config(
        "admission.toml",
        "[router]\nmax_inflight_per_worker = 2\nmax_queued_per_model = 2\nqueue_timeout_ms = 500\n",
    );
    let router = Proc::router(&[format!("{},role=decode", w.url)], &["--config", &cfg]);
    let mut body = chat_body("a long answer please", 2000);
    body["stream"] = json!(true);
    // Before: every client was let in and waited, with no 429 or 503 at all.
    let tasks = tokio_util::task::TaskTracker::new();
    let started = Instant::now();
    let sends: Vec<_> = (0..10)
        .map(|_| {
            let (url, body) = (router.url.clone(), body.clone());
            tasks.spawn(async move {
                client()
                    .post(format!("{url}/v1/chat/completions"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for s in sends {
        answers.push(s.await.unwrap());
    }
    // Two slots for one worker: two streams run; the rest are refused within the queue
    // timeout (six found the queue full: 429; two waited 500 ms for a slot: 503).
    let count = |status: u16| answers.iter().filter(|r| r.status() == status).count();
    assert_eq!((count(200), count(429), count(503)), (2, 6, 2));
    let shed: Vec<_> = answers.iter().filter(|r| r.status() != 200).collect();
    assert!(started.elapsed() < Duration::from_secs(5));
    for r in &shed {
        let after: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&after));
    }
    let health = client()
        .get(format!("{}/health", router.url))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let text = common::get_text(&format!("{}/metrics", router.url)).await;
    assert_eq!(
        common::metric(
            &text,
            "ownerserve_admission_shed_total{reason=\"queue_full\"}"
        ),
        6.0
    );
    assert_eq!(
        common::metric(
            &text,
            "ownerserve_admission_shed_total{reason=\"queue_timeout\"}"
        ),
        2.0
    );
    // The running streams end (the clients leave): their slots free for the next request.
    drop(answers);
    let mut short = chat_body("hi", 2);
    short["stream"] = json!(false);
    let mut next = 0;
    for _ in 0..40 {
        next = client()
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&short)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        if next == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(next, 200);
}

/// `up`'s embedded directory lives in a per-process temp folder no later process would
/// find (`ownerserve-directory-<pid>-<start ns>`): a clean shutdown removes it (hundreds
/// piled up in /tmp before).
#[tokio::test]
async fn a_clean_shutdown_removes_the_embedded_directorys_temp_folder() {
    let mut stack = Proc::up(&["--instant", "true"]);
    // The folder whose name starts with `ownerserve-directory-<its pid>-`, once it exists.
    let pid = stack.child.id();
    let find = move || {
        let prefix = format!("ownerserve-directory-{pid}-");
        std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
            })
    };
    eventually(
        Duration::from_secs(20),
        "the directory's log",
        || async move { find().is_some_and(|d| d.join("log.redb").exists()) },
    )
    .await;
    let dir = find().expect("the directory's folder");
    let term = std::process::Command::new("kill")
        .args(["-TERM", &stack.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    while stack.child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "`up` did not exit after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.exists(), "{} is still there", dir.display());
}
