//! The returns of parked sessions end to end: two idle real `ownerserve sim-worker`
//! processes behind a real router with the `ownerserve` policy. A new session's first step
//! ties between them and goes to the first, `w0`. Once an agent session has run two steps
//! on `w0` with a tool gap between them and is parked there (idle within its lease), the
//! router's session tracker expects it back at 1 / that gap, and the planner sends the
//! next new session to `w1`: a long prefill on `w0` would hold up the agent's return. The
//! agent's own next step is not charged for it.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{
    chat_body, colocate_cost, explain_new_session, explain_session, planner_router, stream_step,
    words, Proc,
};
use serde_json::Value;

/// The queue-delay term of the colocation on worker `id` in `plan`.
fn queue_delay_s(plan: &Value, id: u64) -> f64 {
    colocate_cost(plan, id, "queue_delay_s")
}

/// The plan for `session`'s step `body` once the router's scrapes show both workers idle
/// (no queue, no decode a prefill would stall): the streams just answered may still show
/// in the last scrape, and a queued request there is charged in the same term.
async fn plan_when_idle(router: &Proc, session: &str, body: &Value) -> Value {
    let idle = |plan: &Value| {
        plan["candidates"].as_array().unwrap().iter().all(|c| {
            c["cost"]["queue_s"].as_f64() == Some(0.0)
                && c["cost"]["interference_s"].as_f64() == Some(0.0)
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let plan = explain_session(router, session, body).await;
        if idle(&plan) || std::time::Instant::now() > deadline {
            return plan;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_goes_where_no_parked_session_will_wait_behind_its_prefill() {
    let workers = vec![Proc::sim_worker(&[]), Proc::sim_worker(&[])];
    let router = planner_router("parked.toml", &workers, &["hybrid", "hybrid"], "");
    let new_task = chat_body(&words("a new task over a large repository", 3_000), 8);

    // Both idle: the tie goes to the first worker.
    let plan = explain_new_session(&router, &new_task).await;
    assert_eq!(plan["chosen"]["decode_on"], 0, "{plan}");
    assert_eq!(queue_delay_s(&plan, 0), 0.0, "{plan}");

    // An agent runs two steps on w0 with a 300 ms tool gap between them.
    let first = chat_body(&words("agent", 200), 4);
    assert_eq!(stream_step(&router, "agent", &first).await, "w0");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = chat_body(&format!("{} then run the tests", words("agent", 200)), 4);
    assert_eq!(stream_step(&router, "agent", &second).await, "w0");

    // Parked there (its lease is at least 5 s), it is expected back at ~1 / 0.3 s: with
    // nothing queued or running anywhere, a new session's prefill on w0 is still priced
    // for the wait it would add, and w1 wins. The term is compute × (prefills queued +
    // returns expected during the compute): a fraction of a prefill shows the returns.
    let plan = plan_when_idle(&router, "brand-new", &new_task).await;
    assert_eq!(colocate_cost(&plan, 0, "queue_s"), 0.0, "{plan}");
    assert_eq!(colocate_cost(&plan, 0, "interference_s"), 0.0, "{plan}");
    let arrivals = queue_delay_s(&plan, 0) / colocate_cost(&plan, 0, "compute_s");
    assert!(arrivals.fract() > 1e-6, "{arrivals} in {plan}");
    assert_eq!(queue_delay_s(&plan, 1), 0.0, "{plan}");
    assert_eq!(plan["chosen"]["decode_on"], 1, "{plan}");

    // The agent's own next step is one of those returns: every candidate's queue delay is
    // a whole number of queued prefills, with no returns in it.
    let third = chat_body(
        &format!("{} then run the tests and fix it", words("agent", 200)),
        4,
    );
    let plan = plan_when_idle(&router, "agent", &third).await;
    assert_eq!(plan["inputs"]["decode_owner"], 0, "{plan}");
    for c in plan["candidates"].as_array().unwrap() {
        let queued =
            c["cost"]["queue_delay_s"].as_f64().unwrap() / c["cost"]["compute_s"].as_f64().unwrap();
        assert!((queued - queued.round()).abs() < 1e-6, "{queued} in {plan}");
    }
}
