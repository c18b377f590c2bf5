//! The host-DRAM KV tier end to end: real `ownerserve sim-worker` processes with a small
//! HBM, publishing KV events, behind a real router with the `ownerserve` policy. A
//! session's prefix is evicted from its worker's HBM by other traffic; with a host tier the
//! engine offloads it (KV events with medium CPU reach the router's index as host holds),
//! the planner routes the session's next step back there and prices a restore, and the
//! engine restores the prefix over PCIe instead of recomputing it. The same flow on the
//! same engines without a host tier recomputes: its TTFT is the baseline of the ratio.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{chat_body, client, eventually, get_text, metric, temp_config, words, Proc};
use serde_json::{json, Value};

const SESSION: &str = "host-tier-1";
/// HBM of each worker: 500 blocks of 16 tokens (8,000 tokens), so two other prompts of
/// the session's size evict it.
const HBM_BLOCKS: &str = "500";

struct Fleet {
    router: Proc,
    workers: Vec<Proc>,
}

/// Two hybrid workers (with a 4,000-block host tier each when `host`) and a router.
fn start(host: bool) -> Fleet {
    let mut args = vec!["--instant", "--max-kv-blocks", HBM_BLOCKS];
    if host {
        args.extend(["--host-kv-blocks", "4000"]);
    }
    let workers: Vec<(Proc, String, String)> = (0..2)
        .map(|_| Proc::sim_worker_with_events(&args))
        .collect();
    let mut cfg = String::from(
        "[router]\npolicy = \"ownerserve\"\ndirectory = \"embedded\"\nplanner_gpu = \"h100\"\n\
         scrape_interval_ms = 100\n\n",
    );
    for (i, (w, ev, rp)) in workers.iter().enumerate() {
        cfg.push_str(&format!(
            "[[workers]]\nname = \"w{i}\"\nurl = \"{}\"\nrole = \"hybrid\"\nengine = \"sim\"\n\
             kv_events = \"{ev}\"\nkv_replay = \"{rp}\"\n\n",
            w.url
        ));
    }
    let router = Proc::router(&[], &["--config", &temp_config("host-tier", &cfg)]);
    Fleet {
        router,
        workers: workers.into_iter().map(|(w, _, _)| w).collect(),
    }
}

/// The session's conversation: the first turn, then the second.
fn turn(step: usize) -> Value {
    let mut messages = vec![json!({"role": "user", "content": words("repo", 1200)})];
    if step > 1 {
        messages.push(json!({"role": "assistant", "content": "looked at it"}));
        messages.push(json!({"role": "user", "content": "now fix the failing test"}));
    }
    json!({"model": common::MODEL, "messages": messages, "max_tokens": 2})
}

impl Fleet {
    fn index_of(&self, name: &str) -> usize {
        name.trim_start_matches('w').parse().unwrap()
    }

    async fn worker_metric(&self, i: usize, name: &str) -> f64 {
        metric(
            &get_text(&format!("{}/metrics", self.workers[i].url)).await,
            name,
        )
    }

    async fn router_metric(&self, name: &str) -> f64 {
        metric(
            &get_text(&format!("{}/metrics", self.router.url)).await,
            name,
        )
    }

    /// Sends a session step through the router: (worker name, response).
    async fn send(&self, body: &Value) -> (String, Value) {
        let resp = client()
            .post(format!("{}/v1/chat/completions", self.router.url))
            .header("x-session-id", SESSION)
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let worker = resp.headers()["x-ownerserve-worker"]
            .to_str()
            .unwrap()
            .to_owned();
        (worker, resp.json().await.unwrap())
    }

    async fn explain(&self, body: &Value) -> Value {
        common::explain_session(&self.router, SESSION, body).await
    }

    /// Other traffic straight to worker `i`: two prompts as long as the session's.
    async fn evict(&self, i: usize) {
        for seed in ["other", "third"] {
            let seed = format!("{seed}{i}-");
            let resp = client()
                .post(format!("{}/v1/chat/completions", self.workers[i].url))
                .json(&chat_body(&words(&seed, 1200), 2))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
    }
}

/// What one run of the flow measured.
struct Measured {
    /// Simulated TTFT of the session's second step, seconds.
    ttft_s: f64,
    cached: u64,
    prompt: u64,
    restored: f64,
    plan: Value,
}

async fn run_flow(host: bool) -> Measured {
    let f = start(host);
    let (first, _) = f.send(&turn(1)).await;
    // Both workers' HBM fills with other work: the session's prefix is evicted from its
    // worker, and
    // neither worker has room to spare.
    f.evict(0).await;
    f.evict(1).await;
    let second = turn(2);
    if host {
        // The offload's BlockStored events (medium CPU) reach the router's index: it holds
        // more blocks in all than in GPU memory, and the planner prices a restore on x.
        eventually(
            Duration::from_secs(10),
            "host holds in the router's index",
            || async {
                let plan = f.explain(&second).await;
                plan["chosen"]["restored_tokens"].as_u64().unwrap_or(0) > 0
            },
        )
        .await;
        let all = f.router_metric("ownerserve_kv_index_blocks ").await;
        let gpu = f.router_metric("ownerserve_kv_index_gpu_blocks ").await;
        assert!(all > gpu, "index: {all} blocks, {gpu} in GPU memory");
    } else {
        // Without a host tier the evictions reach the index too (nothing restorable).
        eventually(
            Duration::from_secs(10),
            "evictions in the router's index",
            || async {
                f.router_metric("ownerserve_kv_index_block_changes_total{change=\"removed\"}")
                    .await
                    > 0.0
            },
        )
        .await;
    }
    let plan = f.explain(&second).await;
    let ttft_key = "vllm:time_to_first_token_seconds_sum";
    let mut before = Vec::new();
    for i in 0..f.workers.len() {
        before.push(f.worker_metric(i, ttft_key).await);
    }
    let (worker, resp) = f.send(&second).await;
    if host {
        assert_eq!(
            worker, first,
            "routed back to the worker holding it: {plan:#}"
        );
    }
    let i = f.index_of(&worker);
    let ttft_s = f.worker_metric(i, ttft_key).await - before[i];
    Measured {
        ttft_s,
        cached: resp["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        prompt: resp["usage"]["prompt_tokens"].as_u64().unwrap(),
        restored: f
            .worker_metric(i, "ownerserve_host_restored_tokens_total")
            .await,
        plan,
    }
}

#[tokio::test]
async fn an_evicted_session_prefix_is_restored_from_host_memory_faster_than_recomputed() {
    let with = run_flow(true).await;
    let without = run_flow(false).await;
    let chosen = &with.plan["chosen"];
    assert!(
        chosen["cost"]["host_restore_s"].as_f64().unwrap() > 0.0,
        "{chosen:#}"
    );
    // Most of the prompt came back from host memory, and the engine counted it.
    assert!(
        with.cached * 10 > with.prompt * 8,
        "{} of {}",
        with.cached,
        with.prompt
    );
    assert!(
        with.restored * 10.0 > with.prompt as f64 * 5.0,
        "{}",
        with.restored
    );
    assert_eq!(without.restored, 0.0);
    assert!(without.cached * 2 < without.prompt, "{}", without.cached);
    let ratio = with.ttft_s / without.ttft_s;
    assert!(
        ratio < 0.5,
        "restore TTFT {:.4} s vs recompute {:.4} s ({ratio:.2}x)",
        with.ttft_s,
        without.ttft_s
    );
    eprintln!(
        "host tier: TTFT {:.4} s restoring {} of {} tokens vs {:.4} s recomputing: {ratio:.3}x",
        with.ttft_s, with.restored, with.prompt, without.ttft_s
    );
}
