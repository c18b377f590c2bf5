//! The subscribing side: one ZMQ SUB socket per worker. Messages are applied in sequence
//! order. A jump in `seq`, a fall in `seq`, or the first message after (re)connecting makes
//! the subscriber resynchronise through the worker's ROUTER replay over a DEALER
//! (`[b"", start_seq]`, replies `[b"", seq, payload]` or, since vLLM #45177,
//! `[b"", topic, seq, payload]`, ending with `ff×8`).
//!
//! vLLM's stream carries no engine incarnation, and a restarted engine counts from 0 again,
//! so a new incarnation can look like a gap. The replay therefore starts at the last batch
//! we applied: if its bytes are what we applied, the rest is the gap; if not (or it is gone),
//! the engine is new, its blocks are forgotten and the replay rebuilds them. Every
//! (re)connection resyncs this way at once, so a new router learns the engine's existing
//! cache from the replay buffer. A reply with holes (a ROUTER drops what a slow reader
//! leaves queued) is asked for again from the hole. Malformed messages are counted and
//! skipped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use xxhash_rust::xxh3::xxh3_64;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::{KvEvent, StreamPosition};

use super::normalize::normalize;
use super::publisher::END_SEQ;
use super::wire::{decode_batch, decode_message, decode_seq, DecodeError, WireBatch};

/// Where normalised events go: the router's index, or a Redis Stream for other replicas.
pub trait EventSink: Send + Sync {
    /// Applies one batch of `worker`'s events, in order; returns how many the index
    /// refused (a block size or parent it cannot place; 0 where the sink cannot tell).
    fn apply(&self, worker: WorkerId, events: Vec<KvEvent>) -> usize;
    /// Forgets everything `worker` holds (its engine restarted).
    fn reset(&self, worker: WorkerId);
    /// Applies a batch as [`EventSink::apply`] does and records `at`, its place in
    /// `worker`'s stream, with it (under one lock: a copy of the index names the batch its
    /// holds end with). A sink that keeps no position only applies.
    fn apply_at(&self, worker: WorkerId, events: Vec<KvEvent>, at: StreamPosition) -> usize {
        let _ = at;
        self.apply(worker, events)
    }
    /// How far the sink has applied `worker`'s stream, if it keeps that: where a
    /// subscriber that starts resumes it (after a copy from a peer router, or a restart of
    /// the subscriber's task).
    fn position(&self, worker: WorkerId) -> Option<StreamPosition> {
        let _ = worker;
        None
    }
}

/// One worker's event source.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    pub worker: WorkerId,
    /// The worker's name in logs (its configured name; `new` sets its id).
    pub name: String,
    /// The worker's PUB endpoint (`tcp://host:port`).
    pub endpoint: String,
    /// The worker's replay ROUTER endpoint, if it has one.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (`""`: everything).
    pub topic: String,
    /// Tokens per block of the router's index.
    pub block_size: usize,
    /// Longest wait for a replay to finish.
    pub replay_timeout: Duration,
    /// Longest wait between reconnection attempts.
    pub max_backoff: Duration,
    /// Reconnect after this long without a message. The ZMQ crate does not report a
    /// publisher that went away, so an idle socket may be a dead one (a restarted engine
    /// binds a new socket); whatever is missed while reconnecting comes back as a gap.
    pub idle_reconnect: Duration,
    /// Replays run one at a time among the subscribers sharing this (a router's):
    /// [`replay_gate`].
    pub replay_gate: Option<Arc<Semaphore>>,
}

/// A gate that lets one replay run at a time among the subscribers given it. A replay
/// is held whole while it is applied (it is read as fast as it comes: a ROUTER drops
/// what a slower reader leaves queued), and a new router replays every worker at once:
/// with vLLM's 10,000-step buffers, tens of MB each, a router restarted an hour into the
/// soak came back at three times its peer's memory, and the heap a process reached stays
/// its resident size. Applying holds the index's lock anyway, so replays in turn take
/// about as long as replays at once.
pub fn replay_gate() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(1))
}

impl SubscriberConfig {
    /// A config with default timings.
    pub fn new(
        worker: WorkerId,
        endpoint: String,
        replay_endpoint: Option<String>,
        block_size: usize,
    ) -> Self {
        Self {
            worker,
            name: worker.to_string(),
            endpoint,
            replay_endpoint,
            topic: String::new(),
            block_size,
            replay_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(2),
            idle_reconnect: Duration::from_secs(3),
            replay_gate: None,
        }
    }

    /// The same config, its replays taking turns at `gate` ([`replay_gate`]).
    #[must_use]
    pub fn gated(self, gate: Arc<Semaphore>) -> Self {
        Self {
            replay_gate: Some(gate),
            ..self
        }
    }

    /// The same config, naming the worker `name` in logs.
    #[must_use]
    pub fn named(self, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..self
        }
    }
}

/// Counters a subscriber keeps (read by `/metrics`), and the one signal it takes.
#[derive(Debug, Default)]
pub struct SubscriberStats {
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub malformed: AtomicU64,
    pub gaps: AtomicU64,
    pub replayed_batches: AtomicU64,
    pub missing_history: AtomicU64,
    pub restarts: AtomicU64,
    /// Events the index refused (a block size unlike the engine's, an unknown parent).
    pub refused: AtomicU64,
    /// Set when the index forgot this worker's blocks (the router saw it go down): the
    /// subscriber then replays its engine's history from the start, so an engine that
    /// comes back without restarting gets its blocks back.
    pub forgotten: AtomicBool,
    /// When (Unix ms) the stream last lost, garbled or could not replay events, the index
    /// refused some, or its subscriber restarted (0: never): the index may be behind the
    /// engine since.
    pub last_trouble_ms: AtomicU64,
}

impl SubscriberStats {
    /// Counts a trouble in `counter` (one of these) and marks the stream troubled now.
    fn trouble(&self, counter: &AtomicU64) {
        bump(counter);
        self.mark_troubled();
    }

    fn mark_troubled(&self) {
        self.last_trouble_ms
            .store(crate::sim::state::unix_ms(), Ordering::Relaxed);
    }
}

/// A subscriber; its position (`last_seq`) survives reconnections and restarts of
/// [`Subscriber::run`].
pub struct Subscriber {
    cfg: SubscriberConfig,
    last_seq: Option<u64>,
    /// xxh3 of the last applied payload, to recognise it in a replay.
    last_payload: u64,
    pub stats: Arc<SubscriberStats>,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Subscriber {
    pub fn new(cfg: SubscriberConfig) -> Self {
        Self::with_stats(cfg, Arc::default())
    }

    /// A subscriber counting into existing `stats` (kept across restarts of the task).
    pub fn with_stats(cfg: SubscriberConfig, stats: Arc<SubscriberStats>) -> Self {
        Self {
            cfg,
            last_seq: None,
            last_payload: 0,
            stats,
        }
    }

    /// Sequence number of the last batch applied.
    pub fn last_seq(&self) -> Option<u64> {
        self.last_seq
    }

    /// Receives and applies events until `cancel` fires, reconnecting with capped backoff.
    pub async fn run(&mut self, sink: &dyn EventSink, cancel: &CancellationToken) {
        if self.last_seq.is_none() {
            if let Some(at) = sink.position(self.cfg.worker) {
                self.last_seq = Some(at.seq);
                self.last_payload = at.payload;
            }
        }
        let mut backoff = Duration::from_millis(50);
        while !cancel.is_cancelled() {
            let mut socket = SubSocket::new();
            let connected = async {
                socket.connect(&self.cfg.endpoint).await?;
                socket.subscribe(&self.cfg.topic).await
            };
            match tokio::time::timeout(Duration::from_secs(5), connected).await {
                Ok(Ok(())) => {
                    backoff = Duration::from_millis(50);
                    // Catch up at once: history a new router has never seen, or what was
                    // published while this socket was down (or by a new engine).
                    self.rewind_if_forgotten();
                    // A replay waits its turn and then up to its timeout: a stop must not
                    // wait behind every worker's.
                    if self.cfg.replay_endpoint.is_some() {
                        tokio::select! {
                            _ = self.resync(sink) => {}
                            () = cancel.cancelled() => return,
                        }
                    }
                }
                Ok(Err(e)) => {
                    tracing::debug!(worker = %self.cfg.name, endpoint = %self.cfg.endpoint, error = %e, "kv events: connect failed");
                    if sleep_or_cancel(backoff, cancel).await {
                        return;
                    }
                    backoff = (backoff * 2).min(self.cfg.max_backoff);
                    continue;
                }
                Err(_) => continue,
            }
            loop {
                let msg = tokio::select! {
                    m = tokio::time::timeout(self.cfg.idle_reconnect, socket.recv()) => m,
                    () = cancel.cancelled() => return,
                };
                match msg {
                    Err(_idle) => break,
                    Ok(Ok(msg)) => tokio::select! {
                        // A gap in the sequence replays (`resync`), as above.
                        () = self.on_message(msg.into_vec(), sink) => {}
                        () = cancel.cancelled() => return,
                    },
                    Ok(Err(e)) => {
                        tracing::warn!(worker = %self.cfg.name, endpoint = %self.cfg.endpoint, error = %e, "kv events: socket failed, reconnecting");
                        break;
                    }
                }
            }
        }
    }

    /// Handles one PUB message: in order, after a gap, or after an engine restart.
    pub async fn on_message(&mut self, frames: Vec<Bytes>, sink: &dyn EventSink) {
        let msg = match decode_message(&frames) {
            Ok(m) => m,
            Err(e) => {
                self.stats.trouble(&self.stats.malformed);
                tracing::warn!(worker = %self.cfg.name, error = %e, "kv events: malformed message skipped");
                return;
            }
        };
        let payload = xxh3_64(frames[2].as_ref());
        if self.rewind_if_forgotten() {
            self.resync(sink).await;
        }
        let in_order = match self.last_seq {
            None => msg.seq == 0,
            Some(last) if msg.seq == last && payload == self.last_payload => return,
            Some(last) => msg.seq == last + 1,
        };
        if !in_order {
            if self.last_seq.is_some_and(|l| msg.seq > l + 1) {
                self.stats.trouble(&self.stats.gaps);
            }
            if !self.resync(sink).await && self.last_seq.is_some_and(|l| msg.seq <= l) {
                // No replay to tell us more: a falling sequence can only be a restart.
                self.restart(sink);
            }
        }
        self.apply(msg.seq, payload, msg.batch, sink);
    }

    /// Forgets the stream position if the index forgot this worker; true if it did.
    fn rewind_if_forgotten(&mut self) -> bool {
        let forgotten = self.stats.forgotten.swap(false, Ordering::Relaxed);
        if forgotten {
            self.last_seq = None;
        }
        forgotten
    }

    fn restart(&mut self, sink: &dyn EventSink) {
        self.stats.trouble(&self.stats.restarts);
        tracing::info!(worker = %self.cfg.name, "kv events: new engine incarnation, forgetting its old blocks");
        sink.reset(self.cfg.worker);
        self.last_seq = None;
    }

    fn apply(&mut self, seq: u64, payload: u64, batch: WireBatch, sink: &dyn EventSink) {
        if self.last_seq.is_some_and(|l| seq <= l) {
            return;
        }
        let mut events = Vec::with_capacity(batch.events.len());
        for ev in batch.events {
            match normalize(ev, self.cfg.block_size) {
                Ok(Some(e)) => events.push(e),
                Ok(None) => {}
                Err(e) => {
                    self.stats.trouble(&self.stats.malformed);
                    tracing::warn!(worker = %self.cfg.name, error = %e, "kv events: event skipped");
                }
            }
        }
        self.stats
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        bump(&self.stats.batches);
        let refused = sink.apply_at(self.cfg.worker, events, StreamPosition { seq, payload });
        if refused > 0 {
            self.stats
                .refused
                .fetch_add(refused as u64, Ordering::Relaxed);
            self.stats.mark_troubled();
        }
        self.last_seq = Some(seq);
        self.last_payload = payload;
    }

    /// Replays from the last applied batch and applies what follows it; returns false if
    /// no replay could be had.
    async fn resync(&mut self, sink: &dyn EventSink) -> bool {
        let Some(endpoint) = self.cfg.replay_endpoint.clone() else {
            self.stats.trouble(&self.stats.missing_history);
            tracing::warn!(worker = %self.cfg.name, "kv events: out of sequence and no replay endpoint");
            return false;
        };
        let _turn = match &self.cfg.replay_gate {
            Some(gate) => gate.clone().acquire_owned().await.ok(),
            None => None,
        };
        let deadline = Instant::now() + self.cfg.replay_timeout;
        let start = self.last_seq.unwrap_or(0);
        let replay = match fetch_replay(&endpoint, start, deadline).await {
            Ok(r) if r.answered() => r,
            Ok(_) => {
                self.stats.trouble(&self.stats.missing_history);
                tracing::warn!(worker = %self.cfg.name, "kv events: replay timed out");
                return false;
            }
            Err(e) => {
                self.stats.trouble(&self.stats.missing_history);
                tracing::warn!(worker = %self.cfg.name, error = %e, "kv events: replay failed");
                return false;
            }
        };
        let first = replay.batches.first().map(|b| (b.seq, b.payload));
        match (self.last_seq, first) {
            // The batch we applied last is still there, unchanged: same engine.
            (Some(last), Some((seq, payload))) if seq == last && payload == self.last_payload => {}
            // Nothing published yet, or the whole history from the start.
            (None, None | Some((0, _))) => {}
            // Our last batch is gone or different: a new engine (or one whose buffer no
            // longer reaches back to us). Start over from what it has.
            (Some(_), _) => {
                self.restart(sink);
                if first.is_some_and(|(seq, _)| seq > 0) {
                    self.stats.trouble(&self.stats.missing_history);
                }
            }
            (None, Some(_)) => {
                self.stats.trouble(&self.stats.missing_history);
            }
        }
        self.apply_replays(replay, &endpoint, deadline, sink).await;
        true
    }

    /// Applies a replay's batches in sequence order. A ROUTER drops what it cannot queue
    /// for a slow reader (vLLM's replay ROUTER keeps ZMQ's default high-water mark, 1,000
    /// messages), from the middle of a reply and its end marker alike; applied as it came,
    /// such a reply left blocks out of the index while the stream looked in order. So
    /// what arrives is kept by sequence number, applied as far as it runs without a hole,
    /// and asked for again from the first hole (each reply resends everything from there,
    /// and fills what earlier ones dropped) until a reply ends with nothing missing, the
    /// deadline passes or [`MAX_REPLAY_ROUNDS`] requests were made.
    async fn apply_replays(
        &mut self,
        replay: Replay,
        endpoint: &str,
        deadline: Instant,
        sink: &dyn EventSink,
    ) {
        let mut pending = BTreeMap::new();
        let mut ended = self.absorb(replay, &mut pending);
        // A later reply that starts past the hole it was asked for: the engine's buffer
        // moved on, and the batches from its start are applied across the hole.
        let mut skip_to = None;
        for round in 1.. {
            while let Some(entry) = pending.first_entry() {
                let seq = *entry.key();
                let next = self.last_seq.map(|l| l.saturating_add(1));
                if next.is_some_and(|n| seq < n) {
                    entry.remove();
                    continue;
                }
                if next.is_some_and(|n| seq > n) && skip_to != Some(seq) {
                    break;
                }
                let b: ReplayedBatch = entry.remove();
                bump(&self.stats.replayed_batches);
                // A bad batch is applied empty, so that its place in the sequence is not a
                // hole.
                let batch = b.decode().unwrap_or_else(|_| {
                    self.stats.trouble(&self.stats.malformed);
                    WireBatch::default()
                });
                self.apply(b.seq, b.payload, batch, sink);
            }
            if ended && pending.is_empty() {
                return;
            }
            let next = self.last_seq.map_or(0, |l| l.saturating_add(1));
            let fetched = if round < MAX_REPLAY_ROUNDS && Instant::now() < deadline {
                fetch_replay(endpoint, next, deadline).await.ok()
            } else {
                None
            };
            let Some(again) = fetched.filter(Replay::answered) else {
                self.stats.trouble(&self.stats.missing_history);
                tracing::warn!(worker = %self.cfg.name, from = next, "kv events: replay incomplete; batches from here on may be missing");
                return;
            };
            skip_to = again.batches.first().map(|b| b.seq).filter(|&s| s > next);
            if skip_to.is_some() {
                // The engine's buffer moved on past the hole while we asked.
                self.stats.trouble(&self.stats.missing_history);
            }
            ended = self.absorb(again, &mut pending);
        }
    }

    /// Keeps a reply's batches by sequence number; returns whether it ended.
    fn absorb(&self, replay: Replay, pending: &mut BTreeMap<u64, ReplayedBatch>) -> bool {
        self.stats
            .malformed
            .fetch_add(replay.malformed, Ordering::Relaxed);
        for b in replay.batches {
            pending.insert(b.seq, b);
        }
        replay.ended
    }
}

/// Most replay requests one resync makes (the first and the ones that fill holes).
const MAX_REPLAY_ROUNDS: u32 = 8;

/// How long a replay's reply may pause before it is taken to have ended without its end
/// marker (which the ROUTER may have dropped). The publishers send a reply in one burst.
const REPLAY_PAUSE: Duration = Duration::from_millis(300);

/// One batch of a replay, as it came: decoded when it is applied, so a replay's batches
/// are held at their wire size (msgpack) rather than decoded, and each decoded batch
/// lives only while it is applied. A new router replays every worker's buffer at once
/// (vLLM keeps 10,000 steps, each naming its blocks' tokens), hundreds of MB decoded an
/// hour into a run, and the heap a process reached stays its resident size.
#[derive(Debug, Clone)]
pub struct ReplayedBatch {
    pub seq: u64,
    /// xxh3 of the payload bytes.
    pub payload: u64,
    /// The payload bytes.
    pub raw: Bytes,
}

impl ReplayedBatch {
    /// The batch the payload holds.
    pub fn decode(&self) -> Result<WireBatch, DecodeError> {
        decode_batch(&self.raw)
    }
}

/// What one replay request brought back, in the order it came.
#[derive(Debug, Default)]
pub struct Replay {
    pub batches: Vec<ReplayedBatch>,
    /// The end marker came: the publisher sent everything it held from the start asked
    /// for (though a ROUTER may still have dropped some of it: see the sequence numbers).
    pub ended: bool,
    /// Frames whose sequence number did not decode (dropped; a batch that does not
    /// decode is applied empty, see [`ReplayedBatch::decode`]).
    pub malformed: u64,
}

impl Replay {
    /// The publisher answered: its end marker came, or at least one batch did.
    pub fn answered(&self) -> bool {
        self.ended || !self.batches.is_empty()
    }
}

/// Why a replay did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("zmq: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    #[error("malformed replay reply with {0} frames")]
    Frames(usize),
    #[error("no connection before the replay's deadline")]
    Connect,
    /// The zeromq crate panicked on what the replay peer sent (its DEALER leaves every
    /// frame but a message unimplemented, and its codec panics on some malformed frames).
    #[error("the replay socket failed on what its peer sent: {0}")]
    Peer(String),
}

/// Fetches buffered batches from `start` on over a DEALER socket, until the end marker,
/// a 300 ms pause after the first reply, or `deadline`. The frames are kept
/// as they come and decoded after: a reader slower than the publisher loses messages.
/// The socket runs in a task of its own: a panic of the zeromq crate on what the peer
/// sent (`ReplayError::Peer`) fails this replay, not its caller (the subscriber then
/// counts the history as missing and goes on).
pub async fn fetch_replay(
    endpoint: &str,
    start: u64,
    deadline: Instant,
) -> Result<Replay, ReplayError> {
    let mut task = tokio::task::JoinSet::new();
    let endpoint = endpoint.to_owned();
    task.spawn(async move { fetch_replay_on_socket(&endpoint, start, deadline).await });
    match task.join_next().await {
        Some(Ok(replay)) => replay,
        Some(Err(e)) => Err(ReplayError::Peer(e.to_string())),
        None => Err(ReplayError::Connect),
    }
}

async fn fetch_replay_on_socket(
    endpoint: &str,
    start: u64,
    deadline: Instant,
) -> Result<Replay, ReplayError> {
    let mut dealer = DealerSocket::new();
    tokio::time::timeout_at(deadline, dealer.connect(endpoint))
        .await
        .map_err(|_| ReplayError::Connect)??;
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(request).map_err(|_| ReplayError::Frames(0))?)
        .await?;
    let mut raw = Vec::new();
    let mut ended = false;
    loop {
        let wait = if raw.is_empty() {
            deadline
        } else {
            deadline.min(Instant::now() + REPLAY_PAUSE)
        };
        let Ok(message) = tokio::time::timeout_at(wait, dealer.recv()).await else {
            break;
        };
        let frames = message?.into_vec();
        // [b"", seq, payload] (vLLM before #45177, SGLang) or [b"", topic, seq, payload].
        let (seq, payload) = match frames.as_slice() {
            [_, seq, payload] | [_, _, seq, payload] => (seq.clone(), payload.clone()),
            other => return Err(ReplayError::Frames(other.len())),
        };
        if seq.as_ref() == END_SEQ {
            ended = true;
            break;
        }
        raw.push((seq, payload));
    }
    let mut malformed = 0;
    let mut batches = Vec::with_capacity(raw.len());
    for (seq, payload) in raw {
        let Ok(seq) = decode_seq(&seq) else {
            malformed += 1;
            continue;
        };
        batches.push(ReplayedBatch {
            seq,
            payload: xxh3_64(&payload),
            raw: payload,
        });
    }
    Ok(Replay {
        batches,
        ended,
        malformed,
    })
}

/// Sleeps, or returns true at once if cancelled.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => false,
        () = cancel.cancelled() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A replay peer that speaks ZMTP 3.0 up to its READY, then sends a PING command:
    /// the zeromq crate's DEALER leaves every frame but a message unimplemented (it panics).
    async fn pinging_peer() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut greeting = [0u8; 64];
            greeting[0] = 0xff;
            greeting[9] = 0x7f;
            greeting[10] = 3;
            greeting[12..16].copy_from_slice(b"NULL");
            let mut ready = vec![0x04, 28, 5];
            ready.extend_from_slice(b"READY");
            ready.push(11);
            ready.extend_from_slice(b"Socket-Type");
            ready.extend_from_slice(&6u32.to_be_bytes());
            ready.extend_from_slice(b"ROUTER");
            s.write_all(&greeting).await.unwrap();
            s.write_all(&ready).await.unwrap();
            // The DEALER's greeting, READY and request.
            let mut seen = vec![0u8; 256];
            let _ = tokio::time::timeout(Duration::from_millis(300), s.read(&mut seen)).await;
            let mut ping = vec![0x04, 7, 4];
            ping.extend_from_slice(b"PING");
            ping.extend_from_slice(&[0, 0]);
            s.write_all(&ping).await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        // The peer lives as long as the test's runtime.
        std::mem::forget(tasks);
        format!("tcp://{addr}")
    }

    #[tokio::test]
    async fn a_replay_peer_that_breaks_the_zmq_crate_fails_the_replay_not_the_caller() {
        let endpoint = pinging_peer().await;
        let deadline = Instant::now() + Duration::from_secs(3);
        let r = fetch_replay(&endpoint, 0, deadline).await;
        assert!(matches!(r, Err(ReplayError::Peer(_))), "{r:?}");
    }
}
