//! One coding-agent session through the router with the `ownerserve` policy, on a real
//! fleet of simulated workers (an H100 prefill worker, two H20 decode workers, each its
//! own process publishing KV events) and the embedded directory. Its steps exercise all
//! five planner actions: a long first prompt (remote prefill), small turns (colocate),
//! an operator drain of the owner (migrate), an idle gap past the session's lease
//! (demotion, then tail recompute), and a fork with n = 4 off a busy owner (artifact
//! fetch). Before each step the explain API gives the plan; after it, the workers'
//! metrics must show the KV bytes moved and the tokens computed that the plan said. A
//! monitor polls the directory throughout: no prefix ever has two owners at one epoch,
//! and every owner change comes with a higher epoch.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{
    client, eventually, get_json, get_text, metric, temp_config, Proc, ADMIN_TOKEN, MODEL,
};
use serde_json::{json, Value};

const SESSION: &str = "agent-1";
/// KV bytes of one 16-token block of Llama-3.1-8B (32 layers × 8 KV heads × 128 × K,V × 2 B).
const BLOCK_BYTES: f64 = 2_097_152.0;
const BLOCK: u64 = 16;

struct Fleet {
    router: Proc,
    /// Worker name → (process, base url).
    workers: HashMap<&'static str, Proc>,
}

fn sim(gpu: &str) -> (Proc, String, String) {
    Proc::sim_worker_with_events(&[
        "--gpu-preset",
        gpu,
        "--time-scale",
        "10",
        "--link-gbs",
        "50",
    ])
}

fn start() -> Fleet {
    let (p, p_ev, p_rp) = sim("h100");
    let (d1, d1_ev, d1_rp) = sim("h20");
    let (d2, d2_ev, d2_rp) = sim("h20");
    let worker = |name: &str, w: &Proc, role: &str, ev: &str, rp: &str, gpu: &str| {
        format!(
            "[[workers]]\nname = \"{name}\"\nurl = \"{}\"\nrole = \"{role}\"\nengine = \"sim\"\n\
             gpu = \"{gpu}\"\nkv_events = \"{ev}\"\nkv_replay = \"{rp}\"\n\n",
            w.url
        )
    };
    // `planner_prefill_workers_decode = "never"`: step 1 exercises the remote prefill; with
    // the default the idle H100 prefill worker, its pool sized for decoding, would take the
    // session whole.
    // `planner_kappa = 0`: step 5 exercises the router's artifact-fetch path with a fork.
    // At the default κ a fork pays for the second copy of its prefix and stays with the
    // owner unless the owner's queue costs more than recomputing that copy, which this
    // three-worker fleet cannot build within the test's time (that choice is the planner's
    // unit test `a_fork_stays_with_its_prefix_unless_load_forces_a_spill`).
    let cfg = temp_config(
        "agent-session",
        &format!(
            "[router]\npolicy = \"ownerserve\"\ndirectory = \"embedded\"\nplanner_kappa = 0\n\
             planner_prefill_workers_decode = \"never\"\n\
             planner_gpu = \"h20\"\nplanner_link_gbs = 50\nplanner_time_scale = 10\n\
             scrape_interval_ms = 100\nownership_flush_ms = 10\n\
             session_lease_min_ms = 1000\nsession_lease_max_ms = 1000\n\n{}{}{}",
            worker("p", &p, "prefill", &p_ev, &p_rp, "h100"),
            worker("d1", &d1, "decode", &d1_ev, &d1_rp, "h20"),
            worker("d2", &d2, "decode", &d2_ev, &d2_rp, "h20"),
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    Fleet {
        router,
        workers: HashMap::from([("p", p), ("d1", d1), ("d2", d2)]),
    }
}

impl Fleet {
    fn url(&self, worker: &str) -> &str {
        &self.workers[worker].url
    }

    async fn worker_metric(&self, worker: &str, name: &str) -> f64 {
        metric(
            &get_text(&format!("{}/metrics", self.url(worker))).await,
            name,
        )
    }

    async fn plans(&self, action: &str) -> f64 {
        let text = get_text(&format!("{}/metrics", self.router.url)).await;
        metric(
            &text,
            &format!("ownerserve_plans_total{{action=\"{action}\",policy=\"ownerserve\"}}"),
        )
    }

    /// The plan the router would choose for `body` now.
    async fn explain(&self, body: &Value, fork: bool) -> Value {
        let mut req = client()
            .post(format!("{}/admin/v1/plan/explain", self.router.url))
            .bearer_auth(ADMIN_TOKEN)
            .header("x-session-id", SESSION)
            .json(body);
        if fork {
            req = req.header("x-ownerserve-fork", "agent-1-fork");
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.json().await.unwrap()
    }

    /// Sends a step and returns (decode worker, computed tokens, prompt tokens).
    async fn send(&self, body: &Value, fork: bool) -> (String, u64, u64) {
        let mut req = client()
            .post(format!("{}/v1/chat/completions", self.router.url))
            .header("x-session-id", SESSION)
            .json(body);
        if fork {
            req = req.header("x-ownerserve-fork", "agent-1-fork");
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let h = |k: &str| resp.headers()[k].to_str().unwrap().to_owned();
        let out = (
            h("x-ownerserve-worker"),
            h("x-ownerserve-computed-tokens").parse().unwrap(),
            h("x-ownerserve-prompt-tokens").parse().unwrap(),
        );
        let _: Value = resp.json().await.unwrap();
        out
    }

    /// Runs one step: explains it, checks the planner picks `action`, sends it, and checks
    /// the router executed that action where the plan said. Returns (plan, computed tokens,
    /// prompt tokens).
    async fn step(&self, body: &Value, fork: bool, action: &str) -> (Value, u64, u64) {
        let plan = self.explain(body, fork).await;
        assert_eq!(plan["action"], action, "{plan:#}");
        assert_eq!(
            plan["inputs"]["planner"], "routing",
            "the routing policy explains"
        );
        let names = plan["workers"].as_array().unwrap();
        let name = |role: &str| {
            names[plan["chosen"][role].as_u64().unwrap() as usize]["name"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        let (decode_on, compute_on) = (name("decode_on"), name("compute_on"));
        let counter = "ownerserve_prefill_computed_tokens_total";
        let computed_before = self.worker_metric(&compute_on, counter).await;
        let before = self.plans(action).await;
        let (worker, computed, prompt) = self.send(body, fork).await;
        assert_eq!(self.plans(action).await, before + 1.0, "{action} executed");
        assert_eq!(worker, decode_on, "{plan:#}");
        // The tokens computed where the plan computes are the plan's (to within the partial
        // last block an engine recomputes to sample from).
        let planned = plan["chosen"]["compute_tokens"].as_u64().unwrap();
        let done = (self.worker_metric(&compute_on, counter).await - computed_before) as u64;
        assert!(
            done.abs_diff(planned) <= BLOCK,
            "{action}: {compute_on} computed {done}, planned {planned}: {plan:#}"
        );
        (plan, computed, prompt)
    }
}

fn long_prompt() -> String {
    (0..300)
        .map(|i| format!("fn step_{i}(x: u32) -> u32 {{ x + {i} }}\n"))
        .collect()
}

/// The conversation so far as a chat body.
fn chat(turns: &[String], n: u32) -> Value {
    let mut messages = Vec::new();
    for (i, t) in turns.iter().enumerate() {
        if i > 0 {
            messages.push(json!({"role": "assistant", "content": format!("done with step {i}")}));
        }
        messages.push(json!({"role": "user", "content": t}));
    }
    json!({"model": MODEL, "messages": messages, "max_tokens": 4, "n": n})
}

/// Polls the directory until stopped; returns the violations it saw.
fn monitor(router: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<String>> {
    tokio_util::task::TaskTracker::new().spawn(async move {
        let mut last: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut violations = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let owners = get_json(&format!("{router}/admin/v1/owners")).await;
            for row in owners["owners"].as_array().into_iter().flatten() {
                let Some(owner) = row["owner"]["worker"].as_u64() else {
                    continue;
                };
                let key = row["key"].as_u64().unwrap();
                let epoch = row["owner"]["epoch"].as_u64().unwrap();
                if let Some(&(e, o)) = last.get(&key) {
                    if o != owner {
                        if epoch <= e {
                            violations.push(format!(
                                "prefix {key}: owner {o} at epoch {e}, then {owner} at epoch {epoch}"
                            ));
                        }
                    } else if e != epoch {
                        violations.push(format!("prefix {key}: epoch moved without a new owner"));
                    }
                }
                last.insert(key, (epoch, owner));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        violations
    })
}

async fn session_row(router: &str, id: &str) -> Value {
    get_json(&format!("{router}/admin/v1/sessions/{id}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_coding_agent_session_exercises_all_five_actions() {
    let fleet = start();
    let router = fleet.router.url.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let watch = monitor(router.clone(), stop.clone());
    let mut turns = vec![long_prompt()];

    // 1. A long new prompt: the H100 prefills it and the KV moves to an H20 decoder.
    let (plan, _, prompt) = fleet.step(&chat(&turns, 1), false, "remote_prefill").await;
    let owner = plan["workers"][plan["chosen"]["decode_on"].as_u64().unwrap() as usize]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = if owner == "d1" { "d2" } else { "d1" };
    let full_blocks = (prompt / BLOCK) as f64;
    let received = fleet
        .worker_metric(&owner, "ownerserve_kv_received_bytes_total")
        .await;
    assert_eq!(
        received,
        full_blocks * BLOCK_BYTES,
        "the prompt's blocks moved to {owner}"
    );
    assert_eq!(
        fleet
            .worker_metric("p", "ownerserve_kv_sent_bytes_total")
            .await,
        received
    );
    let planned = plan["chosen"]["network_bytes"].as_f64().unwrap();
    assert!(
        (planned - received).abs() <= BLOCK_BYTES,
        "planned {planned}, moved {received}"
    );
    // A busy fleet's prefill worker does not keep one session's prefix around for long.
    let reset = client()
        .post(format!("{}/reset_prefix_cache", fleet.url("p")))
        .send();
    assert_eq!(reset.await.unwrap().status(), 200);
    eventually(Duration::from_secs(10), "session recorded", || {
        let r = router.clone();
        async move { session_row(&r, SESSION).await["owner"].is_object() }
    })
    .await;

    // 2. Small turns stay on the owner.
    for i in 0..3 {
        turns.push(format!("now run the tests for module {i} please"));
        let (_, computed, _) = fleet.step(&chat(&turns, 1), false, "colocate").await;
        assert!(
            computed < 64,
            "a small turn computes only its new tokens: {computed}"
        );
    }
    assert_eq!(
        fleet
            .worker_metric(&owner, "ownerserve_kv_received_bytes_total")
            .await,
        received,
        "colocated turns move no KV"
    );

    let turns_so_far = turns.len();
    // 3. An operator drains the owner: the next turn migrates the session. (Ownership is
    // recorded off the request path: wait for the four turns' prefixes. A 5 s wait timed
    // out once in a full suite run, and never in 18 runs of this test alone.)
    eventually(Duration::from_secs(20), "turns recorded", || {
        let r = router.clone();
        async move {
            let owners = get_json(&format!("{r}/admin/v1/owners")).await;
            owners["owners"]
                .as_array()
                .is_some_and(|o| o.len() == turns_so_far)
        }
    })
    .await;
    let before = session_row(&router, SESSION).await;
    let old_epoch = before["epoch"].as_u64().unwrap();
    // The session's prefix (its last turn's sealed blocks), owned by the old owner.
    let prefix = before["prefix"].as_u64().unwrap();
    let owned_before = get_json(&format!("{router}/admin/v1/owners/{prefix}")).await;
    let drain = client()
        .post(format!("{router}/admin/v1/workers/{owner}/drain"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(drain.status(), 200);
    turns.push("the build failed, look at the log".into());
    let sent_before = fleet
        .worker_metric(&owner, "ownerserve_kv_sent_bytes_total")
        .await;
    let (plan, _, _) = fleet.step(&chat(&turns, 1), false, "migrate").await;
    let moved = fleet
        .worker_metric(other, "ownerserve_kv_received_bytes_total")
        .await;
    let planned = plan["chosen"]["network_bytes"].as_f64().unwrap();
    assert!(
        moved > 0.0 && (planned - moved).abs() <= BLOCK_BYTES,
        "planned {planned}, moved {moved}"
    );
    assert_eq!(
        fleet
            .worker_metric(&owner, "ownerserve_kv_sent_bytes_total")
            .await
            - sent_before,
        moved
    );
    let after = session_row(&router, SESSION).await;
    let new_epoch = after["epoch"].as_u64().unwrap();
    assert!(new_epoch > old_epoch, "{before} -> {after}");
    let ids = get_json(&format!("{router}/admin/v1/workers")).await;
    let other_id = ids["workers"]
        .as_array()
        .unwrap()
        .iter()
        .position(|w| w["id"] == other)
        .unwrap() as u64;
    assert_eq!(
        after["owner"]["worker"], other_id,
        "the directory flipped the owner"
    );
    let owned_after = get_json(&format!("{router}/admin/v1/owners/{prefix}")).await;
    assert!(
        owned_after["owner"]["worker"] == other_id
            && owned_after["epoch"].as_u64() > owned_before["epoch"].as_u64(),
        "the prefix moved with its session, under a new epoch: {owned_before} -> {owned_after}"
    );
    // The old owner dropped its copy and is fenced: a stale request is refused.
    let (o, url) = (owner.clone(), fleet.url(&owner).to_owned());
    eventually(Duration::from_secs(5), "old owner fenced", || {
        let url = url.clone();
        async move {
            let resp = client()
                .post(format!("{url}/v1/chat/completions"))
                .header("x-ownerserve-session", SESSION)
                .header("x-ownerserve-epoch", old_epoch.to_string())
                .json(&common::chat_body("stale", 1))
                .send()
                .await
                .unwrap();
            resp.status() == 409
        }
    })
    .await;
    assert!(
        fleet
            .worker_metric(&o, "ownerserve_kv_dropped_blocks_total")
            .await
            > 0.0
    );
    let undrain = client()
        .delete(format!("{router}/admin/v1/workers/{owner}/drain"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(undrain.status(), 200);
    let owner = other.to_owned();
    let other = if owner == "d1" { "d2" } else { "d1" };

    // 4. An idle gap past the session's lease: it is demoted, keeping its prefix.
    eventually(Duration::from_secs(10), "session demoted", || {
        let r = router.clone();
        async move { session_row(&r, SESSION).await["owner"].is_null() }
    })
    .await;
    let text = get_text(&format!("{router}/metrics")).await;
    assert!(metric(&text, "ownerserve_session_demotions_total") >= 1.0);
    // ... and resumes where its sealed prefix is, recomputing only the tail.
    turns.push("ok, the tool finished; continue".into());
    let received_before = fleet
        .worker_metric(&owner, "ownerserve_kv_received_bytes_total")
        .await;
    let placed = |text: &str, p: &str| {
        metric(
            text,
            &format!("ownerserve_session_steps_total{{placement=\"{p}\"}}"),
        )
    };
    let before = get_text(&format!("{router}/metrics")).await;
    let (_, computed, _) = fleet.step(&chat(&turns, 1), false, "tail_recompute").await;
    assert!(computed < 64, "only the tail is recomputed: {computed}");
    // The resume counts against the owner of its sealed prefix, not as an unowned step.
    let after = get_text(&format!("{router}/metrics")).await;
    for (p, more) in [("owner", 1.0), ("elsewhere", 0.0), ("unowned", 0.0)] {
        assert_eq!(placed(&after, p) - placed(&before, p), more, "{p} steps");
    }
    assert_eq!(
        fleet
            .worker_metric(&owner, "ownerserve_kv_received_bytes_total")
            .await,
        received_before,
        "no KV moved for a tail recompute"
    );

    // 5. A fork (n = 4) while the owner is busy decoding: the branch starts on the other
    // decoder, which fetches the sealed prefix from the owner.
    let busy: Vec<_> = (0..24)
        .map(|i| {
            let url = format!("{}/v1/chat/completions", fleet.url(&owner));
            tokio_util::task::TaskTracker::new().spawn(async move {
                let body = json!({"model": MODEL, "max_tokens": 3000, "ignore_eos": true,
                    "messages": [{"role": "user", "content": format!("background job {i}")}]});
                let _ = client().post(url).json(&body).send().await;
            })
        })
        .collect();
    let busy_name = owner.clone();
    eventually(Duration::from_secs(10), "owner busy", || {
        let r = router.clone();
        let name = busy_name.clone();
        async move {
            let w = get_json(&format!("{r}/admin/v1/workers")).await;
            w["workers"].as_array().unwrap().iter().any(|w| {
                w["id"] == name.as_str() && w["load"]["running"].as_f64().unwrap_or(0.0) >= 16.0
            })
        }
    })
    .await;
    turns.push("try four different fixes".into());
    let fetched_before = fleet
        .worker_metric(other, "ownerserve_kv_received_bytes_total")
        .await;
    let (plan, _, _) = fleet.step(&chat(&turns, 4), true, "artifact_fetch").await;
    let fetched = fleet
        .worker_metric(other, "ownerserve_kv_received_bytes_total")
        .await
        - fetched_before;
    let planned = plan["chosen"]["network_bytes"].as_f64().unwrap();
    assert!(
        fetched > 0.0 && (planned - fetched).abs() <= BLOCK_BYTES,
        "planned {planned}, fetched {fetched}"
    );
    eventually(Duration::from_secs(5), "fork recorded", || {
        let r = router.clone();
        async move { session_row(&r, "agent-1-fork").await["parent"] == SESSION }
    })
    .await;
    let child = session_row(&router, "agent-1-fork").await;
    assert_eq!(
        child["owner"]["worker"],
        3 - other_id,
        "the branch decodes on {other}"
    );
    for b in busy {
        b.abort();
    }

    // Throughout: one owner per prefix, each change under a higher epoch.
    stop.store(true, Ordering::Relaxed);
    let violations = watch.await.unwrap();
    assert!(violations.is_empty(), "{violations:#?}");
}
