//! The planner's prefill calibration end to end: two real `ownerserve sim-worker`
//! processes, `w0` in the prefill role and `w1` in the decode role (loaded by streams sent
//! straight to it, so a new session's prompt is prefilled remotely), and a real router
//! with the `ownerserve` policy. The sim workers add 0.5 s to every engine step, so a
//! prefill takes its preset time plus at least that. One remote prefill through the
//! router, sent to an idle `w0`, must teach the planner so: its explain output then prices
//! `w0`'s compute at the observed rate, against the preset's time it also lists.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{
    chat_body, eventually, explain_new_session, hold_stream, planner_router, stream_step, words,
    Proc,
};
use serde_json::Value;

/// The remote prefill on `w0` among `plan`'s candidates.
fn prefill_on_w0(plan: &Value) -> Value {
    plan["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["action"] == "remote_prefill" && c["compute_on"] == 0)
        .unwrap_or_else(|| panic!("no remote prefill on w0: {plan:#}"))
        .clone()
}

/// The calibrated compute time of `c` over the preset's.
fn scale(c: &Value) -> f64 {
    c["cost"]["compute_s"].as_f64().unwrap() / c["preset_compute_s"].as_f64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_leg_on_an_idle_worker_calibrates_its_compute() {
    let flags = ["--step-overhead-s", "0.5", "--max-kv-blocks", "4000"];
    let workers = [Proc::sim_worker(&flags), Proc::sim_worker(&flags)];
    // The roles are kept: with the default (`auto`) the idle prefill worker, whose pool is
    // the decoder's size, would take the new session whole, and no leg would calibrate.
    let router = planner_router(
        "calibration.toml",
        &workers,
        &["prefill", "decode"],
        "planner_prefill_workers_decode = \"never\"\n",
    );
    let body = chat_body(&words("task", 2_000), 4);

    // Nothing observed yet: the plan prices w0 at the preset's time.
    let before = prefill_on_w0(&explain_new_session(&router, &body).await);
    assert!((scale(&before) - 1.0).abs() < 1e-9, "{before:#}");

    // Once its scrapes show w1 decoding, a new session is prefilled on w0.
    let mut loads = tokio::task::JoinSet::new();
    for i in 0..3 {
        hold_stream(&mut loads, &workers[1], words(&format!("busy{i}-"), 1_500));
    }
    eventually(
        Duration::from_secs(30),
        "the router prefills a new session remotely",
        || async {
            let plan = explain_new_session(&router, &body).await;
            plan["chosen"]["action"] == "remote_prefill" && plan["chosen"]["compute_on"] == 0
        },
    )
    .await;

    assert_eq!(stream_step(&router, "calibrates-w0", &body).await, "w1");

    // The leg took the preset's time plus at least one 0.5 s step overhead (a tenth off
    // for rounding): the planner now prices w0 at what it observed.
    let after = prefill_on_w0(&explain_new_session(&router, &body).await);
    let preset = after["preset_compute_s"].as_f64().unwrap();
    assert!(preset > 0.0, "{after:#}");
    assert!(scale(&after) >= 0.9 * (preset + 0.5) / preset, "{after:#}");
    loads.abort_all();
}
