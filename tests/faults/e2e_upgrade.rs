//! A rolling upgrade from the previous release, run by `scripts/upgrade_check.sh` (which
//! builds that release and names its binary in `OWNERSERVE_PREVIOUS_BIN`): a 3-node
//! directory cluster and a router of the previous release, under a steady stream of
//! writes, are replaced by this build's, the router first (a new router reads an old
//! cluster), then the directory nodes one by one, followers first and the leader last,
//! each caught up and then under load for ten rounds of claims before the next; the
//! directory's version is raised once all run this build. Then this build's leader is restarted once more (a roll from this release on).
//!
//! Counted: every acknowledged write, the directory's own (new sessions claimed on two
//! leases, `(client, seq)` retried through the elections) and the router's (chat steps
//! answered with the worker and epoch they ran under; its policy, `colocated`, keeps a
//! session on its live owner, so an owner that changes is one the roll changed). Checked
//! at the end, reading the directory linearizably: no acknowledged write lost, and every
//! session that existed before the roll kept its owner or moved under a newer epoch. And
//! the rules: a lease that lapses while the cluster is mixed ends its session on every
//! node (version 1), one that lapses after the raise leaves its session waiting for its
//! worker (version 2 and later; the raise goes to this build's `Version::CURRENT`).
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::common::linearizable::{directory_state, http, leader_index, write_within};
use crate::common::{self, ownerserve_exe, temp_config, DirectoryNodes, Proc, MODEL};

/// New sessions the directory writer claims per round; sessions stepped through the router.
const CLAIMS_PER_ROUND: usize = 8;
const ROUTED_SESSIONS: usize = 16;

/// What the load saw acknowledged, per session: the last (worker, epoch).
#[derive(Default)]
struct Acked {
    direct: BTreeMap<String, (u32, u64)>,
    routed: BTreeMap<String, (u32, u64)>,
    routed_steps: usize,
    /// Steps not acknowledged (no answer while the router restarted, or run unrecorded
    /// while the directory elected a leader): not counted, not expected to be there.
    unanswered: usize,
    /// The longest wait between two acknowledged claims of the directory writer.
    longest_gap: Duration,
}

fn claim(session: &str, lease: u64) -> Value {
    json!({"SetDecodeOwner": {"session": session, "lease": lease, "prefix": null,
        "tail_tokens": 10, "predicted_tool_gap_ms": null, "expect_epoch": null}})
}

/// The directory writer: claims new sessions round after round, alternating between the
/// two leases, and keeps both leases alive.
async fn direct_load(
    urls: Vec<String>,
    leases: [(u32, u64); 2],
    acked: Arc<Mutex<Acked>>,
    stop: CancellationToken,
) {
    let c = http();
    let mut seq = 0u64;
    let mut renewed = Instant::now();
    let mut last_ack = Instant::now();
    for round in 0usize.. {
        if renewed.elapsed() > Duration::from_secs(1) {
            for (_, lease) in leases {
                seq += 1;
                let renew = json!({"KeepAlive": {"lease": lease}});
                write_within(&c, &urls, (100, seq), renew, Duration::from_secs(20)).await;
            }
            renewed = Instant::now();
        }
        for s in 0..CLAIMS_PER_ROUND {
            if stop.is_cancelled() {
                return;
            }
            let session = format!("direct-{round}-{s}");
            let (worker, lease) = leases[s % 2];
            seq += 1;
            let out = write_within(
                &c,
                &urls,
                (100, seq),
                claim(&session, lease),
                Duration::from_secs(20),
            )
            .await;
            let mut a = acked.lock().unwrap();
            let epoch = out.as_ref().and_then(|o| o["Owned"]["epoch"].as_u64());
            // Retried with its (client, seq) through every election for 20 s: always
            // answered, and never refused (the sessions are new).
            let epoch = epoch.unwrap_or_else(|| panic!("{session}: {out:?}"));
            a.direct.insert(session, (worker, epoch));
            a.longest_gap = a.longest_gap.max(last_ack.elapsed());
            last_ack = Instant::now();
        }
    }
}

/// Chat steps of the routed sessions, round after round, through whichever router runs.
async fn routed_load(
    router: Arc<Mutex<String>>,
    acked: Arc<Mutex<Acked>>,
    stop: CancellationToken,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    for round in 0usize.. {
        for s in 0..ROUTED_SESSIONS {
            if stop.is_cancelled() {
                return;
            }
            let session = format!("routed-{s}");
            let messages: Vec<Value> = (0..=round % 8)
                .map(|r| json!({"role": "user", "content": format!("step {r} of {session}: {}", "context ".repeat(20))}))
                .collect();
            let url = router.lock().unwrap().clone();
            let sent = http
                .post(format!("{url}/v1/chat/completions"))
                .header("x-session-id", &session)
                .json(&json!({"model": MODEL, "messages": messages, "max_tokens": 4}))
                .send()
                .await;
            let answered = sent.ok().filter(|r| r.status().is_success()).and_then(|r| {
                let header = |name: &str| {
                    r.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let worker = header("x-ownerserve-worker")?;
                let epoch = header("x-ownerserve-epoch")?.parse::<u64>().ok()?;
                Some((worker.trim_start_matches('w').parse::<u32>().ok()?, epoch))
            });
            let answered = {
                let mut a = acked.lock().unwrap();
                match answered {
                    Some(owned) => {
                        a.routed_steps += 1;
                        a.routed.insert(session, owned);
                        true
                    }
                    None => {
                        a.unanswered += 1;
                        false
                    }
                }
            };
            if !answered {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Node `i`'s `/directory/v1/cluster`, if it answers.
async fn cluster(c: &reqwest::Client, url: &str) -> Option<Value> {
    c.get(format!("{url}/directory/v1/cluster"))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Waits until every node has applied what the leader had applied when asked.
async fn caught_up(c: &reqwest::Client, nodes: &DirectoryNodes) {
    let urls = nodes.urls();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut goal = None;
    while Instant::now() < deadline {
        if goal.is_none() {
            if let Some(leader) = leader_index(c, &urls).await {
                goal = cluster(c, &urls[leader])
                    .await
                    .and_then(|v| v["last_applied"].as_u64());
            }
        }
        if let Some(goal) = goal {
            let mut all = true;
            for url in &urls {
                let applied = cluster(c, url)
                    .await
                    .and_then(|v| v["last_applied"].as_u64());
                all &= applied.is_some_and(|a| a >= goal);
            }
            if all {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the nodes did not catch up in 30 s (goal {goal:?})");
}

/// Whether the node at `url` holds `session` in its own applied state (the snapshot
/// that opens its watch stream), not the leader's.
async fn holds_locally(c: &reqwest::Client, url: &str, session: &str) -> bool {
    let mut resp = c
        .get(format!("{url}/directory/v1/watch?after=0"))
        .send()
        .await
        .unwrap();
    let mut line = Vec::new();
    while !line.contains(&b'\n') {
        line.extend_from_slice(&resp.chunk().await.unwrap().expect("a snapshot line"));
    }
    let end = line.iter().position(|&b| b == b'\n').unwrap();
    let first: Value = serde_json::from_slice(&line[..end]).unwrap();
    first["snapshot"]["sessions"].get(session).is_some()
}

/// A session claimed under a 1 s lease of `worker` that nothing renews, checked on every
/// node right after a `Tick` ended that lease: at directory version 1 the session ends
/// with it, at version 2 it waits, unowned, for its worker (for three TTLs; the lease
/// grace rule). Whether each node still holds it says which rules that node applied.
async fn lapse_probe(c: &reqwest::Client, nodes: &DirectoryNodes, worker: u32) -> Vec<bool> {
    let urls = nodes.urls();
    let session = format!("lapsing-{worker}");
    let grant = json!({"GrantLease": {"worker": worker, "ttl_ms": 1_000}});
    let seq = u64::from(worker) * 2;
    let granted = write_within(c, &urls, (98, seq), grant, Duration::from_secs(20))
        .await
        .unwrap();
    let lease = granted["LeaseGranted"]["lease"].as_u64().unwrap();
    let claimed = write_within(
        c,
        &urls,
        (98, seq + 1),
        claim(&session, lease),
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    assert!(claimed["Owned"].is_object(), "{claimed}");
    common::eventually(Duration::from_secs(20), "the probe's lease ended", || {
        let (c, urls) = (c.clone(), urls.clone());
        async move {
            let d = directory_state(&c, &urls).await.unwrap();
            !d.leases
                .contains_key(&ownerserve_ownership::ids::LeaseId(lease))
        }
    })
    .await;
    caught_up(c, nodes).await;
    let mut held = Vec::new();
    for url in &urls {
        held.push(holds_locally(c, url, &session).await);
    }
    held
}

/// The router's replica follows the cluster.
async fn replica_synced(url: &str) {
    let admin = reqwest::Client::new();
    common::eventually(
        Duration::from_secs(20),
        "the router's replica synced",
        || {
            let (admin, url) = (admin.clone(), url.to_owned());
            async move {
                let v: Value = match admin
                    .get(format!("{url}/admin/v1/cluster"))
                    .bearer_auth(common::ADMIN_TOKEN)
                    .send()
                    .await
                {
                    Ok(r) => r.json().await.unwrap_or_default(),
                    Err(_) => return false,
                };
                v["replica"]["synced"] == json!(true) && v["replica"]["connected"] == json!(true)
            }
        },
    )
    .await;
}

fn owners(d: &ownerserve_ownership::Directory) -> BTreeMap<String, (Option<u32>, u64)> {
    d.sessions
        .iter()
        .map(|(id, s)| (id.0.clone(), (s.owner.map(|o| o.worker.0), s.epoch.0)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the previous release's binary: scripts/upgrade_check.sh"]
async fn a_rolling_upgrade_from_the_previous_release_loses_no_acknowledged_write() {
    let previous = std::env::var("OWNERSERVE_PREVIOUS_BIN").expect(
        "OWNERSERVE_PREVIOUS_BIN: the previous release's ownerserve (scripts/upgrade_check.sh)",
    );
    let from = std::env::var("OWNERSERVE_PREVIOUS_RELEASE").unwrap_or(previous.clone());
    let current = ownerserve_exe();
    let started = Instant::now();
    let mut nodes = DirectoryNodes::planned(3, "upgrade", &["--tick-ms", "200"], "127.0.0.1");
    for i in 1..=3 {
        nodes.run_exe(i, &previous);
    }
    nodes.start_all();
    let c = http();
    let urls = nodes.urls();
    let release = |v: Option<Value>| v.map_or(Value::Null, |v| v["release"].clone());
    assert_eq!(
        release(cluster(&c, &urls[0]).await),
        Value::Null,
        "node 1 runs a release before 0.2.0 (none says its release)"
    );
    // Two leases of the directory writer's own (workers 100 and 101, not the router's).
    let mut leases = [(100u32, 0u64), (101, 0)];
    for (i, (worker, lease)) in leases.iter_mut().enumerate() {
        let grant = json!({"GrantLease": {"worker": *worker, "ttl_ms": 120_000}});
        let out = write_within(
            &c,
            &urls,
            (99, i as u64 + 1),
            grant,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        *lease = out["LeaseGranted"]["lease"].as_u64().unwrap();
    }
    let (_workers, _ports, workers_toml) = common::sim_worker_fleet(2, &["--time-scale", "20"]);
    let config = temp_config(
        "upgrade-router.toml",
        &format!(
            "[router]\nport = 0\npolicy = \"colocated\"\n{}worker_lease_ttl_ms = 6000\nhealth_interval_ms = 200\n\n{workers_toml}",
            common::remote_directory_keys(&nodes)
        ),
    );
    let router_args = ["router", "--config", config.as_str()];
    let marker = "ownerserve router listening on";
    let mut router = Proc::spawn_exe(&previous, &router_args, &[], marker);
    replica_synced(&router.url).await;

    let acked = Arc::new(Mutex::new(Acked::default()));
    let router_url = Arc::new(Mutex::new(router.url.clone()));
    let stop = CancellationToken::new();
    let mut load = tokio::task::JoinSet::new();
    load.spawn(direct_load(
        urls.clone(),
        leases,
        acked.clone(),
        stop.clone(),
    ));
    load.spawn(routed_load(router_url.clone(), acked.clone(), stop.clone()));
    let written = |n: usize| {
        let a = acked.lock().unwrap();
        let done = a.direct.len() >= n && a.routed.len() == ROUTED_SESSIONS;
        async move { done }
    };
    common::eventually(Duration::from_secs(30), "the load under way", || {
        written(4 * CLAIMS_PER_ROUND)
    })
    .await;
    let before = owners(&directory_state(&c, &urls).await.unwrap());
    let version_before = directory_state(&c, &urls).await.unwrap().version;
    let rolled = Instant::now();

    // The router first: a new router reads the old cluster.
    router.signal("-TERM");
    let _ = router.child.wait();
    router = Proc::spawn_exe(&current, &router_args, &[], marker);
    *router_url.lock().unwrap() = router.url.clone();
    replica_synced(&router.url).await;
    // Then the directory: followers first, the leader last, each caught up before the
    // next. A 0.1.0 node followed by a router does not exit on SIGTERM until its drain
    // (30 s) ends, unreachable but still the leader meanwhile: after 2 s it is killed,
    // which the directory survives like any crash (acknowledged entries are fsynced).
    let leader = leader_index(&c, &urls).await.unwrap() + 1;
    let order: Vec<usize> = (1..=3).filter(|&i| i != leader).chain([leader]).collect();
    let mut stops = Vec::new();
    let mut mixed_probe = None;
    for (step, &i) in order.iter().enumerate() {
        let (took, killed) = nodes.stop(i, Duration::from_secs(2));
        stops.push(format!(
            "{:.2} s{}",
            took.as_secs_f64(),
            if killed { " (killed)" } else { "" }
        ));
        nodes.run_exe(i, &current);
        nodes.restart(i);
        caught_up(&c, &nodes).await;
        // A lease lapses while the cluster is mixed (an old leader, new and old followers):
        // every node must apply the old rules.
        if step == 0 {
            mixed_probe = Some(lapse_probe(&c, &nodes, 102).await);
        }
        // The mixed cluster under load for a while (ten rounds of claims) before the next.
        let claimed = acked.lock().unwrap().direct.len();
        common::eventually(
            Duration::from_secs(30),
            "writes to the mixed cluster",
            || written(claimed + 10 * CLAIMS_PER_ROUND),
        )
        .await;
        assert_eq!(
            release(cluster(&c, &nodes.url(i)).await),
            json!(env!("CARGO_PKG_VERSION")),
            "node {i} runs this build"
        );
    }
    // Every member runs this build: the leader raises the directory's version.
    common::eventually(
        Duration::from_secs(20),
        "the directory version raised",
        || {
            let (c, urls) = (c.clone(), urls.clone());
            async move {
                let mut all = true;
                for url in &urls {
                    let runs = cluster(&c, url).await.map(|v| v["version"]["runs"].clone());
                    all &= runs == Some(json!(ownerserve_ownership::version::Version::CURRENT.0));
                }
                all
            }
        },
    )
    .await;
    let roll = rolled.elapsed();
    // And one at the new version, by the new rules.
    let new_probe = lapse_probe(&c, &nodes, 103).await;
    // From this release on a node exits at once on SIGTERM (its watch streams end): the
    // leader restarted once more, without being killed.
    let leader = leader_index(&c, &urls).await.unwrap() + 1;
    let (current_stop, killed) = nodes.stop(leader, Duration::from_secs(10));
    assert!(
        !killed,
        "this build's leader did not exit within 10 s of SIGTERM"
    );
    nodes.restart(leader);
    caught_up(&c, &nodes).await;
    // A few more rounds at the new version, then the tally.
    let claimed = acked.lock().unwrap().direct.len();
    common::eventually(Duration::from_secs(30), "writes at the new version", || {
        written(claimed + 4 * CLAIMS_PER_ROUND)
    })
    .await;
    stop.cancel();
    while load.join_next().await.is_some() {}
    let d = directory_state(&c, &urls).await.unwrap();
    let after = owners(&d);
    let a = acked.lock().unwrap();
    // An acknowledged write is lost if the directory does not hold it. The writer's
    // sessions are written by nobody else (their leases live throughout): each holds
    // exactly the owner and epoch of its claim. A routed session holds its last step's
    // epoch and worker, or a newer epoch.
    let mut lost = Vec::new();
    for (session, (worker, epoch)) in &a.direct {
        if after.get(session) != Some(&(Some(*worker), *epoch)) {
            lost.push(format!(
                "{session}: acked {worker}@{epoch}, now {:?}",
                after.get(session)
            ));
        }
    }
    for (session, (worker, epoch)) in &a.routed {
        match after.get(session) {
            Some((owner, now)) if *now > *epoch || (*now == *epoch && *owner == Some(*worker)) => {}
            other => lost.push(format!("{session}: acked {worker}@{epoch}, now {other:?}")),
        }
    }
    // Across the roll every session kept its owner, or moved under a newer epoch.
    let (mut kept, mut moved, mut bad) = (0, 0, Vec::new());
    for (session, (owner, epoch)) in &before {
        match after.get(session) {
            Some((now, _)) if now == owner => kept += 1,
            Some((_, now_epoch)) if now_epoch > epoch => moved += 1,
            other => bad.push(format!("{session}: {owner:?}@{epoch} became {other:?}")),
        }
    }
    eprintln!(
        "upgrade {from} -> {}: {} writes acknowledged ({} session claims, longest wait between two {:.2} s; {} routed steps, {} not acknowledged during the restarts), {} lost; {} sessions before the roll: {kept} kept their owner, {moved} moved under a newer epoch, {} otherwise; directory version {} -> {}; roll {:.1} s (previous release's nodes stopped in {}; this build's leader in {:.2} s), run {:.1} s",
        env!("CARGO_PKG_VERSION"),
        a.direct.len() + a.routed_steps,
        a.direct.len(),
        a.longest_gap.as_secs_f64(),
        a.routed_steps,
        a.unanswered,
        lost.len(),
        before.len(),
        bad.len(),
        version_before,
        d.version,
        roll.as_secs_f64(),
        stops.join(", "),
        current_stop.as_secs_f64(),
        started.elapsed().as_secs_f64(),
    );
    // The lease that lapsed in the mixed cluster ended its session on every node, old and
    // new (0.1.0's rule: a node applying the grace rule would still hold it, unowned); the
    // one at the new version left its session waiting for its worker on every node.
    assert_eq!(
        mixed_probe,
        Some(vec![false; 3]),
        "nodes holding the session of the lease lapsed while mixed"
    );
    assert_eq!(
        new_probe,
        vec![true; 3],
        "nodes holding the session of the lease lapsed at version 2"
    );
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(bad.is_empty(), "sessions that lost their owner: {bad:?}");
    assert!(before.len() >= ROUTED_SESSIONS + 4 * CLAIMS_PER_ROUND);
}
