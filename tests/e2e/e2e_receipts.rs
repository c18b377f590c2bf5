//! Route receipts end to end: every answer carries `x-ownerserve-receipt`, its promise is
//! checked against the `cached_tokens` the engine reports, and a promise the engine did not
//! keep (an index the engine has moved away from) is counted as a silent miss.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use common::{chat_body, client, get_text, metric, Proc};

/// The receipt's fields by name.
async fn receipt(router: &str, content: &str) -> std::collections::HashMap<String, String> {
    receipt_of_session(router, content, None).await
}

/// The receipt's fields by name, for a step of `session` if given.
async fn receipt_of_session(
    router: &str,
    content: &str,
    session: Option<&str>,
) -> std::collections::HashMap<String, String> {
    let mut req = client()
        .post(format!("{router}/v1/chat/completions"))
        .json(&chat_body(content, 2));
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let header = resp.headers()["x-ownerserve-receipt"]
        .to_str()
        .unwrap()
        .to_owned();
    resp.text().await.unwrap();
    header
        .split("; ")
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// A sim worker started with `args`, named `a`, and a `kv_aware` router before it; bound as
/// `(worker, router)`, the router is dropped first.
fn worker_a_behind_kv_aware(args: &[&str]) -> (Proc, Proc) {
    let worker = Proc::sim_worker(args);
    let router = Proc::router(
        &[format!("{},role=hybrid,name=a", worker.url)],
        &["--policy", "kv_aware"],
    );
    (worker, router)
}

/// Worker `a`'s answered steps with `outcome`, from a scrape of the router's `/metrics`.
fn receipts_of_a(metrics: &str, outcome: &str) -> f64 {
    metric(
        metrics,
        &format!(
            "ownerserve_cache_receipts_total{{model=\"{}\",outcome=\"{outcome}\",worker=\"a\"}}",
            common::MODEL
        ),
    )
}

fn doc(tag: &str, lines: usize) -> String {
    (0..lines).map(|i| format!("{tag} line {i}; ")).collect()
}

#[tokio::test]
async fn a_return_from_a_tool_carries_its_raised_rank_in_the_receipt() {
    let (_worker, router) = worker_a_behind_kv_aware(&["--instant"]);
    let first = receipt_of_session(&router.url, &doc("agent", 20), Some("agent-1")).await;
    assert_eq!(first["priority"], "0", "a first step ranks as its class");
    // Its answer has ended: the session waits on a tool once the router counts it idle.
    let tracked = format!("{}/admin/v1/lifecycle", router.url);
    common::eventually(
        std::time::Duration::from_secs(5),
        "agent-1 idle",
        || async {
            let v = common::get_json(&tracked).await;
            v["sessions"].as_array().is_some_and(|rows| {
                rows.iter()
                    .any(|r| r["session"] == "agent-1" && r["idle_ms"].is_u64())
            })
        },
    )
    .await;
    let back = format!("{} tool result: 3 tests passed", doc("agent", 20));
    let back = receipt_of_session(&router.url, &back, Some("agent-1")).await;
    assert_eq!(back["priority"], "-1", "a return goes ahead of new prompts");
}

#[tokio::test]
async fn receipts_promise_what_the_index_holds_and_count_the_misses() {
    // No KV events: the router's index is what it routed (approximate), and a pool of 64
    // blocks of 16 tokens forgets a prompt once others have filled it.
    let (_worker, router) = worker_a_behind_kv_aware(&["--instant", "--max-kv-blocks", "64"]);
    let prefix = doc("repo", 40);
    let first = receipt(&router.url, &format!("{prefix} q1")).await;
    assert_eq!(first["worker"], "a");
    assert_eq!(first["index"], "approximate");
    assert_eq!(first["predicted_cached"], "0");
    assert_eq!(first["epoch"], "-");
    assert_eq!(first["priority"], "0", "an interactive step, not returning");

    let again = receipt(&router.url, &format!("{prefix} q2")).await;
    assert!(
        again["predicted_cached"].parse::<u64>().unwrap() > 0,
        "{again:?}"
    );

    // Other prompts push the prefix out of the engine; the index still promises it.
    for k in 0..8 {
        receipt(&router.url, &doc(&format!("other{k}"), 40)).await;
    }
    let back = receipt(&router.url, &format!("{prefix} q3")).await;
    assert!(
        back["predicted_cached"].parse::<u64>().unwrap() > 0,
        "{back:?}"
    );

    let workers = common::get_json(&format!("{}/admin/v1/workers", router.url)).await;
    assert_eq!(workers["workers"][0]["index"], "approximate");

    let text = get_text(&format!("{}/metrics", router.url)).await;
    let count = |outcome: &str| receipts_of_a(&text, outcome);
    assert!(count("kept") >= 1.0, "{text}");
    assert!(
        count("missed") >= 1.0,
        "the evicted prefix is a silent miss"
    );
    let promised = metric(
        &text,
        &format!(
            "ownerserve_cache_promised_tokens_total{{model=\"{}\",worker=\"a\"}}",
            common::MODEL
        ),
    );
    let reported = metric(
        &text,
        &format!(
            "ownerserve_cache_reported_tokens_total{{model=\"{}\",worker=\"a\"}}",
            common::MODEL
        ),
    );
    assert!(
        reported < promised,
        "{reported} reported of {promised} promised"
    );
}

#[tokio::test]
async fn a_worker_whose_events_flow_is_exact_and_one_without_any_yet_is_degraded() {
    let stack = Proc::up(&["--instant", "true"]);
    let served = receipt(&stack.url, &doc("repo", 40)).await["worker"].clone();
    let url = stack.url.clone();
    common::eventually(
        std::time::Duration::from_secs(10),
        "the served worker's index exact, the others degraded",
        || {
            let (url, served) = (url.clone(), served.clone());
            async move {
                let w = common::get_json(&format!("{url}/admin/v1/workers")).await;
                w["workers"].as_array().unwrap().iter().all(|w| {
                    let want = if w["id"] == served.as_str() {
                        "exact"
                    } else {
                        "degraded"
                    };
                    w["index"] == want
                })
            }
        },
    )
    .await;
    let again = receipt(&stack.url, &doc("repo", 40)).await;
    assert_eq!(again["index"], "exact", "{again:?}");
    let text = get_text(&format!("{}/metrics", stack.url)).await;
    let mode = |m: &str| {
        metric(
            &text,
            &format!("ownerserve_kv_index_mode{{mode=\"{m}\",worker=\"{served}\"}}"),
        )
    };
    assert_eq!((mode("exact"), mode("degraded")), (1.0, 0.0), "{text}");
}

#[tokio::test]
async fn a_client_that_asks_gets_the_checked_receipt_in_its_usage() {
    let (_worker, router) = worker_a_behind_kv_aware(&["--instant"]);
    let prefix = doc("shared", 40);
    let ask = |content: String, stream: bool, asks: bool| {
        let mut body = chat_body(&content, 2);
        if stream {
            body["stream"] = serde_json::json!(true);
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        let mut req = client()
            .post(format!("{}/v1/chat/completions", router.url))
            .json(&body);
        if asks {
            req = req.header("x-ownerserve-receipt", "usage");
        }
        async move { req.send().await.unwrap().text().await.unwrap() }
    };
    // Not asked: the body is the engine's.
    let plain: serde_json::Value =
        serde_json::from_str(&ask(format!("{prefix} q1"), false, false).await).unwrap();
    assert!(plain["usage"].get("ownerserve_receipt").is_none());
    // Asked, whole: the second step finds the prefix the first left, and says so.
    let whole: serde_json::Value =
        serde_json::from_str(&ask(format!("{prefix} q2"), false, true).await).unwrap();
    let r = &whole["usage"]["ownerserve_receipt"];
    assert_eq!(r["worker"], "a");
    assert_eq!(r["index"], "approximate");
    assert!(
        r["predicted_cached_tokens"].as_u64().unwrap() > 0,
        "{whole}"
    );
    assert_eq!(
        r["cached_tokens"],
        whole["usage"]["prompt_tokens_details"]["cached_tokens"]
    );
    assert_eq!(r["outcome"], "kept", "{whole}");
    // Asked, streamed: in the usage event.
    let stream = ask(format!("{prefix} q3"), true, true).await;
    let usage_event = stream
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<serde_json::Value>(d).unwrap())
        .find(|e| e["usage"].is_object())
        .unwrap();
    assert_eq!(
        usage_event["usage"]["ownerserve_receipt"]["outcome"], "kept",
        "{usage_event}"
    );
}

/// A Responses follow-up runs on the engine after its stored conversation, a prompt the
/// router never saw: the cache the engine reports for it is not held to the router's
/// promise (it was counted a surplus, and marked every such worker's index degraded).
#[tokio::test]
async fn a_responses_follow_up_is_not_held_to_a_promise_on_a_prompt_the_router_never_saw() {
    let (_worker, router) = worker_a_behind_kv_aware(&["--instant"]);
    let mut previous: Option<String> = None;
    let mut cached = Vec::new();
    for turn in 0..3 {
        let mut body = serde_json::json!({
            "model": common::MODEL,
            "input": doc(&format!("turn{turn}"), 40),
            "max_output_tokens": 4,
        });
        if let Some(p) = &previous {
            body["previous_response_id"] = serde_json::json!(p);
        }
        let resp = client()
            .post(format!("{}/v1/responses", router.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let answer: serde_json::Value = resp.json().await.unwrap();
        previous = Some(answer["id"].as_str().unwrap().to_owned());
        cached.push(
            answer["usage"]["input_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert!(
        cached[1] > 0 && cached[2] > cached[1],
        "the engine ran each stored conversation from its cache: {cached:?}"
    );
    let text = get_text(&format!("{}/metrics", router.url)).await;
    let count = |outcome: &str| receipts_of_a(&text, outcome);
    assert_eq!(
        (count("kept"), count("unchecked"), count("surplus")),
        (1.0, 2.0, 0.0),
        "the first turn is checked, its follow-ups are not: {text}"
    );
}
