//! Session admission end to end (`[router.sessions] admission`): a real `ownerserve
//! sim-worker` whose KV holds 1,600 tokens (100 blocks), behind a real router that reads
//! that capacity from the worker's metrics. Session A's first step (~1,000 tokens) is
//! admitted and tracked. Session B's first step (~800 tokens) would not fit beside A's
//! context: it is held, its request slot given back, while A's own next step goes at once;
//! `/admin/v1/lifecycle` shows what admission counts. When A's client closes A, B goes,
//! and A is ended in the directory (not merely demoted). With `admission_headroom = 0.5`, a
//! B that fits beside A in the whole KV waits too.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::{Duration, Instant};

use common::{
    chat_body, client, eventually, get_json, get_text, metric, planner_router, words, Proc,
    READ_TOKEN,
};
use serde_json::{json, Value};

const ADMISSION: &str = "[router.sessions]\nadmission = true\nadmission_max_wait_ms = 30000\n";

async fn step(router: &Proc, session: &str, body: &Value, control: Option<&str>) -> Value {
    let mut req = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("x-session-id", session)
        .json(body);
    if let Some(c) = control {
        req = req.header("x-ownerserve-session-control", c);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

async fn admissions(router: &Proc, outcome: &str) -> f64 {
    let text = get_text(&format!("{}/metrics", router.url)).await;
    let prefix = format!("ownerserve_session_admission_total{{outcome=\"{outcome}\"}}");
    if text.contains(&prefix) {
        metric(&text, &prefix)
    } else {
        0.0
    }
}

/// A planner router with `config` before one sim worker holding 1,600 tokens of KV, once
/// the router has read that capacity from the worker's metrics.
async fn router_before_1600_tokens(name: &str, config: &str) -> (Vec<Proc>, Proc) {
    let workers = vec![Proc::sim_worker(&["--max-kv-blocks", "100"])];
    let router = planner_router(name, &workers, &["hybrid"], config);
    eventually(
        Duration::from_secs(10),
        "the worker's KV capacity",
        || async {
            let w = get_json(&format!("{}/admin/v1/workers", router.url)).await;
            w["workers"][0]["kv_capacity_tokens"].as_u64() == Some(1600)
        },
    )
    .await;
    (workers, router)
}

/// Sends `body` as session `session`'s step in the background: its answer and when it came.
fn in_background(
    router: &Proc,
    session: &'static str,
    body: Value,
) -> tokio::task::JoinSet<(Value, Instant)> {
    let mut set = tokio::task::JoinSet::new();
    let url = router.url.clone();
    set.spawn(async move {
        let resp = client()
            .post(format!("{url}/v1/chat/completions"))
            .header("x-session-id", session)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let at = Instant::now();
        (resp.json::<Value>().await.unwrap(), at)
    });
    set
}

/// `first` continued by an assistant turn saying what `answer` said and a tool result.
fn next_turn(first: &Value, answer: &Value) -> Value {
    let said = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    let mut next = first.clone();
    next["messages"] = json!([
        first["messages"][0],
        {"role": "assistant", "content": said},
        {"role": "user", "content": "tool result: 3 tests passed"},
    ]);
    next
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_waits_for_room_and_goes_when_a_live_one_closes() {
    let (_workers, router) = router_before_1600_tokens("admission.toml", ADMISSION).await;

    let a_first = chat_body(&words("alpha", 330), 4);
    let a = step(&router, "a", &a_first, None).await;
    let a_tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!((900..1_300).contains(&a_tokens), "{a}");
    assert_eq!(admissions(&router, "admitted").await, 1.0);

    // B does not fit beside A: held.
    let mut held = in_background(&router, "b", chat_body(&words("bravo", 270), 4));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        held.try_join_next().is_none(),
        "B went though A's context fills the KV"
    );
    // What the operator sees: A tracked and counted live, B admitted by none.
    let view = get_json(&format!("{}/admin/v1/lifecycle", router.url)).await;
    assert_eq!(
        (view["admission"].clone(), view["count"].clone()),
        (json!(true), json!(1))
    );
    let live = view["live_tokens"][common::MODEL].as_u64().unwrap();
    assert_eq!(view["sessions"][0]["session"], "a", "{view}");
    assert_eq!(view["sessions"][0]["tokens"].as_u64(), Some(live), "{view}");
    assert!((900..1_300).contains(&live), "{view}");
    assert_eq!(view["admitted_tokens"], json!({}), "{view}");

    // A's own next step (an assistant turn in it) goes at once; then A's client closes A.
    let a_next = next_turn(&a_first, &a);
    let closing = Instant::now();
    step(&router, "a", &a_next, Some("close")).await;

    let (_, went) = tokio::time::timeout(Duration::from_secs(10), held.join_next())
        .await
        .expect("B goes once A closed")
        .expect("B's task")
        .unwrap();
    assert!(went >= closing, "B went before A closed");
    assert_eq!(admissions(&router, "held").await, 1.0);
    assert_eq!(admissions(&router, "timed_out").await, 0.0);
    // A is over: the directory no longer holds it.
    let url = format!("{}/admin/v1/sessions/a", router.url);
    eventually(Duration::from_secs(10), "A ended in the directory", || {
        let url = url.clone();
        async move {
            let r = client().get(&url).bearer_auth(READ_TOKEN).send().await;
            r.unwrap().status() == 404
        }
    })
    .await;
}

/// With `admission_headroom = 0.5`, half the fleet's KV is kept for the live sessions'
/// growth: session B's first step, which fits beside A's context in the whole KV, waits
/// until A's client closes A.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_holds_a_session_that_fits_beside_the_live_ones() {
    let config = format!("{ADMISSION}admission_headroom = 0.5\n");
    let (_workers, router) = router_before_1600_tokens("headroom.toml", &config).await;
    let a_first = chat_body(&words("alpha", 200), 4);
    let a = step(&router, "a", &a_first, None).await;
    let a_tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();

    let mut held = in_background(&router, "b", chat_body(&words("bravo", 120), 4));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        held.try_join_next().is_none(),
        "B went though the headroom is taken"
    );
    let closing = Instant::now();
    step(&router, "a", &next_turn(&a_first, &a), Some("close")).await;
    let (b, went) = tokio::time::timeout(Duration::from_secs(10), held.join_next())
        .await
        .expect("B goes once A closed")
        .expect("B's task")
        .unwrap();
    assert!(went >= closing, "B went before A closed");
    let b_tokens = b["usage"]["prompt_tokens"].as_u64().unwrap();
    // Without the headroom B would have gone at once; with it, A and B exceed the half.
    assert!(a_tokens + b_tokens <= 1600, "{a_tokens} + {b_tokens}");
    assert!(a_tokens + b_tokens > 800, "{a_tokens} + {b_tokens}");
    assert_eq!(admissions(&router, "held").await, 1.0);
}
