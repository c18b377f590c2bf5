//! `planner_prefill_workers_decode` end to end: two real `ownerserve sim-worker` processes,
//! `w0` in the prefill role and `w1` in the decode role, with `w1` loaded by streams sent
//! straight to it, and two real routers with the `ownerserve` policy that see the load only
//! through their metrics scrapes. The router with the setting off never plans a decode on
//! `w0`; the router with it on moves a new session off the busy decoder onto the idle
//! prefill worker, and a real request through it is served there whole.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

mod common;

use std::time::Duration;

use common::{
    chat_body, eventually, explain_new_session, hold_stream, planner_router, stream_step, words,
    Proc,
};
use serde_json::Value;

fn router(name: &str, workers: &[Proc], prefill_decodes: bool) -> Proc {
    let extra = format!("planner_prefill_workers_decode = {prefill_decodes}\n");
    planner_router(name, workers, &["prefill", "decode"], &extra)
}

/// The plan `router` would make for a brand-new session's first step.
async fn explain(router: &Proc) -> Value {
    explain_new_session(router, &chat_body(&words("task", 2_000), 16)).await
}

/// The workers `plan` priced a decode on.
fn decoders(plan: &Value) -> Vec<u64> {
    let mut ids: Vec<u64> = plan["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["decode_on"].as_u64())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_decodes_on_the_idle_prefill_worker_only_when_allowed() {
    // 200 ms per engine step: the loads below decode for over a minute.
    let flags = ["--step-overhead-s", "0.2", "--max-kv-blocks", "4000"];
    let workers = vec![Proc::sim_worker(&flags), Proc::sim_worker(&flags)];
    let allowed = router("prefill-decodes.toml", &workers, true);
    let split = router("roles-kept.toml", &workers, false);

    let mut loads = tokio::task::JoinSet::new();
    for i in 0..3 {
        hold_stream(&mut loads, &workers[1], words(&format!("busy{i}-"), 1_500));
    }

    // Once its scrapes show w1's decodes, the router allowed to decode on the prefill
    // worker puts the new session there: no decode is stalled and no KV is shipped.
    eventually(
        Duration::from_secs(30),
        "the router allowed to decode on w0 chooses it",
        || async {
            let plan = explain(&allowed).await;
            plan["chosen"]["decode_on"] == 0 && plan["chosen"]["action"] == "colocate"
        },
    )
    .await;

    // The router keeping the roles sees the same load and still decodes on w1 only.
    let plan = explain(&split).await;
    assert_eq!(decoders(&plan), [1], "{plan:#}");
    assert_eq!(plan["chosen"]["decode_on"], 1, "{plan:#}");

    // A real request of a new session through the allowed router is served whole by w0.
    let body = chat_body(&words("task", 2_000), 4);
    let served = stream_step(&allowed, "served-on-the-prefill-worker", &body).await;
    assert_eq!(served, "w0");
    loads.abort_all();
}
