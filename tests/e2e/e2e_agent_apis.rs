//! The coding agents' APIs through `ownerserve up`: the official `openai` (Responses) and
//! `anthropic` (Messages) Python SDKs, the requests Claude Code 2.1.328, Codex CLI 0.169.0
//! and OpenCode 1.18.33 really sent (recorded in `tests/fixtures/agents/`), and stored
//! responses owned by the worker that produced them. Needs `python3` with `openai` and
//! `anthropic` (`scripts/test` installs them).

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::collections::{HashMap, HashSet};

use common::{client, get_json, Proc, ADMIN_TOKEN, MODEL};
use serde_json::{json, Value};

#[test]
fn the_openai_and_anthropic_sdks_work_against_ownerserve_up() {
    let stack = Proc::up(&["--time-scale", "20"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/agent_sdk_check.py");
    let out = std::process::Command::new("python3")
        .args([script, &stack.url, MODEL])
        .output()
        .expect("python3 must be installed");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agent SDK check failed (are `openai` and `anthropic` installed?)\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all agent SDK checks passed"), "{stdout}");
}

/// One recorded request.
struct Capture {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

fn captures(file: &str) -> Vec<Capture> {
    let path = format!(
        "{}/../tests/fixtures/agents/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let all: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    all.into_iter()
        .map(|c| {
            let mut body = c["body"].clone();
            if let Some(s) = body.as_str() {
                body = serde_json::from_str(s).unwrap();
            }
            // Served by `up`'s model; everything else as the harness sent it.
            body["model"] = json!(MODEL);
            let skip = ["host", "content-length", "connection", "accept-encoding"];
            let headers = c["headers"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, _)| !skip.contains(&k.to_lowercase().as_str()))
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            Capture {
                path: c["path"].as_str().unwrap().to_owned(),
                headers,
                body,
            }
        })
        .collect()
}

/// Sends a capture to the router; returns the serving worker and the whole answer.
async fn replay(url: &str, c: &Capture) -> (String, String) {
    let mut req = client().post(format!("{url}{}", c.path)).json(&c.body);
    for (k, v) in &c.headers {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let worker = resp
        .headers()
        .get("x-ownerserve-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    assert!(status.is_success(), "{} → {status}: {text}", c.path);
    (worker, text)
}

/// The session's owner in the directory, once recorded (ownership records are flushed in
/// the background).
async fn owner_of(url: &str, session: &str) -> Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let r = client()
            .get(format!("{url}/admin/v1/sessions/{session}"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        if r.status().is_success() {
            let v: Value = r.json().await.unwrap();
            if !v["owner"].is_null() {
                return v["owner"].clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "session {session} never got an owner in the directory"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_harness_requests_parse_route_and_keep_their_owner() {
    let stack = Proc::up(&["--instant", "true"]);
    let url = &stack.url;

    // Claude Code: Anthropic Messages, streamed, `?beta=true`, ~88 KB with tools,
    // `thinking` and `context_management` passed through untouched.
    let claude = captures("claude-code-2.1.328-messages.json");
    let (_, text) = replay(url, &claude[0]).await;
    let kinds: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(kinds.first(), Some(&"message_start"), "{text}");
    assert_eq!(kinds.last(), Some(&"message_stop"), "{text}");
    let cc = "bb71fe19-4058-4aa7-a63d-95d5994d5d04";
    let cc_owner = owner_of(url, cc).await;

    // Codex: two turns of one thread (the whole history resent, `store: false`): the
    // session is its thread id, and both turns run on its owner.
    let codex = captures("codex-0.169.0-responses-two-turns.json");
    let mut served = HashSet::new();
    for c in &codex {
        let (worker, text) = replay(url, c).await;
        assert!(
            text.contains("event: response.completed")
                || text.contains("event: response.incomplete"),
            "{text}"
        );
        served.insert(worker);
    }
    assert_eq!(
        served.len(),
        1,
        "both Codex turns on one worker: {served:?}"
    );
    let thread = "01a202fb-a207-7980-95dd-2ea181fa2e62";
    let codex_owner = owner_of(url, thread).await;

    // OpenCode: its title request (same session id, no tools) is a side request; its
    // turn owns the session; another title request after it leaves the owner alone.
    let opencode = captures("opencode-1.18.33-chat-title-and-turn.json");
    let (title, turn) = (&opencode[0], &opencode[1]);
    let (_, text) = replay(url, title).await;
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    replay(url, turn).await;
    let ses = "ses_dfd0439a4ffe5a1dJp2tfNLoqM";
    let before = owner_of(url, ses).await;
    for _ in 0..3 {
        replay(url, title).await;
    }
    // Past a few ownership flushes (below): a side request that took the session would show.
    // A Codex compaction (its turn metadata says `request_kind: compact`): a side request.
    let mut compact = Capture {
        path: codex[1].path.clone(),
        headers: codex[1].headers.clone(),
        body: codex[1].body.clone(),
    };
    for (k, v) in &mut compact.headers {
        if k.eq_ignore_ascii_case("x-codex-turn-metadata") {
            let mut m: Value = serde_json::from_str(v).unwrap();
            m["request_kind"] = json!("compact");
            *v = m.to_string();
        }
    }
    compact.body["input"] = json!("Summarize the conversation so far.");
    for _ in 0..3 {
        replay(url, &compact).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        owner_of(url, ses).await,
        before,
        "title requests moved the owner"
    );
    assert_eq!(
        owner_of(url, thread).await,
        codex_owner,
        "a compaction moved the owner"
    );
    assert_eq!(owner_of(url, cc).await, cc_owner);

    // Each conversation is one session: none of the side requests made its own.
    let sessions = get_json_auth(&format!("{url}/admin/v1/sessions")).await;
    let ids: Vec<&str> = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    for id in [cc, thread, ses] {
        assert_eq!(ids.iter().filter(|i| **i == id).count(), 1, "{ids:?}");
    }
    assert_eq!(ids.len(), 3, "{ids:?}");
    for root in [cc, thread, ses] {
        let row = get_json_auth(&format!("{url}/admin/v1/sessions/{root}")).await;
        assert_eq!(
            (row["root"].as_str(), &row["agent_parent"]),
            (Some(root), &Value::Null),
            "{row}"
        );
    }

    // Sub-agents: a Claude Code agent and a Codex thread, each its own session, shown
    // under their conversation's root with their parent.
    let mut sub = Capture {
        path: claude[0].path.clone(),
        headers: claude[0].headers.clone(),
        body: claude[0].body.clone(),
    };
    sub.headers
        .push(("x-claude-code-agent-id".into(), "cc-sub-1".into()));
    replay(url, &sub).await;
    let mut kid = Capture {
        path: codex[0].path.clone(),
        headers: codex[0]
            .headers
            .iter()
            .filter(|(k, _)| !k.eq_ignore_ascii_case("thread-id"))
            .cloned()
            .collect(),
        body: codex[0].body.clone(),
    };
    kid.headers.push(("thread-id".into(), "codex-kid-1".into()));
    kid.headers
        .push(("x-codex-parent-thread-id".into(), thread.into()));
    replay(url, &kid).await;
    for (agent, root) in [("cc-sub-1", cc), ("codex-kid-1", thread)] {
        owner_of(url, agent).await;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let row = get_json_auth(&format!("{url}/admin/v1/sessions/{agent}")).await;
            if row["root"] == json!(root) && row["agent_parent"] == json!(root) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{agent}: {row}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    assert_eq!(
        owner_of(url, cc).await,
        cc_owner,
        "a sub-agent moved its root"
    );

    // Counted in the router's metrics by route.
    let metrics = common::get_text(&format!("{url}/metrics")).await;
    for route in ["/v1/messages", "/v1/responses", "/v1/chat/completions"] {
        assert!(
            metrics.contains(&format!("route=\"{route}\"")),
            "{route} not counted"
        );
    }
}

async fn get_json_auth(url: &str) -> Value {
    client()
        .get(url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A stored Responses turn; returns its id and worker.
async fn turn(url: &str, prev: Option<&str>, i: usize) -> (String, String) {
    let mut body = json!({"model": MODEL, "input": format!("step {i}"), "max_output_tokens": 2, "store": true});
    if let Some(p) = prev {
        body["previous_response_id"] = json!(p);
    }
    let r = client()
        .post(format!("{url}/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let worker = r
        .headers()
        .get("x-ownerserve-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let v: Value = r.json().await.unwrap();
    assert!(status.is_success(), "{v}");
    (v["id"].as_str().unwrap().to_owned(), worker)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_follow_up_lands_on_the_owner_even_when_it_is_drained() {
    // Round robin spreads the chains' first turns over the whole fleet.
    let stack = Proc::up(&["--instant", "true", "--policy", "round_robin"]);
    let url = &stack.url;
    const CHAINS: usize = 100;
    let mut chains: Vec<(String, String)> = Vec::new();
    for i in 0..CHAINS {
        chains.push(turn(url, None, i).await);
    }
    let mut spread: HashMap<String, usize> = HashMap::new();
    for (_, w) in &chains {
        *spread.entry(w.clone()).or_default() += 1;
    }
    assert!(spread.len() >= 2, "chains spread over workers: {spread:?}");
    // Drain the busiest worker after turn 2: its chains' follow-ups still go to it.
    let drained = spread.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    for t in 1..5 {
        if t == 2 {
            let r = client()
                .post(format!("{url}/admin/v1/workers/{drained}/drain"))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
        }
        for (i, (id, owner)) in chains.iter_mut().enumerate() {
            let (next, worker) = turn(url, Some(id), i).await;
            assert_eq!(&worker, owner, "chain {i} turn {t} left its owner");
            *id = next;
        }
    }
    // GET goes to the owner too.
    let (id, _) = &chains[0];
    let got = get_json(&format!("{url}/v1/responses/{id}")).await;
    assert_eq!(got["id"], json!(id));
    let workers = get_json_auth(&format!("{url}/admin/v1/workers")).await;
    assert!(workers["workers"].as_array().unwrap().len() >= 2);
}

#[tokio::test]
async fn a_killed_owner_gives_an_error_naming_its_response() {
    let mut a = Proc::sim_worker(&["--instant"]);
    let b = Proc::sim_worker(&["--instant"]);
    let cfg = common::temp_config(
        "response-owners.toml",
        &format!(
            "[router]\nhealth_interval_ms = 100\nhealth_failure_threshold = 1\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"hybrid\"\n\n\
             [[workers]]\nname = \"b\"\nurl = \"{}\"\nrole = \"hybrid\"\n",
            a.url, b.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let url = &router.url;
    // Round robin: one response on each worker.
    let first = turn(url, None, 0).await;
    let second = turn(url, None, 1).await;
    let (on_a, on_b) = if first.1 == "a" {
        (first, second)
    } else {
        (second, first)
    };
    assert_eq!((on_a.1.as_str(), on_b.1.as_str()), ("a", "b"));
    a.kill();
    // A follow-up of a's response: never answered by b, but refused naming the response.
    // Without a directory the router cannot tell a dead worker from one that will come
    // back: 503, retryable (with a directory it becomes 410 once the worker's lease ends:
    // tests/e2e_response_owners.rs).
    let r = client()
        .post(format!("{url}/v1/responses"))
        .json(&json!({"model": MODEL, "input": "more", "previous_response_id": on_a.0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "response_owner_unavailable", "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&on_a.0),
        "{v}"
    );
    let r = client()
        .get(format!("{url}/v1/responses/{}", on_a.0))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    // b's chain goes on.
    let (_, worker) = turn(url, Some(&on_b.0), 2).await;
    assert_eq!(worker, "b");
}

#[tokio::test]
async fn messages_take_an_x_api_key_and_answer_errors_in_anthropics_shape() {
    let worker = Proc::sim_worker(&["--instant"]);
    let router = Proc::router(
        &[format!("{},role=hybrid", worker.url)],
        &["--api-keys", "agent-key-123"],
    );
    let url = format!("{}/v1/messages?beta=true", router.url);
    let body =
        json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]});
    let refused = client().post(&url).json(&body).send().await.unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let v: Value = refused.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    let ok = client()
        .post(&url)
        .header("x-api-key", "agent-key-123")
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(ok.status().is_success());
    let v: Value = ok.json().await.unwrap();
    assert_eq!(v["type"], "message", "{v}");
    assert_eq!(v["usage"]["output_tokens"], 4, "{v}");
    // A body the router refuses: Anthropic's shape, the offending field in the message.
    let bad = client()
        .post(&url)
        .header("x-api-key", "agent-key-123")
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status().as_u16(), 400);
    let v: Value = bad.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_tokens"),
        "{v}"
    );
}
