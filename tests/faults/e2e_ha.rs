//! The production topology, each part its own process: a 3-node `ownerserve directory`
//! cluster, two `ownerserve router`s (policy `ownerserve`, directory `remote`, each with its
//! live replica) and four simulated workers. Sessions' steps go to a random router; the
//! directory, not the router that saw a step, decides each session's owner, and every step
//! is served there.
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};

use common::{temp_config, DirectoryNodes, Proc, ADMIN_TOKEN, MODEL};

pub(crate) struct Ha {
    pub(crate) nodes: DirectoryNodes,
    _workers: Vec<Proc>,
    /// The workers' URLs, by directory worker id (their position).
    worker_urls: Vec<String>,
    pub(crate) routers: Vec<Proc>,
    /// The routers' configuration file.
    config: String,
}

impl Ha {
    pub(crate) fn start(tag: &str) -> Ha {
        Ha::start_with(tag, "")
    }

    /// Stops router `i` (SIGTERM, as an operator's restart) and starts it again on the
    /// same configuration (on a new port).
    pub(crate) fn restart_router(&mut self, i: usize) {
        self.routers[i].signal("-TERM");
        let _ = self.routers[i].child.wait();
        self.routers[i] = Proc::spawn(
            &["router", "--config", &self.config],
            &[],
            "ownerserve router listening on",
        );
    }

    /// The topology with `router_keys` (TOML lines) added to both routers' `[router]`.
    fn start_with(tag: &str, router_keys: &str) -> Ha {
        Ha::start_with_policy(tag, "ownerserve", router_keys)
    }

    /// The topology with the routers' `policy` and `router_keys`.
    pub(crate) fn start_with_policy(tag: &str, policy: &str, router_keys: &str) -> Ha {
        let nodes = DirectoryNodes::start(3, tag, &["--tick-ms", "200"]);
        let (workers, ports, workers_toml) = common::sim_worker_fleet(4, &["--time-scale", "20"]);
        let config = temp_config(
            &format!("ha-{tag}.toml"),
            &format!(
                "[router]\nport = 0\npolicy = \"{policy}\"\n{}\
                 worker_lease_ttl_ms = 6000\nhealth_interval_ms = 200\n{router_keys}\n{workers_toml}",
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
        Ha {
            nodes,
            _workers: workers,
            worker_urls: ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            routers,
            config,
        }
    }

    /// Waits until both replicas follow the cluster and every worker has exactly one
    /// live lease (the routers share them).
    pub(crate) async fn ready(&self) {
        let http = admin();
        for r in &self.routers {
            let url = format!("{}/admin/v1/cluster", r.url);
            common::eventually(Duration::from_secs(20), "the replica synced", || {
                let (http, url) = (http.clone(), url.clone());
                async move {
                    let v: Value = match http.get(url).send().await {
                        Ok(r) => r.json().await.unwrap_or_default(),
                        Err(_) => return false,
                    };
                    v["replica"]["synced"] == json!(true)
                        && v["replica"]["connected"] == json!(true)
                }
            })
            .await;
        }
        let urls = self.nodes.urls();
        common::eventually(Duration::from_secs(20), "one live lease per worker", || {
            let urls = urls.clone();
            async move {
                let Some(d) = state(&urls).await else {
                    return false;
                };
                let now = d.now_ms;
                let mut per_worker: BTreeMap<u32, usize> = BTreeMap::new();
                for l in d.leases.values().filter(|l| l.expires_at_ms > now) {
                    *per_worker.entry(l.worker.0).or_default() += 1;
                }
                per_worker.len() == 4 && per_worker.values().all(|&n| n == 1)
            }
        })
        .await;
    }
}

/// A counter's value in a scrape (0 while it has no sample yet).
fn counter(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

pub(crate) fn admin() -> reqwest::Client {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    reqwest::Client::builder()
        .default_headers(h)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// The directory's state, read linearizably from any node.
pub(crate) async fn state(urls: &[String]) -> Option<ownerserve_ownership::Directory> {
    common::linearizable::directory_state(&common::linearizable::http(), urls).await
}

/// Worker ids as the directory names them, by worker name: the position in the config.
pub(crate) fn worker_ids() -> HashMap<String, u32> {
    (0..4).map(|i| (format!("w{i}"), i)).collect()
}

/// One step of `session` through `router`: the serving worker's name and the ownership
/// epoch it ran under, or why not.
pub(crate) async fn step(
    http: &reqwest::Client,
    router: &str,
    session: &str,
    messages: &[Value],
) -> Result<(String, Option<u64>), String> {
    send(http, router, session, messages, None).await
}

/// A step, or with `fork` a fork of the session into that child with `n = 2` samples.
async fn send(
    http: &reqwest::Client,
    router: &str,
    session: &str,
    messages: &[Value],
    fork: Option<&str>,
) -> Result<(String, Option<u64>), String> {
    let mut req = http
        .post(format!("{router}/v1/chat/completions"))
        .header("x-session-id", session);
    let mut body = json!({"model": MODEL, "messages": messages, "max_tokens": 4});
    if let Some(child) = fork {
        req = req.header("x-ownerserve-fork", child);
        body["n"] = json!(2);
    }
    let resp = req.json(&body).send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let worker = resp
        .headers()
        .get("x-ownerserve-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let epoch = resp
        .headers()
        .get("x-ownerserve-epoch")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = resp.text().await.map_err(|e| e.to_string())?;
    match (status.is_success(), worker) {
        (true, Some(w)) => Ok((w, epoch)),
        _ => Err(format!("{status}: {body}")),
    }
}

/// What replaying the committed log found.
#[derive(Default)]
struct Replayed {
    /// Entries applied.
    entries: usize,
    /// Invariant violations, with the entry after which each was seen.
    violations: Vec<String>,
    /// Snapshots taken after the first (a snapshot skips entries).
    snapshots: usize,
    /// Every (session, epoch) the log ever gave an owner, with that owner's worker id and
    /// the leader's time stamp of the entry that gave it.
    owners: HashMap<(String, u64), (u32, u64)>,
}

/// Follows the cluster's committed log from its start (`/directory/v1/watch`), applies
/// every entry to a directory of its own and checks the invariants after each one (one
/// owner per session and prefix at every instant, owners backed by live leases' keys),
/// and records which worker owned each session at each epoch, until `stop`, then up to the
/// cluster's applied index at that moment.
async fn replay_log(urls: Vec<String>, stop: tokio_util::sync::CancellationToken) -> Replayed {
    let http = reqwest::Client::builder()
        .default_headers(common::cluster_secret_headers())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let mut d: Option<ownerserve_ownership::Directory> = None;
    let mut out = Replayed::default();
    let mut applied = 0u64;
    let mut target: Option<u64> = None;
    for i in 0.. {
        if target.is_some_and(|t| applied >= t) {
            break;
        }
        let url = &urls[i % urls.len()];
        let Ok(mut resp) = http
            .get(format!("{url}/directory/v1/watch?after={applied}"))
            .send()
            .await
        else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let mut buf = Vec::new();
        loop {
            let chunk = tokio::time::timeout(Duration::from_secs(3), resp.chunk()).await;
            let Ok(Ok(Some(chunk))) = chunk else { break };
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Value = serde_json::from_slice(&buf[..end]).unwrap();
                buf.drain(..=end);
                if line.get("heartbeat").is_some() {
                    continue;
                }
                let index = line["index"].as_u64().unwrap();
                if let Some(snapshot) = line.get("snapshot") {
                    if d.is_some() {
                        out.snapshots += 1;
                    }
                    d = Some(serde_json::from_value(snapshot.clone()).unwrap());
                    applied = index;
                    continue;
                }
                if index <= applied {
                    continue;
                }
                assert_eq!(index, applied + 1, "a gap in the watched log");
                let state = d.as_mut().expect("a snapshot first");
                if !line["entry"].is_null() {
                    let env: ownerserve_ownership::Envelope =
                        serde_json::from_value(line["entry"].clone()).unwrap();
                    state.apply(index, &env);
                    for v in ownerserve_ownership::invariants::check(state) {
                        out.violations.push(format!("after entry {index}: {v:?}"));
                    }
                    for (id, s) in &state.sessions {
                        if let Some(o) = s.owner {
                            let given = (o.worker.0, env.now_ms);
                            let seen =
                                *out.owners.entry((id.0.clone(), s.epoch.0)).or_insert(given);
                            if seen.0 != o.worker.0 {
                                out.violations.push(format!(
                                    "after entry {index}: {} epoch {} owned by worker {} and earlier by {}",
                                    id.0, s.epoch.0, o.worker.0, seen.0
                                ));
                            }
                        }
                    }
                    out.entries += 1;
                }
                applied = index;
            }
            if stop.is_cancelled() && target.is_none() {
                target = Some(applied_now(&http, &urls).await);
            }
            if target.is_some_and(|t| applied >= t) {
                break;
            }
        }
    }
    out
}

/// Checks what each worker's fence accepted (`/ownerserve/v1/fence/accepted`) against the
/// replayed log: every completion a worker generated ran at an epoch at which the log gave
/// that worker the session, and per worker and session the accepted epochs never went
/// back. Answers the violations, the completions checked, and how many were accepted after
/// the log had already given the session a newer epoch elsewhere (in flight across a move:
/// planned before it, arriving after it; the fence of the old owner cannot know).
async fn audit_workers(worker_urls: &[String], replayed: &Replayed) -> (Vec<String>, usize, usize) {
    let http = reqwest::Client::new();
    let (mut violations, mut checked, mut overtaken) = (Vec::new(), 0, 0);
    for (id, url) in worker_urls.iter().enumerate() {
        let log: Value = http
            .get(format!("{url}/ownerserve/v1/fence/accepted"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(log["forgotten"], 0, "worker {id} forgot accepted claims");
        let mut last: HashMap<String, u64> = HashMap::new();
        for a in log["accepted"].as_array().unwrap() {
            let session = a["session"].as_str().unwrap().to_owned();
            let epoch = a["epoch"].as_u64().unwrap();
            let before = last.insert(session.clone(), epoch);
            if before.is_some_and(|b| epoch < b) {
                violations.push(format!(
                    "worker {id} accepted {session} at epoch {epoch} after {before:?}"
                ));
            }
            if a["for"] != "generate" {
                continue;
            }
            checked += 1;
            match replayed.owners.get(&(session.clone(), epoch)) {
                Some((owner, _)) if *owner == id as u32 => {}
                other => violations.push(format!(
                    "worker {id} generated for {session} at epoch {epoch}, which the log gave to {other:?}"
                )),
            }
            let at = a["at_unix_ms"].as_u64().unwrap();
            // Only counted: a newer epoch committed elsewhere before this one arrived is a
            // race with the request's flight, which the old owner's fence cannot see.
            overtaken += usize::from(
                replayed
                    .owners
                    .iter()
                    .any(|((s, e), (_, t))| *s == session && *e > epoch && *t < at),
            );
        }
    }
    (violations, checked, overtaken)
}

/// The highest index any node has applied now.
async fn applied_now(http: &reqwest::Client, urls: &[String]) -> u64 {
    let mut best = 0;
    for url in urls {
        if let Ok(r) = http.get(format!("{url}/directory/v1/cluster")).send().await {
            if let Ok(v) = r.json::<Value>().await {
                best = best.max(v["last_applied"].as_u64().unwrap_or(0));
            }
        }
    }
    best
}

/// The same new session's first step sent to both routers at once, 100 times: the
/// directory always ends with one owner, and both requests are served by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_session_sent_to_both_routers_at_once_gets_one_owner_serving_both() {
    let ha = Ha::start("race");
    ha.ready().await;
    let ids = worker_ids();
    let http = common::client();
    let (a, b) = (ha.routers[0].url.clone(), ha.routers[1].url.clone());
    let mut served = Vec::new();
    for i in 0..100 {
        let session = format!("race-{i}");
        let messages =
            [json!({"role": "user", "content": format!("race {i}: {}", "x ".repeat(200))})];
        let (ra, rb) = tokio::join!(
            step(&http, &a, &session, &messages),
            step(&http, &b, &session, &messages)
        );
        let ((wa, ea), (wb, eb)) = (ra.unwrap(), rb.unwrap());
        assert_eq!(wa, wb, "{session}: the routers sent it to two workers");
        assert_eq!(ea, eb, "{session}: two epochs");
        served.push((session, wa));
    }
    // Every session was claimed, by one router or both (both win when both planned the
    // same worker: the claim of an owner's own lease keeps it); a lost claim's step went to
    // the winner's worker.
    let (mut won, mut lost) = (0.0, 0.0);
    for r in [&a, &b] {
        let text = common::get_text(&format!("{r}/metrics")).await;
        won += counter(&text, "ownerserve_ownership_claims_total{result=\"won\"}");
        lost += counter(&text, "ownerserve_ownership_claims_total{result=\"lost\"}");
    }
    assert!(
        won >= 100.0 && won + lost <= 200.0,
        "{won} won, {lost} lost"
    );
    eprintln!("100 races: {won} claims won, {lost} lost (those steps went to the winner)");
    let d = state(&ha.nodes.urls()).await.unwrap();
    assert!(ownerserve_ownership::invariants::check(&d).is_empty());
    for (session, worker) in &served {
        let s = &d.sessions[&ownerserve_ownership::ids::SessionId(session.clone())];
        let owner = s.owner.unwrap_or_else(|| panic!("{session} has no owner"));
        assert_eq!(owner.worker.0, ids[worker], "{session}: served by {worker}");
    }
}

/// A session whose steps all go to the other router is not idle: the router that served
/// only its first step sees it idle past its lease, and its demotion is refused because
/// the directory saw the session written within that lease. Without the directory's
/// check, that router demoted a session in use (the owner dropped it mid-conversation and
/// the next step claimed it again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_does_not_demote_a_session_the_other_router_is_serving() {
    let ha = Ha::start_with(
        "demote",
        "session_lease_min_ms = 500\nsession_lease_max_ms = 1500",
    );
    ha.ready().await;
    let http = common::client();
    let (a, b) = (ha.routers[0].url.clone(), ha.routers[1].url.clone());
    let session = ownerserve_ownership::ids::SessionId("demote-0".to_owned());
    let mut messages =
        vec![json!({"role": "user", "content": format!("first: {}", "x ".repeat(300))})];
    step(&http, &a, &session.0, &messages).await.unwrap();
    // Router `a` saw one step and no gap: its lease is the 1.5 s maximum. Router `b` serves
    // the session every 300 ms for three times that.
    let until = tokio::time::Instant::now() + Duration::from_millis(4_500);
    let mut steps = 0;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(300)).await;
        messages
            .push(json!({"role": "user", "content": format!("step {steps}: {}", "y ".repeat(40))}));
        step(&http, &b, &session.0, &messages).await.unwrap();
        steps += 1;
    }
    let demotions = |router: String| async move {
        counter(
            &common::get_text(&format!("{router}/metrics")).await,
            "ownerserve_session_demotions_total",
        )
    };
    assert_eq!(
        demotions(a.clone()).await,
        0.0,
        "`a` demoted a session `b` serves"
    );
    let d = state(&ha.nodes.urls()).await.unwrap();
    assert!(
        d.sessions[&session].owner.is_some(),
        "the session kept an owner"
    );
    // Once no router sends it anything, it is demoted: by `b`, whose lease follows the
    // 300 ms gaps (~600 ms), or by `a` (none: it dropped the session when refused).
    common::eventually(Duration::from_secs(10), "the idle session demoted", || {
        let (urls, session) = (ha.nodes.urls(), session.clone());
        async move {
            state(&urls).await.unwrap().sessions[&session]
                .owner
                .is_none()
        }
    })
    .await;
    assert_eq!(demotions(b).await, 1.0);
}

/// A step planned off its session's owner while the directory cannot commit (every node
/// stopped, so the claim times out) goes where it was planned, unrecorded: without an
/// epoch, never under the previous owner's epoch on another worker (which a worker fences
/// by, and which the directory gave to the owner alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_step_moved_while_the_directory_cannot_commit_runs_unrecorded() {
    let ha = Ha::start("unrecorded");
    ha.ready().await;
    let router = &ha.routers[0].url;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut messages = vec![json!({"role": "user", "content": "first step ".repeat(40)})];
    // A new session's claim commits before its first step; on a loaded machine one may time
    // out (or find its worker's lease not yet in the replica) and run unrecorded: then
    // start another session.
    let mut claimed = None;
    for attempt in 0..10 {
        let session = format!("un-{attempt}");
        if let (owner, Some(epoch)) = step(&http, router, &session, &messages).await.unwrap() {
            claimed = Some((session, owner, epoch));
            break;
        }
    }
    let (session, owner, epoch) = claimed.expect("no new session's claim committed in 10 tries");
    // The router's replica has the owner: the next step is planned against it.
    let v = common::get_json(&format!(
        "{router}/admin/v1/sessions/{session}?linearizable=true"
    ))
    .await;
    assert_eq!(v["epoch"], json!(epoch), "{v}");
    for i in 1..=3 {
        ha.nodes.proc(i).unwrap().signal("-STOP");
    }
    let drained = admin()
        .post(format!("{router}/admin/v1/workers/{owner}/drain"))
        .send()
        .await
        .unwrap();
    assert!(drained.status().is_success());
    messages.push(json!({"role": "assistant", "content": "ok"}));
    messages.push(json!({"role": "user", "content": "second step ".repeat(40)}));
    let moved = step(&http, router, &session, &messages).await;
    for i in 1..=3 {
        ha.nodes.proc(i).unwrap().signal("-CONT");
    }
    let (worker, moved_epoch) = moved.unwrap();
    assert_ne!(worker, owner, "a drained owner takes no step");
    assert_eq!(
        moved_epoch, None,
        "the step on {worker} ran under {owner}'s epoch {epoch}"
    );
}

/// 100 sessions × 8 steps over two routers, with a drain, a directory leader killed and a
/// router stopped for 10 s on the way: every step served, each by its session's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sessions_over_two_routers_are_served_by_their_directory_owner_through_faults() {
    let mut ha = Ha::start("steps");
    ha.ready().await;
    // The committed log, replayed entry by entry from the start, beside the run.
    let stop_replay = tokio_util::sync::CancellationToken::new();
    let mut replay = tokio::task::JoinSet::new();
    replay.spawn(replay_log(ha.nodes.urls(), stop_replay.clone()));
    let ids = worker_ids();
    let routers: Vec<String> = ha.routers.iter().map(|r| r.url.clone()).collect();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .unwrap();
    let admin = admin();
    let mut history: BTreeMap<String, Vec<(String, Option<u64>)>> = BTreeMap::new();
    let mut conversations: BTreeMap<String, Vec<Value>> =
        (0..100).map(|s| (format!("ha-{s}"), Vec::new())).collect();
    let mut drained = None;
    let mut retried = 0usize;
    let mut forks: Vec<(String, String)> = Vec::new();
    for round in 0..8 {
        match round {
            // A drain in the middle: the drained worker's sessions move on their next step.
            3 => {
                let name = "w0".to_owned();
                for r in &routers {
                    let resp = admin
                        .post(format!("{r}/admin/v1/workers/{name}/drain"))
                        .send()
                        .await
                        .unwrap();
                    assert!(resp.status().is_success());
                }
                drained = Some(name);
            }
            // The directory leader dies (kill -9).
            4 => {
                let c = reqwest::Client::builder()
                    .default_headers(common::cluster_secret_headers())
                    .build()
                    .unwrap();
                let leader = common::linearizable::leader_index(&c, &ha.nodes.urls())
                    .await
                    .unwrap();
                ha.nodes.kill(leader + 1);
            }
            // A router stops for 10 s (SIGSTOP): clients move to the other one.
            6 => ha.routers[1].signal("-STOP"),
            _ => {}
        }
        let mut batch = tokio::task::JoinSet::new();
        for (s, (session, messages)) in conversations.iter_mut().enumerate() {
            messages.push(json!({"role": "user", "content": format!("step {round} of {session}: {}", "more context ".repeat(40))}));
            let (http, routers, session, messages) = (
                http.clone(),
                routers.clone(),
                session.clone(),
                messages.clone(),
            );
            let first = (s * 7 + round * 3) % 2;
            batch.spawn(async move {
                // The client retries on the other router when one does not answer.
                let mut tries = 0;
                loop {
                    let router = &routers[(first + tries) % 2];
                    match step(&http, router, &session, &messages).await {
                        Ok(w) => return (session, w, tries),
                        Err(e) if tries < 6 => {
                            tries += 1;
                            let _ = e;
                        }
                        Err(e) => panic!("{session}: no router served the step: {e}"),
                    }
                }
            });
        }
        while let Some(done) = batch.join_next().await {
            let (session, worker, tries) = done.unwrap();
            retried += tries;
            history
                .entry(session.clone())
                .or_default()
                .push(worker.clone());
            conversations
                .get_mut(&session)
                .unwrap()
                .push(json!({"role": "assistant", "content": "ok"}));
        }
        if round == 5 {
            // Every tenth session forks (n = 2) through a random router; the child is
            // committed before the fork is dispatched.
            for s in (0..100).step_by(10) {
                let session = format!("ha-{s}");
                let child = format!("{session}-child");
                let messages = conversations[&session].clone();
                let router = &routers[s % 2];
                let (worker, _) = send(&http, router, &session, &messages, Some(&child))
                    .await
                    .unwrap_or_else(|e| panic!("fork of {session}: {e}"));
                forks.push((child, worker));
            }
        }
        if round == 6 {
            // The fault itself: the router stays stopped 10 s, past its sessions' leases.
            tokio::time::sleep(Duration::from_secs(10)).await;
            ha.routers[1].signal("-CONT");
        }
    }
    for r in &routers {
        let text = admin
            .get(format!("{r}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for l in text.lines().filter(|l| {
            l.starts_with("ownerserve_ownership_claims_total")
                || l.starts_with("ownerserve_plans_total")
                || l.starts_with("ownerserve_plan")
        }) {
            eprintln!("{r} {l}");
        }
        // Across the leader's death every ownership record was written in the end (a batch
        // the dying leader did not answer is tried again): none dropped.
        assert!(
            text.lines()
                .any(|l| l == "ownerserve_ownership_records_dropped_total 0"),
            "{r} dropped ownership records"
        );
    }
    // Each step ran under its session's owner as the directory recorded it: the same
    // epoch always on the same worker, epochs never going back, and a new epoch (a claim
    // committed before dispatch, or a migration's flip) for every change of worker. No step
    // reached the drained worker after the drain.
    let drained = drained.unwrap();
    let (mut moves, mut unowned) = (0, 0);
    for (session, steps) in &history {
        assert_eq!(steps.len(), 8, "{session}");
        let mut by_epoch: BTreeMap<u64, &str> = BTreeMap::new();
        for (i, (worker, epoch)) in steps.iter().enumerate() {
            // Only while the directory elects a new leader may a claim time out (the step
            // then runs where planned, unrecorded, rather than fail).
            let Some(epoch) = *epoch else {
                assert_eq!(i, 4, "{session} step {i} ran without an owner: {steps:?}");
                unowned += 1;
                continue;
            };
            let first = *by_epoch.entry(epoch).or_insert(worker);
            assert_eq!(
                first, worker,
                "{session}: epoch {epoch} on two workers: {steps:?}"
            );
            if let Some((previous, Some(before))) = i.checked_sub(1).map(|j| &steps[j]) {
                assert!(
                    epoch >= *before,
                    "{session}: the epoch went back: {steps:?}"
                );
                if previous != worker {
                    assert!(
                        epoch > *before,
                        "{session}: moved without a new epoch: {steps:?}"
                    );
                    moves += 1;
                }
            }
            if i >= 3 {
                assert_ne!(
                    *worker, drained,
                    "{session}: served by the drained worker: {steps:?}"
                );
            }
        }
    }
    // The directory agrees: where a session's epoch is its last step's, its owner is the
    // worker that served that step; its invariants hold (one owner per session and prefix).
    let d = state(&ha.nodes.urls()).await.unwrap();
    assert!(ownerserve_ownership::invariants::check(&d).is_empty());
    let mut demoted = 0;
    for (session, steps) in &history {
        let s = &d.sessions[&ownerserve_ownership::ids::SessionId(session.clone())];
        let (worker, epoch) = steps.last().unwrap();
        assert!(
            s.epoch.0 >= epoch.unwrap(),
            "{session}: the directory is behind its steps"
        );
        match s.owner {
            Some(owner) if s.epoch.0 == epoch.unwrap() => {
                assert_eq!(owner.worker.0, ids[worker], "{session}: {steps:?}");
            }
            Some(_) => {}
            None => demoted += 1,
        }
    }
    // Each fork's child was owned by the worker that served the fork, at the fork's epoch
    // (unless it was demoted or moved since: its epoch is then higher).
    let mut forks_owned = 0;
    for (child, worker) in &forks {
        let c = d
            .sessions
            .get(&ownerserve_ownership::ids::SessionId(child.clone()))
            .unwrap_or_else(|| panic!("fork child {child} not in the directory"));
        let parent = child.trim_end_matches("-child");
        assert_eq!(
            c.parent.as_ref().map(|p| p.0.as_str()),
            Some(parent),
            "{child}"
        );
        if let Some(owner) = c.owner.filter(|o| o.epoch == c.epoch) {
            assert_eq!(owner.worker.0, ids[worker], "{child}");
            forks_owned += 1;
        }
    }
    stop_replay.cancel();
    let replayed = replay.join_next().await.unwrap().unwrap();
    assert!(replayed.violations.is_empty(), "{:?}", replayed.violations);
    // Each session's first claim, each move (a new epoch) and each fork is an entry of its
    // own; ticks, leases and labels add more. (A fixed floor of 800, once written here,
    // was timing: 850-862 in most runs, 795 in one.)
    let writes = history.len() + moves + forks.len();
    assert!(
        replayed.entries >= writes,
        "only {} entries replayed for {writes} counted writes",
        replayed.entries
    );
    assert_eq!(replayed.snapshots, 0, "the replay missed entries");
    eprintln!(
        "committed log replayed: {} entries, invariants held after each, one worker per (session, epoch)",
        replayed.entries
    );
    // The workers' side: what each engine's fence accepted, against the log.
    let (violations, checked, overtaken) = audit_workers(&ha.worker_urls, &replayed).await;
    assert!(violations.is_empty(), "{violations:?}");
    // Every step served under an epoch reached its worker's fence; a client may also have
    // given up on one the worker still served (retried on the other router), so more may
    // be audited, never fewer. (A fixed floor of 800, once written here, failed at 792 in
    // a CI run: with more steps unowned during the election, fewer are fenced.)
    let fenced = history
        .values()
        .flatten()
        .filter(|(_, e)| e.is_some())
        .count();
    assert!(
        checked >= fenced,
        "only {checked} completions audited for {fenced} steps served under an epoch ({unowned} unowned)"
    );
    eprintln!("workers' accepted epochs: {checked} completions, each at an epoch the log gave that worker; {overtaken} accepted after a newer epoch was committed elsewhere (in flight across a move)");
    // Every router shows the same session, from its replica or through the leader.
    let probe = history.keys().next().unwrap();
    let mut seen = Vec::new();
    for r in &routers {
        for q in ["", "?linearizable=true"] {
            let v: Value = admin
                .get(format!("{r}/admin/v1/sessions/{probe}{q}"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert!(v["read_at_index"].as_u64().unwrap() > 0, "{v}");
            seen.push(v["owner"].clone());
        }
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    // How many of the election round's 100 steps find no leader depends on how long the
    // election takes on the machine: 0 in every run alone or beside three busy loops on
    // 2 cores; a CI run audited 792 of 810 completions (likely 18 unowned, all four
    // workers' lease renewals timing out) and failed the former bound of 10. Most of the
    // round must still be owned.
    assert!(unowned < 50, "{unowned} steps unowned during the election");
    eprintln!("800 steps served; {moves} moves, each under a new epoch; {unowned} steps unowned during the election; {demoted} sessions demoted (idle) at the end; {retried} retries on the other router; {} forks, {forks_owned} still owned by the worker that served them", forks.len());
}
