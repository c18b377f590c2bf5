//! A router restarted mid-traffic (the production topology of `e2e_ha`: a 3-node directory
//! cluster, two routers, four workers): its replica of the directory is synced again
//! within seconds of the new process starting, and no session changes owner, neither
//! while it is down (the other router serves) nor after (it adopts the workers' shared
//! leases and reads the owners from its replica). The routers' policy is `colocated`, which
//! keeps a session on its live owner: the planner's own moves for load (`ownerserve`'s)
//! would blur what the restart did.
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::e2e_ha::{admin, state, step, worker_ids, Ha};

const SESSIONS: usize = 40;

/// Each session's owner (worker id) and epoch in the directory.
async fn owners(ha: &Ha) -> BTreeMap<String, (u32, u64)> {
    let d = state(&ha.nodes.urls()).await.unwrap();
    d.sessions
        .iter()
        .filter_map(|(id, s)| Some((id.0.clone(), (s.owner?.worker.0, s.epoch.0))))
        .collect()
}

fn messages(session: &str, round: usize) -> Vec<Value> {
    (0..=round)
        .map(|r| json!({"role": "user", "content": format!("step {r} of {session}: {}", "context ".repeat(30))}))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_router_restarted_mid_traffic_resyncs_in_seconds_and_no_session_changes_owner() {
    let mut ha = Ha::start_with_policy("restart", "colocated", "");
    ha.ready().await;
    let ids = worker_ids();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let sessions: Vec<String> = (0..SESSIONS).map(|s| format!("restart-{s}")).collect();
    // Every session gets its owner, half through each router.
    for (s, session) in sessions.iter().enumerate() {
        let router = &ha.routers[s % 2].url;
        step(&http, router, session, &messages(session, 0))
            .await
            .unwrap();
    }
    let before = owners(&ha).await;
    assert_eq!(before.len(), SESSIONS, "{before:?}");
    // Traffic through the other router for the whole restart: each step served by its
    // session's owner.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut traffic = tokio::task::JoinSet::new();
    {
        let (http, router, sessions, stop) = (
            http.clone(),
            ha.routers[0].url.clone(),
            sessions.clone(),
            stop.clone(),
        );
        traffic.spawn(async move {
            let mut served = Vec::new();
            for round in 1.. {
                for session in &sessions {
                    if stop.is_cancelled() {
                        return served;
                    }
                    let (worker, epoch) = step(&http, &router, session, &messages(session, round))
                        .await
                        .unwrap_or_else(|e| panic!("{session}: {e}"));
                    served.push((session.clone(), worker, epoch));
                }
            }
            served
        });
    }
    let asked = Instant::now();
    ha.restart_router(1);
    let started = Instant::now();
    // The new process's replica: synced (read the cluster's state) and connected.
    let cluster = format!("{}/admin/v1/cluster", ha.routers[1].url);
    let admin = admin();
    loop {
        let v: Value = match admin.get(&cluster).send().await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => Value::Null,
        };
        if v["replica"]["synced"] == json!(true) && v["replica"]["connected"] == json!(true) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the restarted router's replica is not synced after 5 s: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let synced = started.elapsed();
    // Every session's next step through the restarted router goes to its owner.
    let restarted = ha.routers[1].url.clone();
    let mut after_restart = Vec::new();
    for session in &sessions {
        let (worker, epoch) = step(&http, &restarted, session, &messages(session, 99))
            .await
            .unwrap_or_else(|e| panic!("{session} through the restarted router: {e}"));
        after_restart.push((session.clone(), worker, epoch));
    }
    stop.cancel();
    let served = traffic.join_next().await.unwrap().unwrap();
    let after = owners(&ha).await;
    for (session, worker, _) in &served {
        assert_eq!(
            ids[worker], before[session].0,
            "{session} served by {worker} during the restart"
        );
    }
    for (session, worker, epoch) in &after_restart {
        assert_eq!(
            (ids[worker], *epoch),
            (before[session].0, Some(before[session].1)),
            "{session} through the restarted router"
        );
    }
    assert_eq!(
        after, before,
        "owners and epochs changed across the restart"
    );
    eprintln!(
        "router restart: replica synced {:.2} s after the new process started ({:.2} s after SIGTERM); {} steps served meanwhile by the other router, {SESSIONS} through the restarted one; {SESSIONS} sessions, 0 owners changed",
        synced.as_secs_f64(),
        (started - asked + synced).as_secs_f64(),
        served.len()
    );
}
