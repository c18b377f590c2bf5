//! Fan-out of normalised KV events over Redis Streams, so several router replicas build the
//! same index: one replica (the publisher) runs the ZMQ subscribers and appends each batch to
//! a stream per worker (`XADD <prefix>:<worker> MAXLEN ~ N`); every replica, the publisher
//! included, follows those streams from the start (`XREAD BLOCK`) and applies the entries in
//! stream order. Entries are JSON `{op: "apply", events: [...]}` or `{op: "reset"}`.
//!
//! Exactly one replica should publish. A replica that joins after the stream was trimmed
//! misses the trimmed history (its index under-counts cached blocks, which only costs hits).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_index::KvEvent;

use super::subscriber::EventSink;

/// One stream entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum StreamEntry {
    Apply { events: Vec<KvEvent> },
    Reset,
}

/// Where the streams live.
#[derive(Debug, Clone)]
pub struct FanoutConfig {
    pub url: String,
    /// Stream key prefix; the key of a worker's stream is `<prefix>:<worker name>`.
    pub prefix: String,
    /// Approximate length each stream is trimmed to.
    pub maxlen: usize,
}

impl FanoutConfig {
    pub fn key(&self, worker_name: &str) -> String {
        format!("{}:{worker_name}", self.prefix)
    }
}

/// An [`EventSink`] that appends to the workers' streams, in order, through one writer task.
pub struct RedisPublisher {
    tx: mpsc::UnboundedSender<(WorkerId, StreamEntry)>,
}

impl RedisPublisher {
    /// Starts the writer; `keys` maps each worker to its stream key.
    pub fn spawn(
        cfg: &FanoutConfig,
        keys: HashMap<WorkerId, String>,
        tracker: &tokio_util::task::TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Self, redis::RedisError> {
        let client = redis::Client::open(cfg.url.as_str())?;
        let (tx, mut rx) = mpsc::unbounded_channel::<(WorkerId, StreamEntry)>();
        let maxlen = cfg.maxlen;
        tracker.spawn(async move {
            let Some(mut con) = connect(&client, &cancel).await else {
                return;
            };
            loop {
                let (worker, entry) = tokio::select! {
                    e = rx.recv() => match e { Some(e) => e, None => return },
                    () = cancel.cancelled() => return,
                };
                let Some(key) = keys.get(&worker) else {
                    continue;
                };
                let Ok(json) = serde_json::to_string(&entry) else {
                    continue;
                };
                // Retry until written: dropping an entry would desynchronise every replica.
                loop {
                    let written: Result<String, _> = con
                        .xadd_maxlen(
                            key,
                            redis::streams::StreamMaxlen::Approx(maxlen),
                            "*",
                            &[("e", json.as_str())],
                        )
                        .await;
                    match written {
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "redis: XADD failed, retrying");
                            if sleep_or_cancel(Duration::from_millis(200), &cancel).await {
                                return;
                            }
                            match connect(&client, &cancel).await {
                                Some(c) => con = c,
                                None => return,
                            }
                        }
                    }
                }
            }
        });
        Ok(Self { tx })
    }
}

impl EventSink for RedisPublisher {
    fn apply(&self, worker: WorkerId, events: Vec<KvEvent>) -> usize {
        let _ = self.tx.send((worker, StreamEntry::Apply { events }));
        0
    }

    fn reset(&self, worker: WorkerId) {
        let _ = self.tx.send((worker, StreamEntry::Reset));
    }
}

async fn connect(
    client: &redis::Client,
    cancel: &CancellationToken,
) -> Option<redis::aio::MultiplexedConnection> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match client.get_multiplexed_async_connection().await {
            Ok(c) => return Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "redis: cannot connect, retrying");
                if sleep_or_cancel(backoff, cancel).await {
                    return None;
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

async fn sleep_or_cancel(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => false,
        () = cancel.cancelled() => true,
    }
}

/// Follows one worker's stream from its first entry, applying entries to `sink`, until
/// `cancel` fires. Malformed entries are logged and skipped.
pub async fn follow(
    url: String,
    key: String,
    worker: WorkerId,
    sink: Arc<dyn EventSink>,
    cancel: CancellationToken,
) {
    let Ok(client) = redis::Client::open(url.as_str()) else {
        tracing::error!(%url, "redis: invalid url");
        return;
    };
    let mut last_id = "0-0".to_owned();
    // A blocking XREAD holds its connection, so each follower has its own.
    while let Some(mut con) = connect(&client, &cancel).await {
        loop {
            let opts = StreamReadOptions::default().block(1000).count(512);
            let (keys, ids) = ([key.as_str()], [last_id.as_str()]);
            let read = tokio::select! {
                r = con.xread_options::<_, _, StreamReadReply>(&keys, &ids, &opts) => r,
                () = cancel.cancelled() => return,
            };
            let reply = match read {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, %key, "redis: XREAD failed, reconnecting");
                    break;
                }
            };
            for stream in reply.keys {
                for entry in stream.ids {
                    last_id.clone_from(&entry.id);
                    let parsed = entry
                        .get::<String>("e")
                        .and_then(|json| serde_json::from_str::<StreamEntry>(&json).ok());
                    match parsed {
                        Some(StreamEntry::Apply { events }) => {
                            sink.apply(worker, events);
                        }
                        Some(StreamEntry::Reset) => sink.reset(worker),
                        None => {
                            tracing::warn!(%key, id = %entry.id, "redis: malformed stream entry skipped")
                        }
                    }
                }
            }
        }
        if sleep_or_cancel(Duration::from_millis(200), &cancel).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_planner::kv_index::Tier;

    #[test]
    fn entries_round_trip_as_json() {
        let e = StreamEntry::Apply {
            events: vec![
                KvEvent::Stored {
                    parent: Some(7),
                    block_ids: vec![9],
                    tokens: vec![1, 2],
                    tier: Tier::Cpu,
                    lora_name: None,
                    extra_keys: None,
                },
                KvEvent::Removed {
                    block_ids: vec![9],
                    tier: Tier::Gpu,
                },
                KvEvent::Cleared,
            ],
        };
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<StreamEntry>(&json).unwrap(), e);
        assert_eq!(
            serde_json::to_string(&StreamEntry::Reset).unwrap(),
            r#"{"op":"reset"}"#
        );
    }
}
