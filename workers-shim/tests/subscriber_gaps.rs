//! The subscriber's sequence handling against a real publisher (ZMQ sockets on loopback):
//! a gap in the live stream is filled by replay; a falling sequence with different bytes is
//! a new engine.
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::sync::atomic::Ordering;

use bytes::Bytes;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::KvIndexConfig;
use ownerserve_shim::kv_events::publisher::Publisher;
use ownerserve_shim::kv_events::shared_index::SharedIndex;
use ownerserve_shim::kv_events::subscriber::{Subscriber, SubscriberConfig};
use ownerserve_shim::kv_events::wire::{encode_batch, Encoding, WireBatch, WireEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Batch `i` stores one 16-token block chained under batch `i - 1`'s block.
fn batch(i: u64) -> WireBatch {
    WireBatch {
        ts: i as f64,
        events: vec![WireEvent::BlockStored {
            block_hashes: vec![1000 + i],
            parent_block_hash: i.checked_sub(1).map(|p| 1000 + p),
            token_ids: (0..16).map(|t| (i * 16 + t) as u32).collect(),
            block_size: 16,
            lora_name: None,
            extra_keys: None,
            medium: Some("GPU".into()),
            group_idx: None,
            kv_cache_spec_kind: None,
        }],
        dp_rank: Some(0),
    }
}

fn frames(seq: u64, b: &WireBatch) -> Vec<Bytes> {
    vec![
        Bytes::new(),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::from(encode_batch(b, Encoding::Map)),
    ]
}

/// A publisher (with a replay socket) that has published batches `0..n`.
struct Serving {
    endpoint: String,
    replay: Option<String>,
    /// The publisher's input, kept open while it serves.
    _tx: mpsc::UnboundedSender<WireBatch>,
    cancel: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
}

impl Serving {
    async fn stop(self) {
        self.cancel.cancel();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

async fn serving(n: u64) -> Serving {
    let publisher = Publisher::bind(
        "tcp://127.0.0.1:0",
        Some("tcp://127.0.0.1:0"),
        Encoding::Map,
        "",
        100,
    )
    .await
    .unwrap();
    let replay = publisher.replay_endpoint.clone();
    let endpoint = publisher.endpoint.clone();
    let (tx, rx) = mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let tasks = tokio_util::task::TaskTracker::new();
    tasks.spawn(publisher.run(rx, cancel.clone()));
    for i in 0..n {
        tx.send(batch(i)).unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    Serving {
        endpoint,
        replay,
        _tx: tx,
        cancel,
        tasks,
    }
}

#[tokio::test]
async fn a_gap_in_the_live_stream_is_replayed_and_a_new_engine_is_detected() {
    let srv = serving(6).await;
    let (endpoint, replay) = (srv.endpoint.clone(), srv.replay.clone());

    let index = SharedIndex::new(KvIndexConfig::default());
    let mut sub = Subscriber::new(SubscriberConfig::new(WorkerId(0), endpoint, replay, 16));
    sub.on_message(frames(0, &batch(0)), &index).await;
    sub.on_message(frames(1, &batch(1)), &index).await;
    // Batches 2..4 never arrive live.
    sub.on_message(frames(5, &batch(5)), &index).await;
    assert_eq!(sub.last_seq(), Some(5));
    assert_eq!(sub.stats.gaps.load(Ordering::Relaxed), 1);
    assert!(sub.stats.replayed_batches.load(Ordering::Relaxed) >= 3);
    assert_eq!(
        index.lock().len(),
        6,
        "the whole chain, through the replayed middle"
    );
    assert_eq!(sub.stats.restarts.load(Ordering::Relaxed), 0);

    // A duplicate is ignored. A stray old sequence number while the engine's replay still
    // vouches for our last batch is ignored too (a real restart replaces the publisher).
    sub.on_message(frames(5, &batch(5)), &index).await;
    sub.on_message(frames(0, &batch(0)), &index).await;
    assert_eq!(sub.stats.batches.load(Ordering::Relaxed), 6);
    assert_eq!(sub.stats.restarts.load(Ordering::Relaxed), 0);
    srv.stop().await;
}

#[tokio::test]
async fn without_a_replay_endpoint_a_falling_sequence_is_a_restart() {
    let index = SharedIndex::new(KvIndexConfig::default());
    let mut sub = Subscriber::new(SubscriberConfig::new(
        WorkerId(0),
        "tcp://127.0.0.1:1".into(),
        None,
        16,
    ));
    for i in 0..3 {
        sub.on_message(frames(i, &batch(i)), &index).await;
    }
    assert_eq!(index.lock().len(), 3);
    let mut new_engine = batch(0);
    new_engine.ts = 7.0;
    sub.on_message(frames(0, &new_engine), &index).await;
    assert_eq!(sub.stats.restarts.load(Ordering::Relaxed), 1);
    assert_eq!(sub.last_seq(), Some(0));
    assert_eq!(index.lock().len(), 1, "the old engine's blocks are gone");
    // A gap with nowhere to replay from is counted as missing history.
    sub.on_message(frames(4, &batch(8)), &index).await;
    assert_eq!(sub.stats.gaps.load(Ordering::Relaxed), 1);
    assert!(sub.stats.missing_history.load(Ordering::Relaxed) >= 1);
    // Garbage is counted and skipped.
    sub.on_message(vec![Bytes::from_static(b"x")], &index).await;
    assert_eq!(sub.stats.malformed.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn replay_replies_with_a_topic_frame_are_accepted() {
    use ownerserve_shim::kv_events::publisher::END_SEQ;
    use ownerserve_shim::kv_events::subscriber::fetch_replay;
    use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

    // A ROUTER answering like vLLM after #45177: [identity, b"", topic, seq, payload].
    let mut router = RouterSocket::new();
    let endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let tasks = tokio_util::task::TaskTracker::new();
    let server = tasks.spawn(async move {
        let request = router.recv().await.unwrap().into_vec();
        let (identity, start) = (request[0].clone(), request[2].clone());
        assert_eq!(start.as_ref(), 3u64.to_be_bytes());
        for seq in 3..5u64 {
            let payload = Bytes::from(encode_batch(&batch(seq), Encoding::Array));
            let reply = vec![
                identity.clone(),
                Bytes::new(),
                Bytes::from_static(b"kv@pod@model"),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ];
            router
                .send(ZmqMessage::try_from(reply).unwrap())
                .await
                .unwrap();
        }
        let end = vec![
            identity,
            Bytes::new(),
            Bytes::from_static(b"kv@pod@model"),
            Bytes::from_static(&END_SEQ),
            Bytes::new(),
        ];
        router
            .send(ZmqMessage::try_from(end).unwrap())
            .await
            .unwrap();
    });
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    let replayed = fetch_replay(&endpoint, 3, deadline).await.unwrap();
    assert!(replayed.ended);
    assert_eq!(
        replayed.batches.iter().map(|b| b.seq).collect::<Vec<_>>(),
        vec![3, 4]
    );
    assert_eq!(replayed.batches[1].decode().unwrap(), batch(4));
    server.await.unwrap();
}

/// A ROUTER that answers each replay request with the next scripted reply: the sequence
/// numbers it sends and whether its end marker gets through. vLLM's replay ROUTER drops
/// what a slow reader leaves queued past ZMQ's high-water mark, holes and end marker
/// alike; this plays such replies back on purpose. Returns the endpoint and the starts it
/// was asked for.
async fn lossy_replay_router(
    replies: Vec<(Vec<u64>, bool)>,
) -> (String, tokio::task::JoinHandle<Vec<u64>>) {
    use ownerserve_shim::kv_events::publisher::END_SEQ;
    use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

    let mut router = RouterSocket::new();
    let endpoint = router.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
    let tasks = tokio_util::task::TaskTracker::new();
    let server = tasks.spawn(async move {
        let mut starts = Vec::new();
        for (seqs, end) in replies {
            let request = router.recv().await.unwrap().into_vec();
            let start: [u8; 8] = request[2].as_ref().try_into().unwrap();
            starts.push(u64::from_be_bytes(start));
            let identity = request[0].clone();
            let reply = |seq: Bytes, payload: Bytes| {
                let frames = vec![identity.clone(), Bytes::new(), seq, payload];
                ZmqMessage::try_from(frames).unwrap()
            };
            for seq in seqs {
                let payload = Bytes::from(encode_batch(&batch(seq), Encoding::Array));
                let seq = Bytes::copy_from_slice(&seq.to_be_bytes());
                router.send(reply(seq, payload)).await.unwrap();
            }
            if end {
                let end = reply(Bytes::from_static(&END_SEQ), Bytes::new());
                router.send(end).await.unwrap();
            }
        }
        starts
    });
    (endpoint, server)
}

#[tokio::test]
async fn a_replay_with_holes_or_no_end_marker_is_asked_again_from_the_hole() {
    // Asked from 0: batches 4 and 5 are dropped. Asked from 4: the rest, but its end
    // marker is dropped. Asked from 9: nothing newer, and the end marker.
    let (endpoint, server) = lossy_replay_router(vec![
        (vec![0, 1, 2, 3, 6, 7, 8], true),
        (vec![4, 5, 6, 7, 8], false),
        (vec![], true),
    ])
    .await;
    let (sub, index) = first_live_batch_9(endpoint).await;
    assert_eq!(sub.last_seq(), Some(9));
    assert_eq!(index.lock().len(), 10, "every block, the dropped ones too");
    assert_eq!(sub.stats.replayed_batches.load(Ordering::Relaxed), 9);
    assert_eq!(sub.stats.missing_history.load(Ordering::Relaxed), 0);
    assert_eq!(sub.stats.restarts.load(Ordering::Relaxed), 0);
    assert_eq!(asked(server).await, vec![0, 4, 9]);
}

#[tokio::test]
async fn a_hole_the_engine_no_longer_holds_is_counted_as_missing_history() {
    // Batches 4 and 5 are gone from the engine's buffer: asked from 4, it starts at 6.
    let (endpoint, server) = lossy_replay_router(vec![
        (vec![0, 1, 2, 3, 6, 7, 8], true),
        (vec![6, 7, 8], true),
    ])
    .await;
    let (sub, index) = first_live_batch_9(endpoint).await;
    assert_eq!(sub.last_seq(), Some(9));
    assert_eq!(sub.stats.batches.load(Ordering::Relaxed), 8, "0-3 and 6-9");
    // 6-9 chain under the missing 5, so the index cannot place them.
    assert_eq!(index.lock().len(), 4);
    assert_eq!(sub.stats.missing_history.load(Ordering::Relaxed), 1);
    assert_eq!(asked(server).await, vec![0, 4]);
}

/// A new subscriber whose first live batch is 9, so it replays the history first.
async fn first_live_batch_9(replay: String) -> (Subscriber, SharedIndex) {
    let index = SharedIndex::new(KvIndexConfig::default());
    let cfg = SubscriberConfig::new(WorkerId(0), "tcp://127.0.0.1:1".into(), Some(replay), 16);
    let mut sub = Subscriber::new(cfg);
    sub.on_message(frames(9, &batch(9)), &index).await;
    (sub, index)
}

/// The starts the scripted ROUTER was asked for; fails if it still waits for a request.
async fn asked(server: tokio::task::JoinHandle<Vec<u64>>) -> Vec<u64> {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(5), server).await;
    waited
        .expect("the ROUTER got every request it scripted")
        .unwrap()
}

#[tokio::test]
async fn a_replay_waits_its_turn_at_the_gate_and_then_fills_the_gap() {
    let srv = serving(4).await;
    let (endpoint, replay) = (srv.endpoint.clone(), srv.replay.clone());

    let gate = ownerserve_shim::kv_events::subscriber::replay_gate();
    let held = gate.clone().acquire_owned().await.unwrap();
    let index = std::sync::Arc::new(SharedIndex::new(KvIndexConfig::default()));
    let cfg = SubscriberConfig::new(WorkerId(0), endpoint, replay, 16).gated(gate.clone());
    let (sub_index, done) = (index.clone(), CancellationToken::new());
    let finished = done.clone();
    let waiting = srv.tasks.spawn(async move {
        let mut sub = Subscriber::new(cfg);
        // Batch 3 with nothing before it: a gap, filled by a replay.
        sub.on_message(frames(3, &batch(3)), &*sub_index).await;
        finished.cancel();
        sub.stats.replayed_batches.load(Ordering::Relaxed)
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!done.is_cancelled(), "another replay holds the gate");
    assert_eq!(index.lock().len(), 0);
    drop(held);
    let replayed = waiting.await.unwrap();
    assert!(replayed >= 3, "{replayed}");
    assert_eq!(index.lock().len(), 4, "the whole chain once its turn came");
    srv.stop().await;
}

/// A stop does not wait for a replay: the engine's replay socket here accepts and never
/// answers, so the subscriber's catch-up after connecting would wait out its whole timeout.
#[tokio::test]
async fn a_stop_does_not_wait_for_a_replay_that_never_answers() {
    let srv = serving(2).await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replay = format!("tcp://{}", silent.local_addr().unwrap());
    // Dropped at the end, which aborts it.
    let mut peer = tokio::task::JoinSet::new();
    peer.spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            conns.push(c);
        }
    });
    let mut cfg = SubscriberConfig::new(WorkerId(0), srv.endpoint.clone(), Some(replay), 16);
    cfg.replay_timeout = std::time::Duration::from_secs(60);
    let index = SharedIndex::new(KvIndexConfig::default());
    let cancel = CancellationToken::new();
    let mut run = tokio::task::JoinSet::new();
    {
        let cancel = cancel.clone();
        run.spawn(async move { Subscriber::new(cfg).run(&index, &cancel).await });
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    cancel.cancel();
    tokio::time::timeout(std::time::Duration::from_secs(2), run.join_next())
        .await
        .expect("the subscriber stopped within 2 s of its cancel, mid-replay")
        .expect("the run was spawned")
        .unwrap();
    srv.stop().await;
}
