//! The router keeping the ownership directory in step with the fleet: worker leases,
//! ownership of routed sessions and prefixes, and expiry when a worker dies.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::time::Duration;

use common::{chat_body, client, eventually, get_json, get_text, metric, temp_config, Proc};
use serde_json::Value;

async fn route(router: &str, session: &str, text: &str) -> String {
    let resp = client()
        .post(format!("{router}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(&chat_body(text, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()["x-ownerserve-worker"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// Index (directory worker id) of each worker name, from the router's worker list.
async fn worker_ids(router: &str) -> Vec<String> {
    let w = get_json(&format!("{router}/admin/v1/workers")).await;
    w["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until the directory lists `n` sessions.
async fn sessions_recorded(router: &str, n: usize) {
    let url = router.to_owned();
    eventually(Duration::from_secs(10), "sessions recorded", || {
        let url = url.clone();
        async move {
            get_json(&format!("{url}/admin/v1/sessions")).await["sessions"]
                .as_array()
                .is_some_and(|v| v.len() == n)
        }
    })
    .await;
}

fn long(tag: &str) -> String {
    (0..100).map(|i| format!("{tag} word {i} ")).collect()
}

#[tokio::test]
async fn up_records_leases_and_the_owners_of_routed_sessions() {
    let stack = Proc::up(&["--instant", "true"]);
    let names = worker_ids(&stack.url).await;
    let mut served = Vec::new();
    for s in ["alpha", "beta", "gamma"] {
        served.push((s, route(&stack.url, s, &long(s)).await));
    }
    sessions_recorded(&stack.url, 3).await;
    // Each session's owner is claimed before its first step is dispatched; its prefix
    // comes with the step's records, batched off the request path a moment later.
    let url = stack.url.clone();
    eventually(Duration::from_secs(10), "prefixes recorded", || {
        let url = url.clone();
        async move {
            get_json(&format!("{url}/admin/v1/sessions")).await["sessions"]
                .as_array()
                .is_some_and(|v| v.iter().all(|r| r["prefix"].is_u64()))
        }
    })
    .await;
    let sessions = get_json(&format!("{}/admin/v1/sessions", stack.url)).await;
    for (s, worker) in served {
        let row = sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == s)
            .unwrap()
            .clone();
        let owner = row["owner"]["worker"].as_u64().unwrap() as usize;
        assert_eq!(
            names[owner], worker,
            "{s} is owned by the worker that served it"
        );
        assert!(
            row["prefix"].is_u64(),
            "built on its prompt's prefix: {row}"
        );
    }
    let leases = get_json(&format!("{}/admin/v1/leases", stack.url)).await;
    assert_eq!(
        leases["leases"].as_array().unwrap().len(),
        names.len(),
        "one lease per worker: {leases}"
    );
    let owners = get_json(&format!("{}/admin/v1/owners", stack.url)).await;
    assert_eq!(owners["owners"].as_array().unwrap().len(), 3, "{owners}");
}

#[tokio::test]
async fn a_dead_worker_s_ownership_expires_on_its_own() {
    let mut a = Proc::sim_worker(&["--instant"]);
    let b = Proc::sim_worker(&["--instant"]);
    let cfg = temp_config(
        "ownership.toml",
        &format!(
            "[router]\ndirectory = \"embedded\"\nworker_lease_ttl_ms = 1000\nhealth_interval_ms = 100\n\
             health_failure_threshold = 1\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"decode\"\n\n\
             [[workers]]\nname = \"b\"\nurl = \"{}\"\nrole = \"decode\"\n",
            a.url, b.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    // Round robin: the first session lands on `a`.
    assert_eq!(route(&router.url, "s-a", &long("on a")).await, "a");
    sessions_recorded(&router.url, 1).await;
    a.kill();
    let url = router.url.clone();
    // No keep-alive for a dead worker: its lease expires, its session ends, its prefix needs
    // recomputing; `b` keeps its lease.
    eventually(Duration::from_secs(15), "a's ownership expired", || {
        let url = url.clone();
        async move {
            let leases: Value = get_json(&format!("{url}/admin/v1/leases")).await;
            let workers: Vec<u64> = leases["leases"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["worker"].as_u64().unwrap())
                .collect();
            let sessions = get_json(&format!("{url}/admin/v1/sessions")).await;
            workers == vec![1]
                && sessions["sessions"]
                    .as_array()
                    .is_some_and(|v| v.is_empty())
        }
    })
    .await;
    let owners = get_json(&format!("{}/admin/v1/owners", router.url)).await;
    assert!(owners["owners"]
        .as_array()
        .unwrap()
        .iter()
        .all(|o| o["needs_recompute"] == true && o["owner"].is_null()));
}

/// With 1 s retentions and 1 s idle leases, two routed sessions are demoted, then ended,
/// and the prefixes they were built on forgotten: the directory is left with its leases.
#[tokio::test]
async fn retention_ends_idle_demoted_sessions_and_forgets_their_prefixes() {
    let w = Proc::sim_worker(&["--instant"]);
    let cfg = temp_config(
        "retention.toml",
        &format!(
            "[router.directory]\nmode = \"embedded\"\nartifact_retention_s = 1\n\
             session_retention_s = 1\n\n\
             [router.sessions]\nlease_min_ms = 1000\nlease_max_ms = 1000\n\n\
             [[workers]]\nname = \"w\"\nurl = \"{}\"\nrole = \"hybrid\"\n",
            w.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    for s in ["alpha", "beta"] {
        route(&router.url, s, &long(s)).await;
    }
    sessions_recorded(&router.url, 2).await;
    let url = router.url.clone();
    eventually(
        Duration::from_secs(20),
        "sessions ended and prefixes forgotten",
        || {
            let url = url.clone();
            async move {
                let sessions = get_json(&format!("{url}/admin/v1/sessions")).await;
                let owners = get_json(&format!("{url}/admin/v1/owners")).await;
                sessions["sessions"].as_array().is_some_and(Vec::is_empty)
                    && owners["owners"].as_array().is_some_and(Vec::is_empty)
            }
        },
    )
    .await;
    let text = get_text(&format!("{}/metrics", router.url)).await;
    assert!(
        metric(
            &text,
            "ownerserve_directory_forgotten_total{kind=\"session\"}"
        ) >= 2.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "ownerserve_directory_forgotten_total{kind=\"artifact\"}"
        ) >= 2.0
    );
    let leases = get_json(&format!("{}/admin/v1/leases", router.url)).await;
    assert_eq!(leases["leases"].as_array().unwrap().len(), 1, "{leases}");
}

#[tokio::test]
async fn explain_shows_the_plan_for_a_session_s_next_turn_without_running_it() {
    let a = Proc::sim_worker(&["--instant"]);
    let p = Proc::sim_worker(&["--instant"]);
    let cfg = temp_config(
        "explain.toml",
        &format!(
            // kv_aware: the router tokenizes prompts and remembers where they went, so the
            // KV index knows what `a` holds (these workers publish no KV events).
            "[router]\ndirectory = \"embedded\"\npolicy = \"kv_aware\"\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"decode\"\n\n\
             [[workers]]\nname = \"p\"\nurl = \"{}\"\nrole = \"prefill\"\n",
            a.url, p.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let first = long("explained");
    assert_eq!(route(&router.url, "s-x", &first).await, "a");
    sessions_recorded(&router.url, 1).await;
    let model = chat_body("", 1)["model"].clone();
    let next_turn = |n: u32| {
        serde_json::json!({
            "model": model,
            "n": n,
            "messages": [
                {"role": "user", "content": first},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "now run the tests please"},
            ],
        })
    };
    let explain = |body: Value, token: Option<&'static str>| {
        let url = format!("{}/admin/v1/plan/explain", router.url);
        async move {
            let mut req = client().post(url).header("x-session-id", "s-x").json(&body);
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (status, plan) = explain(next_turn(1), Some(common::ADMIN_TOKEN)).await;
    assert_eq!(status, 200, "{plan}");
    // The session lives on `a` (id 0), which holds all but the new turn: stay there.
    assert_eq!(plan["inputs"]["decode_owner"], 0, "{plan:#}");
    assert_eq!(plan["inputs"]["directory"], "embedded");
    assert_eq!(plan["class"], "small_increment", "{plan:#}");
    assert_eq!(plan["action"], "colocate", "{plan:#}");
    assert_eq!(plan["chosen"]["decode_on"], 0);
    assert!(plan["reason"].as_str().unwrap().starts_with("colocate"));
    assert_eq!(plan["exhaustive"], true, "explain lists every pair");
    // This router routes with kv_aware: explain shows what the planner would do.
    assert_eq!(
        plan["inputs"]["planner"],
        "fresh (routing uses another policy; no migration budget)"
    );
    let candidates = plan["candidates"].as_array().unwrap();
    let remote = candidates
        .iter()
        .find(|c| c["action"] == "remote_prefill")
        .expect("prefilling on `p` is priced too");
    assert_eq!(remote["compute_on"], 1);
    assert!(
        remote["cost"]["total"].as_f64().unwrap()
            > plan["chosen"]["cost"]["total"].as_f64().unwrap()
    );
    for term in [
        "queue_s",
        "compute_s",
        "network_s",
        "restore_s",
        "hbm_bytes",
        "interference_s",
    ] {
        assert!(remote["cost"][term].is_number(), "{term}: {remote}");
    }
    // Four samples of the same turn are a forked rollout.
    let (_, forked) = explain(next_turn(4), Some(common::ADMIN_TOKEN)).await;
    assert_eq!(forked["class"], "forked_rollout", "{forked:#}");
    // Explaining changed nothing: still one session, and `p` got no request.
    let sessions = get_json(&format!("{}/admin/v1/sessions", router.url)).await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    let p_metrics = client()
        .get(format!("{}/metrics", p.url))
        .send()
        .await
        .unwrap();
    let text = p_metrics.text().await.unwrap();
    let served: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("vllm:request_success_total{"))
        .collect();
    assert!(
        !served.is_empty() && served.iter().all(|l| l.ends_with(" 0")),
        "no request reached p: {served:?}"
    );
    // Operator API rules: a token is needed; a model nobody serves is a 404.
    let (status, body) = explain(next_turn(1), None).await;
    assert_eq!(status, 401, "{body}");
    let mut unknown = next_turn(1);
    unknown["model"] = "no-such-model".into();
    let (status, body) = explain(unknown, Some(common::ADMIN_TOKEN)).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found", "{body}");
}

/// The owner of each session, `(worker id, epoch)`, as the directory lists it.
async fn owners(router: &str) -> std::collections::BTreeMap<String, (Option<u64>, u64)> {
    let sessions = get_json(&format!("{router}/admin/v1/sessions")).await;
    sessions["sessions"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r["id"].as_str().unwrap_or_default().to_owned(),
                        (
                            r["owner"]["worker"].as_u64(),
                            r["epoch"].as_u64().unwrap_or(0),
                        ),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A router starved past its workers' leases (SIGSTOP, as a host busy with its engines
/// does to it): when it runs again its workers' leases have lapsed, and each worker, granted
/// a lease again, takes back its sessions under a new epoch; none is lost or moved.
#[tokio::test]
async fn a_router_starved_past_its_leases_loses_no_owned_session() {
    let a = Proc::sim_worker(&["--instant"]);
    let b = Proc::sim_worker(&["--instant"]);
    let cfg = temp_config(
        "starved.toml",
        &format!(
            "[router]\npolicy = \"session_affinity\"\ndirectory = \"embedded\"\n\
             worker_lease_ttl_ms = 1000\n\n\
             [[workers]]\nname = \"a\"\nurl = \"{}\"\nrole = \"decode\"\n\n\
             [[workers]]\nname = \"b\"\nurl = \"{}\"\nrole = \"decode\"\n",
            a.url, b.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let names = ["s1", "s2", "s3", "s4"];
    let mut served = Vec::new();
    for s in names {
        served.push(route(&router.url, s, &long(s)).await);
    }
    sessions_recorded(&router.url, names.len()).await;
    let before = owners(&router.url).await;
    assert!(before.values().all(|(w, _)| w.is_some()), "{before:?}");
    // Stopped for three lease TTLs.
    router.signal("-STOP");
    tokio::time::sleep(Duration::from_secs(3)).await;
    router.signal("-CONT");
    // The leases lapsed (each worker has a new one); every session is owned again by the
    // worker that owned it, under a newer epoch.
    let url = router.url.clone();
    let expected = before.clone();
    eventually(Duration::from_secs(10), "every session owned again", || {
        let (url, expected) = (url.clone(), expected.clone());
        async move {
            let now = owners(&url).await;
            now.len() == expected.len()
                && expected.iter().all(|(s, (w, e))| {
                    now.get(s)
                        .is_some_and(|(nw, ne)| nw.is_some() && nw == w && ne > e)
                })
        }
    })
    .await;
    // Their next steps go where their KV is.
    for (s, worker) in names.iter().zip(&served) {
        assert_eq!(&route(&router.url, s, &long(s)).await, worker, "{s}");
    }
}
