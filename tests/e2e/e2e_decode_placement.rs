//! The planner's decode term end to end: two real `ownerserve sim-worker` processes, loaded
//! by traffic sent straight to them, and two real routers with the `ownerserve` policy that
//! see that load only through their metrics scrapes. Worker `w1` runs one sequence with a
//! long context, `w0` two with short ones. Priced up to the first token (`planner_rho = 0`)
//! a new session goes where fewer decodes would be stalled (`w1`); with the decode term on
//! (the default) it goes where a decode step reads less KV (`w0`), and the explain output
//! shows each decoder's decode-seconds.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{
    chat_body, colocate_cost, eventually, explain_new_session, hold_stream, planner_router,
    stream_step, words, Proc,
};
use serde_json::Value;

fn router(name: &str, workers: &[Proc], rho: Option<f64>) -> Proc {
    let extra = rho.map_or(String::new(), |rho| format!("planner_rho = {rho}\n"));
    planner_router(name, workers, &vec!["hybrid"; workers.len()], &extra)
}

/// A streamed request through `router`, read to its end: the router observes the stream's
/// decode time, which the decode term needs (no term before any is observed).
async fn one_stream(router: &Proc) {
    stream_step(
        router,
        &format!("warm-{}", router.url),
        &chat_body("warm up", 3),
    )
    .await;
}

/// The plan `router` would make for a brand-new session's first step.
async fn explain(router: &Proc) -> Value {
    explain_new_session(router, &chat_body("a new task: read the repository", 16)).await
}

/// Decode-seconds of the colocation on worker `id` in `plan`.
fn decode_s(plan: &Value, id: u64) -> f64 {
    colocate_cost(plan, id, "decode_s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_goes_where_a_decode_step_reads_less_kv_not_where_fewer_decodes_run() {
    // 200 ms per engine step: the loads below decode for over a minute.
    let flags = ["--step-overhead-s", "0.2", "--max-kv-blocks", "4000"];
    let workers = vec![Proc::sim_worker(&flags), Proc::sim_worker(&flags)];
    let decode_term = router("decode-term.toml", &workers, None);
    let first_token_only = router("first-token-only.toml", &workers, Some(0.0));
    one_stream(&decode_term).await;
    one_stream(&first_token_only).await;

    let mut loads = tokio::task::JoinSet::new();
    hold_stream(&mut loads, &workers[1], words("context", 6_000));
    hold_stream(&mut loads, &workers[0], words("short", 100));
    hold_stream(&mut loads, &workers[0], words("brief", 100));

    // Once its scrapes show the load, the router pricing the first token only sends the
    // new session to w1, where one decode is stalled instead of two. (Before they do,
    // both workers look idle and the tie goes to w0: so this can only pass on the load.)
    eventually(
        Duration::from_secs(30),
        "the first-token-only router prefers w1",
        || async { explain(&first_token_only).await["chosen"]["decode_on"] == 1 },
    )
    .await;

    // The default router sees the same load and prices each decoder's decode: w1's step
    // reads the long context on every token.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let last = loop {
        let plan = explain(&decode_term).await;
        let (w0, w1) = (decode_s(&plan, 0), decode_s(&plan, 1));
        if w0 > 0.0 && w1 > w0 {
            break plan;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the decode term never priced w1 above w0: {plan:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!(
        "decode-seconds of a new session: w0 {:.4}, w1 {:.4}",
        decode_s(&last, 0),
        decode_s(&last, 1)
    );
    assert_eq!(last["chosen"]["decode_on"], 0, "{last:#}");
}
