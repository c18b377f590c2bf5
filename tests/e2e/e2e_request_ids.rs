//! Request ids and structured logs, end to end: a client's `X-Request-Id` reaches both
//! legs of a disaggregated step (the engines log it, the decode worker names its response
//! after it) and comes back on the response; without one the router makes one up and
//! returns it; with `--log-format json` every log line is a JSON object and the router's
//! lines carry the request's span with its id.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{chat_body, client};
use serde_json::Value;

/// `ownerserve up` (static P/D, so every step has a prefill leg) logging JSON at debug
/// level; returns the process, its URL and its stderr lines.
fn up_with_json_logs() -> (std::process::Child, String, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ownerserve"))
        .args([
            "up",
            "--port",
            "0",
            "--instant",
            "true",
            "--policy",
            "static_pd",
            "--log-format",
            "json",
        ])
        .env(
            "OWNERSERVE_LOG",
            "warn,ownerserve=debug,ownerserve_shim=debug",
        )
        .env("OWNERSERVE_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (err_tx, err_rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if err_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = out.next().expect("up printed its address").unwrap();
        if let Some(rest) = line.split("ownerserve router listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    // Keep reading stdout so `up` never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.by_ref() {});
    (child, url, err_rx)
}

/// Log lines received so far (waiting up to `within` for `enough` to hold).
fn logs_until(
    rx: &mpsc::Receiver<String>,
    within: Duration,
    enough: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while Instant::now() < deadline && !enough(&seen) {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("a log line that is not JSON ({e}): {line}"));
            seen.push(v);
        }
    }
    seen
}

fn received(logs: &[Value], id: &str, prefill: bool) -> bool {
    logs.iter().any(|l| {
        l["fields"]["message"] == "request received"
            && l["fields"]["request_id"] == id
            && l["fields"]["prefill_leg"] == prefill
    })
}

#[tokio::test]
async fn a_client_request_id_reaches_both_legs_comes_back_and_is_in_json_logs() {
    let (mut child, url, logs) = up_with_json_logs();
    let resp = client()
        .post(format!("{url}/v1/chat/completions"))
        .header("x-request-id", "trace-me-1")
        .json(&chat_body("a prompt long enough to split", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "trace-me-1");
    let decoded_on = resp.headers()["x-ownerserve-worker"].to_str().unwrap();
    assert!(
        !decoded_on.starts_with("prefill"),
        "decoded on {decoded_on}"
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(
        body["id"], "chatcmpl-trace-me-1",
        "the decode worker got the id"
    );

    // No id given: the router makes one, sends it to the workers and returns it.
    let resp = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body("another prompt", 4))
        .send()
        .await
        .unwrap();
    let made = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(made.starts_with("ownerserve-"), "{made}");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["id"], format!("chatcmpl-{made}"));
    // Errors carry it too.
    let resp = client()
        .get(format!("{url}/admin/v1/workers"))
        .header("x-request-id", "denied-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["x-request-id"], "denied-1");

    let seen = logs_until(&logs, Duration::from_secs(10), |l| {
        received(l, "trace-me-1", true)
            && received(l, "trace-me-1", false)
            && l.iter().any(|x| x["span"]["request_id"] == "trace-me-1")
    });
    assert!(
        received(&seen, "trace-me-1", true),
        "the prefill leg logged the id"
    );
    assert!(
        received(&seen, "trace-me-1", false),
        "the decode leg logged the id"
    );
    let routed = seen
        .iter()
        .find(|l| l["span"]["request_id"] == "trace-me-1")
        .expect("a router line in the request's span");
    assert_eq!(routed["span"]["name"], "request");
    assert_eq!(routed["span"]["route"], "/v1/chat/completions");
    assert!(routed["timestamp"].is_string() && routed["level"].is_string());
    let _ = child.kill();
    let _ = child.wait();
}
