//! Linearizability of the replicated directory under faults. Three clients issue random
//! claims, fenced releases and linearizable reads on a set of keys while a driver kills
//! leaders (kill -9, then restart) and partitions nodes through the test-only fault layer;
//! every operation's invocation and response times are recorded. Linearizability is local
//! (a history is linearizable iff each object's is), so each key's history is checked on
//! its own with stateright's `LinearizabilityTester` against a sequential model of the
//! directory (`common::linearizable`, shared with the chaos runs).

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::linearizable::*;
use common::{DirectoryNodes, ADMIN_TOKEN};
use serde_json::json;

// ---------------------------------------------------------------------------------------
// The checker.

fn ev(client: usize, op: Op, ret: Option<Ret>, invoke_ms: u64, response_ms: u64) -> Event {
    Event {
        client,
        key: 1,
        op,
        ret: ret.map(|r| (r, Duration::from_millis(response_ms))),
        invoke: Duration::from_millis(invoke_ms),
    }
}

#[test]
fn the_checker_accepts_linearizable_and_rejects_broken_histories() {
    use Op::*;
    // Two overlapping claims: either order is fine, and the loser sees the winner.
    let ok = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 5),
        ev(1, Claim { lease: 2 }, Some(Ret::Held(1)), 1, 6),
        ev(0, Release { epoch: 10 }, Some(Ret::Released), 7, 8),
        ev(1, Claim { lease: 2 }, Some(Ret::Owned(20)), 9, 10),
        ev(2, Read, Some(Ret::Read(Some(2), 20)), 11, 12),
    ];
    assert!(linearizable(&ok));
    // Two owners at once, with no release between: not linearizable.
    let split_brain = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 1),
        ev(1, Claim { lease: 2 }, Some(Ret::Owned(20)), 2, 3),
    ];
    assert!(!linearizable(&split_brain));
    // A stale read after a newer write completed.
    let stale_read = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 1),
        ev(1, Read, Some(Ret::Read(None, 0)), 2, 3),
    ];
    assert!(!linearizable(&stale_read));
    // The same read while the claim is still running is fine.
    let concurrent_read = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 4),
        ev(1, Read, Some(Ret::Read(None, 0)), 2, 3),
    ];
    assert!(linearizable(&concurrent_read));
    // A key reported unknown after it was claimed.
    let forgotten = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 1),
        ev(1, Release { epoch: 3 }, Some(Ret::Unknown), 2, 3),
    ];
    assert!(!linearizable(&forgotten));
    // A release that reports success with a wrong epoch.
    let bad_release = [
        ev(0, Claim { lease: 1 }, Some(Ret::Owned(10)), 0, 1),
        ev(0, Release { epoch: 9 }, Some(Ret::Released), 2, 3),
    ];
    assert!(!linearizable(&bad_release));
    // A claim that never got a response may have taken effect (a later read sees it) or
    // not (another client then wins the key), but not both.
    let lost_claim_applied = [
        ev(0, Claim { lease: 1 }, None, 0, 0),
        ev(1, Read, Some(Ret::Read(Some(1), 10)), 5, 6),
    ];
    assert!(linearizable(&lost_claim_applied));
    let lost_claim_not_applied = [
        ev(0, Claim { lease: 1 }, None, 0, 0),
        ev(1, Claim { lease: 2 }, Some(Ret::Owned(20)), 5, 6),
    ];
    assert!(linearizable(&lost_claim_not_applied));
    let lost_claim_both = [
        ev(0, Claim { lease: 1 }, None, 0, 0),
        ev(1, Read, Some(Ret::Read(Some(1), 10)), 5, 6),
        ev(2, Claim { lease: 2 }, Some(Ret::Owned(20)), 7, 8),
    ];
    assert!(!linearizable(&lost_claim_both));
}

// ---------------------------------------------------------------------------------------
// The fault run.

const NODES: usize = 3;
/// Keys the clients work on: few enough that claims contend, enough that each key's
/// history stays short for the tester's search.
const KEYS: u64 = 16;

async fn partition(c: &reqwest::Client, urls: &[String], victim: Option<usize>) {
    for (i, url) in urls.iter().enumerate() {
        let blocked: Vec<u64> = match victim {
            None => vec![],
            Some(v) if v == i => (1..=NODES as u64)
                .filter(|id| *id != v as u64 + 1)
                .collect(),
            Some(v) => vec![v as u64 + 1],
        };
        let _ = c
            .post(format!("{url}/test/v1/partition"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"blocked": blocked}))
            .send()
            .await;
    }
}

#[tokio::test]
async fn histories_under_leader_kills_and_partitions_are_linearizable() {
    let mut nodes = DirectoryNodes::start(NODES, "lin", &["--fault-injection", "--tick-ms", "500"]);
    let urls = nodes.urls();
    let c = http();
    let mut leases = Vec::new();
    for w in 0..3u64 {
        let out = write(
            &c,
            &urls,
            100,
            w + 1,
            json!({"GrantLease": {"worker": w, "ttl_ms": 600_000}}),
        )
        .await
        .unwrap();
        leases.push(out["LeaseGranted"]["lease"].as_u64().unwrap());
    }

    let origin = Instant::now();
    let history = Arc::new(Mutex::new(Vec::<Event>::new()));
    let run_for = Duration::from_secs(10);
    // The clients run until the faults are done: at least `run_for` and at least three faults,
    // however slow a loaded machine makes each fault.
    let done = Arc::new(AtomicBool::new(false));
    let mut clients = tokio::task::JoinSet::new();
    for (n, &lease) in leases.iter().enumerate() {
        let (urls, history, done) = (urls.clone(), history.clone(), done.clone());
        clients.spawn(async move {
            let c = http();
            let mut rng = 0x9E37_79B9_7F4A_7C15u64.wrapping_mul(n as u64 + 1);
            let mut known = [0u64; KEYS as usize + 1];
            let mut seq = 0;
            while !done.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let key = 1 + rng % KEYS;
                let invoke = origin.elapsed();
                let (op, ret) = match (rng >> 8) % 3 {
                    0 => {
                        seq += 1;
                        let cmd = json!({"Claim": {"key": key, "lease": lease, "spec": {"parent": null, "blocks": [0, 1], "kv_type": "t", "size_bytes": 1}, "expect_epoch": null}});
                        let ret = write(&c, &urls, n as u64, seq, cmd).await.map(|out| ret_of(&out));
                        if let Some(Ret::Owned(e)) = ret {
                            known[key as usize] = e;
                        }
                        (Op::Claim { lease }, ret)
                    }
                    1 => {
                        seq += 1;
                        let epoch = known[key as usize];
                        let cmd = json!({"Release": {"key": key, "epoch": epoch}});
                        let ret = write(&c, &urls, n as u64, seq, cmd).await.map(|out| ret_of(&out));
                        (Op::Release { epoch }, ret)
                    }
                    _ => (Op::Read, read(&c, &urls, key).await),
                };
                let ret = ret.map(|r| (r, origin.elapsed()));
                history.lock().unwrap().push(Event { client: n, key, op, ret, invoke });
                if ret.is_none() {
                    // Gave up: the operation stays in flight to the end of the history.
                    break;
                }
            }
        });
    }

    // Faults while the clients run.
    let mut faults = 0;
    let mut rng = 7u64;
    while (origin.elapsed() < run_for || faults < 3) && origin.elapsed() < run_for * 4 {
        // The fault schedule: a fault every ~second while the clients run.
        tokio::time::sleep(Duration::from_millis(900)).await;
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1);
        // A kill needs a known leader; without one (an election under way) the round
        // partitions instead.
        let leader = match (rng >> 33) % 3 {
            0 => leader_index(&c, &urls).await,
            _ => None,
        };
        match (leader, (rng >> 33) % 3) {
            (Some(i), _) => {
                // Kill -9 whoever leads, then bring it back.
                nodes.kill(i + 1);
                // Down for 1.2 s (the fault's length), past an election timeout.
                tokio::time::sleep(Duration::from_millis(1200)).await;
                nodes.restart(i + 1);
                faults += 1;
            }
            (None, 0 | 1) => {
                let victim = ((rng >> 40) % NODES as u64) as usize;
                partition(&c, &urls, Some(victim)).await;
                // Cut off for 1.5 s (the fault's length).
                tokio::time::sleep(Duration::from_millis(1500)).await;
                partition(&c, &urls, None).await;
                faults += 1;
            }
            _ => {}
        }
    }
    partition(&c, &urls, None).await;
    done.store(true, Ordering::Relaxed);
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }
    let history = history.lock().unwrap().clone();
    let writes = history.iter().filter(|e| !matches!(e.op, Op::Read)).count();
    let lost = history.iter().filter(|e| e.ret.is_none()).count();
    println!(
        "{} operations ({writes} writes, {lost} without a response) on {KEYS} keys, {faults} faults injected",
        history.len()
    );
    assert!(faults >= 3, "faults injected: {faults}");
    assert!(
        history.len() >= 30,
        "operations recorded: {}",
        history.len()
    );
    // stateright's search recurses once per operation; give it room.
    let checker = std::thread::Builder::new().stack_size(256 << 20);
    let checked = checker
        .spawn(move || {
            for key in 1..=KEYS {
                let h: Vec<Event> = history.iter().filter(|e| e.key == key).cloned().collect();
                assert!(linearizable(&h), "key {key} is not linearizable:\n{h:#?}");
            }
        })
        .unwrap();
    checked.join().unwrap();
}
