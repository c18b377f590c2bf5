//! KV events end to end: a real `sim-worker` process publishing on ZMQ, checked with real
//! libzmq (pyzmq) and msgspec, and consumed by our subscriber into the KV index.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{chat_body, client, eventually, Proc, MODEL};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_shim::kv_events::shared_index::SharedIndex;
use ownerserve_shim::kv_events::subscriber::{Subscriber, SubscriberConfig};
use tokio_util::sync::CancellationToken;

async fn send(url: &str, text: &str) {
    let resp = client()
        .post(format!("{url}/v1/chat/completions"))
        .json(&chat_body(text, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

fn prompt(i: usize) -> String {
    (0..100).map(|w| format!("request{i} word{w} ")).collect()
}

/// Runs a subscriber into `index` until `cancel`; returns it so it can run again.
fn spawn_subscriber(
    mut sub: Subscriber,
    index: Arc<SharedIndex>,
    cancel: CancellationToken,
) -> tokio::task::JoinHandle<Subscriber> {
    tokio_util::task::TaskTracker::new().spawn(async move {
        sub.run(index.as_ref(), &cancel).await;
        sub
    })
}

fn config(events: &str, replay: &str) -> SubscriberConfig {
    let mut cfg =
        SubscriberConfig::new(WorkerId(0), events.to_owned(), Some(replay.to_owned()), 16);
    cfg.idle_reconnect = Duration::from_millis(500);
    cfg
}

#[test]
fn real_libzmq_and_msgspec_read_our_events_and_replays() {
    let (w, events, replay) = Proc::sim_worker_with_events(&["--instant"]);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/kv_events_pyzmq_check.py"
    );
    let out = std::process::Command::new("python3")
        .args([script, &w.url, &events, &replay, MODEL])
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pyzmq/msgspec check failed (pip install pyzmq msgspec)\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_killed_subscriber_socket_catches_up_by_replay() {
    let (w, events, replay) = Proc::sim_worker_with_events(&["--instant"]);
    let reference = Arc::new(SharedIndex::new(KvIndexConfig::default()));
    let resumed = Arc::new(SharedIndex::new(KvIndexConfig::default()));
    let ref_cancel = CancellationToken::new();
    let ref_task = spawn_subscriber(
        Subscriber::new(config(&events, &replay)),
        reference.clone(),
        ref_cancel.clone(),
    );
    let cancel = CancellationToken::new();
    let task = spawn_subscriber(
        Subscriber::new(config(&events, &replay)),
        resumed.clone(),
        cancel.clone(),
    );

    for i in 0..3 {
        send(&w.url, &prompt(i)).await;
    }
    let r = resumed.clone();
    eventually(Duration::from_secs(10), "first batches indexed", || {
        let r = r.clone();
        async move { r.lock().len() >= 3 * 30 }
    })
    .await;

    // Kill the socket mid-stream: batches published now are never delivered to it.
    cancel.cancel();
    let sub = task.await.unwrap();
    let seen = sub.last_seq().unwrap();
    for i in 3..8 {
        send(&w.url, &prompt(i)).await;
    }
    // A new socket for the same subscriber: the next live batch reveals the gap.
    let cancel = CancellationToken::new();
    let task = spawn_subscriber(sub, resumed.clone(), cancel.clone());
    // Time for the SUB socket to connect and subscribe (ZMQ's slow joiner): nothing shows
    // it but a batch arriving, and a batch published before it would be dropped.
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&w.url, &prompt(8)).await;

    let (a, b) = (reference.clone(), resumed.clone());
    eventually(Duration::from_secs(10), "both indexes agree", || {
        let (a, b) = (a.clone(), b.clone());
        async move {
            let (da, db) = (a.lock().dump(), b.lock().dump());
            !da.is_empty() && da == db
        }
    })
    .await;
    cancel.cancel();
    ref_cancel.cancel();
    let sub = task.await.unwrap();
    ref_task.await.unwrap();
    // The reconnecting socket resyncs through the replay endpoint: the 5+ batches it
    // missed come back by replay, not from the live stream.
    let replayed = sub.stats.replayed_batches.load(Ordering::Relaxed);
    assert!(replayed >= 5, "missed batches were replayed: {replayed}");
    assert!(sub.last_seq().unwrap() > seen + 5);
    assert_eq!(sub.stats.missing_history.load(Ordering::Relaxed), 0);
    assert_eq!(sub.stats.malformed.load(Ordering::Relaxed), 0);
    // 9 distinct prompts of well over 30 blocks each.
    assert!(resumed.lock().len() >= 9 * 30);
}

#[tokio::test]
async fn an_engine_restart_forgets_the_old_cache() {
    // Fixed ports so the restarted worker publishes where the subscriber listens.
    let port = |_| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (ep, rp) = (
        format!("tcp://127.0.0.1:{}", port(0)),
        format!("tcp://127.0.0.1:{}", port(1)),
    );
    let args = [
        "--instant",
        "--kv-events-endpoint",
        &ep,
        "--kv-replay-endpoint",
        &rp,
    ];
    let mut w = Proc::sim_worker(&args);
    let index = Arc::new(SharedIndex::new(KvIndexConfig::default()));
    let cancel = CancellationToken::new();
    let sub = Subscriber::new(config(&ep, &rp));
    let stats = sub.stats.clone();
    let task = spawn_subscriber(sub, index.clone(), cancel.clone());
    // Time for the SUB socket to subscribe (ZMQ's slow joiner; nothing else shows it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    send(&w.url, &prompt(0)).await;
    send(&w.url, &prompt(1)).await;
    let ix = index.clone();
    eventually(Duration::from_secs(10), "old cache indexed", || {
        let ix = ix.clone();
        async move { matched_blocks(&ix, &prompt(0)) > 30 }
    })
    .await;

    w.kill();
    let w2 = Proc::sim_worker_on(w.url.rsplit(':').next().unwrap(), &args);
    let (ix, url) = (index.clone(), w2.url.clone());
    let mut i = 2;
    eventually(Duration::from_secs(15), "restart detected", || {
        let (ix, url) = (ix.clone(), url.clone());
        i += 1;
        let stats = stats.clone();
        async move {
            // Keep the new engine publishing until the subscriber has reconnected.
            send(&url, &prompt(i)).await;
            stats.restarts.load(Ordering::Relaxed) >= 1 && matched_blocks(&ix, &prompt(i)) > 30
        }
    })
    .await;
    cancel.cancel();
    task.await.unwrap();
    assert_eq!(
        matched_blocks(&index, &prompt(0)),
        0,
        "the old engine's blocks are gone"
    );
}

/// Blocks of a chat prompt's chain that worker 0 holds, per the index.
fn matched_blocks(index: &SharedIndex, text: &str) -> u32 {
    let body = serde_json::to_vec(&chat_body(text, 2)).unwrap();
    let req =
        ownerserve_shim::openai::parse(&body, ownerserve_shim::openai::Endpoint::ChatCompletions)
            .unwrap();
    let tokens = req.prompt_tokens().remove(0);
    let hashes =
        ownerserve_planner::hash::prompt_hashes(&tokens, 16, ownerserve_planner::hash::XXH3_SEED);
    let mut out = Vec::new();
    index
        .lock()
        .find_matches(&hashes, &mut Default::default(), &mut out);
    out.first().map_or(0, |m| m.gpu_blocks)
}

/// The router's count of `worker`'s blocks in its KV index.
async fn router_blocks(router: &str) -> u64 {
    let kv = common::get_json(&format!("{router}/admin/v1/kv")).await;
    kv["workers"][0]["blocks"].as_u64().unwrap()
}

#[tokio::test]
async fn a_worker_marked_down_leaves_the_index_and_its_blocks_return_by_replay() {
    let (w, events, replay) = Proc::sim_worker_with_events(&["--instant"]);
    let cfg = common::temp_config(
        "down-and-back.toml",
        "[router]\nhealth_interval_ms = 200\nhealth_timeout_ms = 300\nhealth_failure_threshold = 1\n",
    );
    let worker = format!("{},kv_events={events},kv_replay={replay}", w.url);
    let router = Proc::router(&[worker], &["--config", &cfg]);
    for i in 0..3 {
        send(&router.url, &prompt(i)).await;
    }
    let url = router.url.clone();
    eventually(
        Duration::from_secs(10),
        "the prompts' blocks indexed",
        || {
            let url = url.clone();
            async move { router_blocks(&url).await > 60 }
        },
    )
    .await;
    let held = router_blocks(&router.url).await;

    // The engine stops answering (SIGSTOP: a hung host, cache intact): marked down, its
    // blocks leave the index, so nothing is routed to KV no one can reach.
    w.signal("-STOP");
    eventually(
        Duration::from_secs(10),
        "the down worker's blocks dropped",
        || {
            let url = url.clone();
            async move { router_blocks(&url).await == 0 }
        },
    )
    .await;
    // Back: the subscriber replays the engine's history and the same blocks return.
    w.signal("-CONT");
    eventually(Duration::from_secs(15), "the blocks back by replay", || {
        let url = url.clone();
        async move { router_blocks(&url).await == held }
    })
    .await;
    let kv = common::get_json(&format!("{}/admin/v1/kv", router.url)).await;
    assert!(
        kv["workers"][0]["events"]["replayed_batches"]
            .as_u64()
            .unwrap()
            > 0,
        "{kv}"
    );
}

/// The router's `/admin/v1/kv` view of its one worker.
async fn worker_kv(router: &str) -> serde_json::Value {
    common::get_json(&format!("{router}/admin/v1/kv")).await["workers"][0].clone()
}

/// Waits until `router`'s index of its worker has not changed for half a second; returns
/// that worker's digest.
async fn settled_digest(router: &str) -> String {
    let mut last = String::new();
    let mut same = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while std::time::Instant::now() < deadline {
        let d = worker_kv(router).await["digest"]
            .as_str()
            .unwrap()
            .to_owned();
        same = if d == last { same + 1 } else { 0 };
        if same >= 5 {
            return d;
        }
        last = d;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{router}'s index did not settle");
}

/// A router started beside a long-running engine (a rolling upgrade) copies a peer router's
/// index (`router.kv.peers`): it knows the chains stored before the engine's replay buffer
/// begins, and takes the blocks the engine later stores under them, as the peer does. A
/// router without the copy misses those chains and refuses what is stored under them.
#[tokio::test]
async fn a_new_router_copies_a_peers_index_from_before_the_engines_replay_buffer() {
    // The engine keeps its last 4 event batches for replay.
    let (w, events, replay) =
        Proc::sim_worker_with_events(&["--instant", "--kv-events-buffer-steps", "4"]);
    let worker = format!("{},kv_events={events},kv_replay={replay}", w.url);
    let peer = Proc::router(std::slice::from_ref(&worker), &[]);
    for i in 0..12 {
        send(&peer.url, &prompt(i)).await;
    }
    let before = settled_digest(&peer.url).await;
    // The first peer listed is down: the next one is asked.
    let down = format!("http://127.0.0.1:{}", common::free_port());
    let cfg = common::temp_config(
        "kv-peers.toml",
        &format!("[router.kv]\npeers = [\"{down}\", \"{}\"]\n", peer.url),
    );
    let copied = Proc::router(std::slice::from_ref(&worker), &["--config", &cfg]);
    let alone = Proc::router(std::slice::from_ref(&worker), &[]);
    assert_eq!(settled_digest(&copied.url).await, before);
    let kv = worker_kv(&copied.url).await;
    assert_eq!(kv["copied_from"]["peer"], peer.url.as_str(), "{kv}");
    // The copy stands for the events before it, though none came since.
    assert_eq!(kv["index"], "exact", "{kv}");
    assert_eq!(kv["blocks"], worker_kv(&peer.url).await["blocks"], "{kv}");
    // The replay alone reaches back 4 batches, not 12 prompts.
    let kv_alone = worker_kv(&alone.url).await;
    assert!(
        kv_alone["blocks"].as_u64().unwrap() < kv["blocks"].as_u64().unwrap(),
        "{kv_alone} against {kv}"
    );

    // The first prompt's session goes on (sent to the engine itself): its new blocks chain
    // under blocks stored long before the replay buffer's first batch.
    send(
        &w.url,
        &format!(
            "{} and then some more words to fill new blocks {}",
            prompt(0),
            prompt(99)
        ),
    )
    .await;
    let after = settled_digest(&peer.url).await;
    assert_ne!(after, before);
    eventually(
        Duration::from_secs(10),
        "the copy follows the engine",
        || {
            let (url, after) = (copied.url.clone(), after.clone());
            async move { worker_kv(&url).await["digest"] == after.as_str() }
        },
    )
    .await;
    let rejected = |r: &str| {
        let r = r.to_owned();
        async move {
            common::get_json(&format!("{r}/admin/v1/kv")).await["stats"]["events_rejected"]
                .as_u64()
                .unwrap()
        }
    };
    assert_eq!(rejected(&copied.url).await, 0);
    eventually(
        Duration::from_secs(10),
        "the router without the copy refuses the new blocks",
        || {
            let f = rejected(&alone.url);
            async move { f.await > 0 }
        },
    )
    .await;
}
