//! Stored responses (OpenAI Responses, `store: true`) owned in the replicated directory,
//! each part its own process: a 3-node `ownerserve directory` cluster, two `ownerserve
//! router`s (directory `remote`, round robin) and three simulated workers. 100 chains of
//! 5 turns alternate between the routers, so a follow-up usually reaches the router that
//! did not relay its previous response and finds the owner in the directory. Checked
//! from the workers' side: each stored response is held by its owner alone, and names
//! the previous one of its chain. A worker drained in the middle keeps its chains (their
//! state exists only in its engine); a killed one gives `503 response_owner_unavailable`
//! while its lease holds, then `410 response_lost`, naming the response, on both routers.
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};

use common::{client, temp_config, DirectoryNodes, Proc, ADMIN_TOKEN, MODEL};

const WORKERS: usize = 3;
const CHAINS: usize = 100;
const TURNS: usize = 5;

struct Stack {
    nodes: DirectoryNodes,
    workers: Vec<Proc>,
    routers: Vec<Proc>,
}

impl Stack {
    fn start() -> Stack {
        let nodes = DirectoryNodes::start(3, "responses", &["--tick-ms", "200"]);
        let (workers, _, workers_toml) = common::sim_worker_fleet(WORKERS, &["--instant"]);
        let config = temp_config(
            "response-owners-ha.toml",
            &format!(
                "[router]\nport = 0\npolicy = \"round_robin\"\n{}\
                 worker_lease_ttl_ms = 2000\nhealth_interval_ms = 100\n\
                 health_failure_threshold = 1\n\n{workers_toml}",
                common::remote_directory_keys(&nodes)
            ),
        );
        let routers = (0..2)
            .map(|_| {
                Proc::spawn(
                    &["router", "--config", &config],
                    &[],
                    "ownerserve router listening on",
                )
            })
            .collect();
        Stack {
            nodes,
            workers,
            routers,
        }
    }

    /// Waits until both routers' replicas follow the cluster and every worker has a
    /// live lease.
    async fn ready(&self) {
        for r in &self.routers {
            let url = format!("{}/admin/v1/cluster", r.url);
            common::eventually(Duration::from_secs(20), "the replica synced", || {
                let url = url.clone();
                async move {
                    let v = admin_get(&url).await;
                    v["replica"]["synced"] == json!(true)
                        && v["replica"]["connected"] == json!(true)
                }
            })
            .await;
        }
        let urls = self.nodes.urls();
        common::eventually(Duration::from_secs(20), "a live lease per worker", || {
            let urls = urls.clone();
            async move {
                let Some(d) = state(&urls).await else {
                    return false;
                };
                let live: std::collections::BTreeSet<u32> = d
                    .leases
                    .values()
                    .filter(|l| l.expires_at_ms > d.now_ms)
                    .map(|l| l.worker.0)
                    .collect();
                live.len() == WORKERS
            }
        })
        .await;
    }

    fn router(&self, i: usize) -> &str {
        &self.routers[i % self.routers.len()].url
    }

    fn worker_url(&self, name: &str) -> String {
        let i: usize = name.trim_start_matches('w').parse().unwrap();
        self.workers[i].url.clone()
    }
}

async fn admin_get(url: &str) -> Value {
    match client().get(url).bearer_auth(ADMIN_TOKEN).send().await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Value::Null,
    }
}

async fn state(urls: &[String]) -> Option<ownerserve_ownership::Directory> {
    common::linearizable::directory_state(&common::linearizable::http(), urls).await
}

/// A stored turn through `router`: its status, id (or error) and serving worker.
async fn turn(router: &str, prev: Option<&str>, i: usize) -> (u16, Value, String) {
    let mut body = json!({"model": MODEL, "input": format!("chain {i}"), "max_output_tokens": 2, "store": true});
    if let Some(p) = prev {
        body["previous_response_id"] = json!(p);
    }
    let r = client()
        .post(format!("{router}/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let worker = r
        .headers()
        .get("x-ownerserve-worker")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    (status, r.json().await.unwrap(), worker)
}

/// A turn that must succeed: its id and worker.
async fn ok_turn(router: &str, prev: Option<&str>, i: usize) -> (String, String) {
    let (status, v, worker) = turn(router, prev, i).await;
    assert_eq!(status, 200, "chain {i}: {v}");
    (v["id"].as_str().unwrap().to_owned(), worker)
}

/// What a worker's own engine holds for response `id` (no router between).
async fn held_by(worker_url: &str, id: &str) -> Option<Value> {
    let r = client()
        .get(format!("{worker_url}/v1/responses/{id}"))
        .send()
        .await
        .unwrap();
    match r.status().as_u16() {
        200 => Some(r.json().await.unwrap()),
        404 => None,
        s => panic!("{worker_url} answered {s} for {id}"),
    }
}

/// One chain: its owner and every response id so far.
struct Chain {
    owner: String,
    ids: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chains_stay_on_their_owner_across_routers_through_a_drain_and_a_kill_is_named() {
    let mut stack = Stack::start();
    stack.ready().await;
    let mut chains = Vec::new();
    for i in 0..CHAINS {
        let (id, owner) = ok_turn(stack.router(i), None, i).await;
        chains.push(Chain {
            owner,
            ids: vec![id],
        });
    }
    let mut spread: BTreeMap<String, usize> = BTreeMap::new();
    for c in &chains {
        *spread.entry(c.owner.clone()).or_default() += 1;
    }
    assert_eq!(spread.len(), WORKERS, "first turns spread: {spread:?}");
    let drained = "w0".to_owned();
    for t in 1..TURNS {
        if t == 2 {
            // Drain w0 on both routers: no new chains start there, its chains go on.
            for r in &stack.routers {
                let resp = client()
                    .post(format!("{}/admin/v1/workers/{drained}/drain", r.url))
                    .bearer_auth(ADMIN_TOKEN)
                    .send()
                    .await
                    .unwrap();
                assert!(resp.status().is_success());
            }
            // (They go on with the others from this turn.)
            for i in 0..6 {
                let (id, owner) = ok_turn(stack.router(i), None, 1000 + i).await;
                assert_ne!(owner, drained, "a new chain started on the drained worker");
                chains.push(Chain {
                    owner,
                    ids: vec![id],
                });
            }
        }
        for (i, c) in chains.iter_mut().enumerate() {
            // The other router than the one that relayed the previous turn.
            let (id, worker) =
                ok_turn(stack.router(i + t), c.ids.last().map(String::as_str), i).await;
            assert_eq!(worker, c.owner, "chain {i} turn {t} left its owner");
            c.ids.push(id);
        }
    }
    // From the workers' side: each response is held by its owner's engine alone, and
    // continues the previous one of its chain.
    let names: Vec<String> = (0..WORKERS).map(|i| format!("w{i}")).collect();
    for (i, c) in chains.iter().enumerate() {
        for (t, id) in c.ids.iter().enumerate() {
            for name in &names {
                let held = held_by(&stack.worker_url(name), id).await;
                assert_eq!(
                    held.is_some(),
                    *name == c.owner,
                    "chain {i} turn {t} on {name}"
                );
                if let (Some(v), Some(prev)) = (held, t.checked_sub(1)) {
                    assert_eq!(
                        v["previous_response_id"],
                        json!(c.ids[prev]),
                        "chain {i} turn {t}"
                    );
                }
            }
        }
    }
    // The directory holds every stored response with its owner (worker ids are config
    // positions), and both routers' replicas see the same.
    let d = state(&stack.nodes.urls()).await.unwrap();
    for c in &chains {
        let want: u32 = c.owner.trim_start_matches('w').parse().unwrap();
        for id in &c.ids {
            let r = d
                .responses
                .get(id)
                .unwrap_or_else(|| panic!("{id} not in the directory"));
            assert_eq!((r.worker.0, r.lost), (want, false), "{id}");
        }
    }
    // What the drain leaves on w0, as the operator sees it.
    let on_drained: usize = chains
        .iter()
        .filter(|c| c.owner == drained)
        .map(|c| c.ids.len())
        .sum();
    let workers = admin_get(&format!("{}/admin/v1/workers", stack.router(1))).await;
    let row = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == json!(drained))
        .unwrap()
        .clone();
    assert_eq!(
        (row["draining"].clone(), row["stored_responses"].clone()),
        (json!(true), json!(on_drained)),
        "{row}"
    );
    kill_an_owner(&mut stack, &chains).await;
}

/// Kills w1: its chains' follow-ups and reads are refused naming the response (503 while
/// its lease holds, then 410 on every router); the other chains go on.
async fn kill_an_owner(stack: &mut Stack, chains: &[Chain]) {
    let victim = "w1";
    stack.workers[1].kill();
    let (i, lost) = chains
        .iter()
        .enumerate()
        .find(|(_, c)| c.owner == victim)
        .map(|(i, c)| (i, c.ids.last().unwrap().clone()))
        .unwrap();
    let (status, v, _) = turn(stack.router(0), Some(&lost), i).await;
    assert!([503, 410].contains(&status), "{status} {v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&lost),
        "{v}"
    );
    if status == 503 {
        assert_eq!(v["error"]["code"], "response_owner_unavailable", "{v}");
    }
    // Once the lease has lapsed, the directory marks the response lost: 410 everywhere.
    for r in 0..2 {
        let router = stack.router(r).to_owned();
        let lost = lost.clone();
        common::eventually(Duration::from_secs(20), "the response is lost", || {
            let (router, lost) = (router.clone(), lost.clone());
            async move { turn(&router, Some(&lost), i).await.0 == 410 }
        })
        .await;
        let (_, v, _) = turn(&router, Some(&lost), i).await;
        assert_eq!(v["error"]["code"], "response_lost", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(&lost),
            "{v}"
        );
        let r = client()
            .get(format!("{router}/v1/responses/{lost}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 410);
    }
    // The operator sees them in the directory's metrics.
    let node = stack.nodes.url(1);
    let lost_n = chains
        .iter()
        .filter(|c| c.owner == victim)
        .map(|c| c.ids.len())
        .sum::<usize>();
    let text = client()
        .get(format!("{node}/metrics"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let lost_metric = text
        .lines()
        .find(|l| l.starts_with("ownerserve_directory_stored_responses{state=\"lost\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok());
    assert_eq!(
        lost_metric,
        Some(lost_n as f64),
        "lost responses in the node's metrics"
    );
    // The other workers' chains go on, the drained one's included.
    let mut served: HashMap<String, usize> = HashMap::new();
    for (i, c) in chains.iter().enumerate().filter(|(_, c)| c.owner != victim) {
        let (_, worker) = ok_turn(stack.router(i), c.ids.last().map(String::as_str), i).await;
        assert_eq!(worker, c.owner);
        *served.entry(worker).or_default() += 1;
    }
    assert_eq!(served.len(), WORKERS - 1, "{served:?}");
}
