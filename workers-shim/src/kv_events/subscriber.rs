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
//! cache from the replay buffer. Malformed messages are counted and skipped.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use xxhash_rust::xxh3::xxh3_64;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::KvEvent;

use super::normalize::normalize;
use super::publisher::END_SEQ;
use super::wire::{decode_batch, decode_message, decode_seq, WireBatch};

/// Where normalised events go: the router's index, or a Redis Stream for other replicas.
pub trait EventSink: Send + Sync {
    /// Applies one batch of `worker`'s events, in order.
    fn apply(&self, worker: WorkerId, events: Vec<KvEvent>);
    /// Forgets everything `worker` holds (its engine restarted).
    fn reset(&self, worker: WorkerId);
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
    /// Set when the index forgot this worker's blocks (the router saw it go down): the
    /// subscriber then replays its engine's history from the start, so an engine that
    /// comes back without restarting gets its blocks back.
    pub forgotten: AtomicBool,
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
                    if self.cfg.replay_endpoint.is_some() {
                        self.resync(sink).await;
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
                    Ok(Ok(msg)) => self.on_message(msg.into_vec(), sink).await,
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
                bump(&self.stats.malformed);
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
                bump(&self.stats.gaps);
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
        bump(&self.stats.restarts);
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
                    bump(&self.stats.malformed);
                    tracing::warn!(worker = %self.cfg.name, error = %e, "kv events: event skipped");
                }
            }
        }
        self.stats
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        bump(&self.stats.batches);
        sink.apply(self.cfg.worker, events);
        self.last_seq = Some(seq);
        self.last_payload = payload;
    }

    /// Replays from the last applied batch and applies what follows it; returns false if
    /// no replay could be had.
    async fn resync(&mut self, sink: &dyn EventSink) -> bool {
        let Some(endpoint) = self.cfg.replay_endpoint.clone() else {
            bump(&self.stats.missing_history);
            tracing::warn!(worker = %self.cfg.name, "kv events: out of sequence and no replay endpoint");
            return false;
        };
        let start = self.last_seq.unwrap_or(0);
        let fetched =
            tokio::time::timeout(self.cfg.replay_timeout, fetch_replay(&endpoint, start)).await;
        let batches = match fetched {
            Ok(Ok(b)) => b,
            Ok(Err(e)) => {
                bump(&self.stats.missing_history);
                tracing::warn!(worker = %self.cfg.name, error = %e, "kv events: replay failed");
                return false;
            }
            Err(_) => {
                bump(&self.stats.missing_history);
                tracing::warn!(worker = %self.cfg.name, "kv events: replay timed out");
                return false;
            }
        };
        let first = batches.first().map(|b| (b.seq, b.payload));
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
                    bump(&self.stats.missing_history);
                }
            }
            (None, Some(_)) => bump(&self.stats.missing_history),
        }
        for b in batches {
            bump(&self.stats.replayed_batches);
            self.apply(b.seq, b.payload, b.batch, sink);
        }
        true
    }
}

/// One batch of a replay.
#[derive(Debug, Clone)]
pub struct ReplayedBatch {
    pub seq: u64,
    /// xxh3 of the payload bytes.
    pub payload: u64,
    pub batch: WireBatch,
}

/// Why a replay did not complete.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("zmq")]
    Zmq(#[from] zeromq::ZmqError),
    #[error("malformed replay reply with {0} frames")]
    Frames(usize),
}

/// Fetches buffered batches from `start` on over a DEALER socket.
pub async fn fetch_replay(endpoint: &str, start: u64) -> Result<Vec<ReplayedBatch>, ReplayError> {
    let mut dealer = DealerSocket::new();
    dealer.connect(endpoint).await?;
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&start.to_be_bytes())];
    dealer
        .send(ZmqMessage::try_from(request).map_err(|_| ReplayError::Frames(0))?)
        .await?;
    let mut out = Vec::new();
    loop {
        let frames = dealer.recv().await?.into_vec();
        // [b"", seq, payload] (vLLM before #45177, SGLang) or [b"", topic, seq, payload].
        let (seq, payload) = match frames.as_slice() {
            [_, seq, payload] | [_, _, seq, payload] => (seq, payload),
            other => return Err(ReplayError::Frames(other.len())),
        };
        if seq.as_ref() == END_SEQ {
            return Ok(out);
        }
        let (Ok(seq), Ok(batch)) = (decode_seq(seq), decode_batch(payload)) else {
            // A bad batch in a replay is skipped like a bad live one.
            continue;
        };
        out.push(ReplayedBatch {
            seq,
            payload: xxh3_64(payload),
            batch,
        });
    }
}

/// Sleeps, or returns true at once if cancelled.
async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => false,
        () = cancel.cancelled() => true,
    }
}
