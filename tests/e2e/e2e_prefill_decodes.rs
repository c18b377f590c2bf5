//! `planner_prefill_workers_decode` end to end: real `ownerserve sim-worker` processes,
//! `w0` in the prefill role and `w1` in the decode role, with `w1` loaded by streams sent
//! straight to it, and real routers with the `ownerserve` policy that see the load only
//! through their metrics scrapes. With the default (`auto`), the router moves a new session
//! off the busy decoder onto the idle prefill worker, whose KV pool is the decoder's size,
//! and a real request through it is served there whole. With `never`, or in front of a
//! prefill worker whose pool is a quarter of the decoder's, it never plans a decode on
//! the prefill worker.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{
    chat_body, eventually, explain_new_session, get_json, hold_stream, planner_router_at,
    stream_step, words, Proc,
};
use serde_json::Value;

/// A router over `[prefill, decode]`, with `setting` as its TOML line (empty: the default).
fn router(name: &str, workers: [&Proc; 2], setting: &str) -> Proc {
    let urls = workers.map(|w| w.url.as_str());
    planner_router_at(name, &urls, &["prefill", "decode"], setting)
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
    let workers = [Proc::sim_worker(&flags), Proc::sim_worker(&flags)];
    let sliver = Proc::sim_worker(&["--step-overhead-s", "0.2", "--max-kv-blocks", "1000"]);
    let allowed = router("prefill-decodes.toml", [&workers[0], &workers[1]], "");
    let split = router(
        "roles-kept.toml",
        [&workers[0], &workers[1]],
        "planner_prefill_workers_decode = \"never\"\n",
    );
    let small = router("prefill-sliver.toml", [&sliver, &workers[1]], "");

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

    // The router keeping the roles sees the same load and still decodes on w1 only; so
    // does the default router in front of a prefill worker sized for prefill only, once
    // its scrapes have read both pools.
    let plan = explain(&split).await;
    assert_eq!(decoders(&plan), [1], "{plan:#}");
    assert_eq!(plan["chosen"]["decode_on"], 1, "{plan:#}");
    eventually(
        Duration::from_secs(30),
        "the router in front of the sliver has read both pools",
        || async {
            let workers = get_json(&format!("{}/admin/v1/workers", small.url)).await;
            let pools: Vec<Value> = (workers["workers"].as_array().unwrap().iter())
                .map(|w| w["kv_capacity_tokens"].clone())
                .collect();
            pools == [1_000 * 16, 4_000 * 16]
        },
    )
    .await;
    let plan = explain(&small).await;
    assert_eq!(decoders(&plan), [1], "{plan:#}");

    // A real request of a new session through the allowed router is served whole by w0.
    let body = chat_body(&words("task", 2_000), 4);
    let served = stream_step(&allowed, "served-on-the-prefill-worker", &body).await;
    assert_eq!(served, "w0");
    loads.abort_all();
}
