//! A router's live replica of the directory: it follows a node's applied log
//! (`GET /directory/v1/watch`, see `watch`), applies every entry with the same pure state
//! machine the nodes run, and answers lookups from memory, stamped with the index it read
//! at. When the node it follows dies or goes quiet it resumes from its own index on the
//! next one, so a directory failover costs the replica nothing but the entries the cluster
//! is not committing anyway.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::Directory;

use super::secret::ClusterSecret;
use super::watch::{WatchLine, HEARTBEAT};

/// A line longer than this ends the connection (a snapshot of a huge directory still fits).
const MAX_LINE: usize = 1 << 30;

/// The replica and how far it has applied.
#[derive(Debug, Default)]
pub struct Replica {
    state: RwLock<Directory>,
    /// Index of the last entry applied (0: not synced yet).
    applied: AtomicU64,
    /// Whether the replica has read the state at least once.
    synced: AtomicBool,
    /// Whether it currently follows a node.
    connected: AtomicBool,
    /// Leader time of the last command applied (ms), to tell how far behind it runs.
    last_stamp_ms: AtomicU64,
    /// Entries applied since start.
    entries: AtomicU64,
    /// Times it had to (re)connect.
    reconnects: AtomicU64,
    applied_tx: tokio::sync::watch::Sender<u64>,
    /// Asks it to leave the node it follows for the next one (`move_on`).
    move_on: tokio::sync::Notify,
}

/// Why a stream was left.
#[derive(Debug, thiserror::Error)]
enum Broken {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("answered {0}")]
    Status(reqwest::StatusCode),
    #[error("no line for {0:?}")]
    Quiet(Duration),
    #[error("the stream ended")]
    Ended,
    #[error("bad line: {0}")]
    Line(String),
    #[error("entry {got} after {had}: a gap")]
    Gap { had: u64, got: u64 },
    /// The node it followed did not bring it to a read index in time (a follower cut off
    /// from its leader still answers, and still sends heartbeats).
    #[error("behind a read index: following the next node")]
    Behind,
    /// An entry this router's release cannot apply (the cluster was upgraded past it):
    /// applied by older rules the replica would diverge, so it stops there.
    #[error("entry {index}: {source}")]
    TooNew {
        index: u64,
        #[source]
        source: crate::version::TooNew,
    },
}

impl Replica {
    /// Starts following the nodes at `urls` (`http://host:port`), presenting `secret`;
    /// the task is `tracker`'s and ends with `cancel`.
    pub fn follow(
        urls: Vec<String>,
        secret: Option<&ClusterSecret>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Arc<Self> {
        let replica = Arc::new(Self::default());
        // No overall timeout: the stream lives as long as the node; quiet is caught per line.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .default_headers(secret.map(ClusterSecret::headers).unwrap_or_default())
            .build()
            .unwrap_or_default();
        let following = replica.clone();
        tracker.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = following.run(http, urls) => {}
            }
        });
        replica
    }

    /// Reads the replica's state.
    pub fn read<T>(&self, f: impl FnOnce(&Directory) -> T) -> T {
        f(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Index of the last log entry applied (0: not synced yet).
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Whether it has read the directory's state at least once.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Whether it follows a node now.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Leader time (unix ms) of the last command it applied.
    pub fn last_stamp_ms(&self) -> u64 {
        self.last_stamp_ms.load(Ordering::Acquire)
    }

    /// Entries applied and reconnections since start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.entries.load(Ordering::Relaxed),
            self.reconnects.load(Ordering::Relaxed),
        )
    }

    /// Leaves the node it follows for the next one, resuming from its own index: the node
    /// did not bring it to a read index in time.
    pub fn move_on(&self) {
        self.move_on.notify_one();
    }

    /// Wakes on every index applied.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    /// Waits (at most `within`) until entry `index` is applied; whether it was.
    pub async fn wait_applied(&self, index: u64, within: Duration) -> bool {
        let mut rx = self.applied_tx.subscribe();
        tokio::time::timeout(within, rx.wait_for(|&a| a >= index))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    async fn run(&self, http: reqwest::Client, urls: Vec<String>) {
        let mut i = 0usize;
        loop {
            let Some(url) = urls.get(i % urls.len().max(1)) else {
                return;
            };
            let followed = self.follow_one(&http, url).await;
            self.connected.store(false, Ordering::Release);
            let pause = match followed {
                // It will not apply until this router is upgraded: said every few seconds.
                Err(e @ Broken::TooNew { .. }) => {
                    tracing::error!(node = %url, error = %e, "directory replica stopped: upgrade this router");
                    Duration::from_secs(5)
                }
                Err(e) => {
                    tracing::debug!(node = %url, error = %e, "directory replica: following another node");
                    Duration::from_millis(50)
                }
                Ok(()) => Duration::from_millis(50),
            };
            self.reconnects.fetch_add(1, Ordering::Relaxed);
            i += 1;
            tokio::time::sleep(pause).await;
        }
    }

    /// Follows `url` until its stream breaks.
    async fn follow_one(&self, http: &reqwest::Client, url: &str) -> Result<(), Broken> {
        let mut resp = http
            .get(format!("{url}/directory/v1/watch"))
            .query(&[("after", self.applied())])
            .send()
            .await?;
        if !resp.status().is_success() {
            return Err(Broken::Status(resp.status()));
        }
        self.connected.store(true, Ordering::Release);
        let quiet = HEARTBEAT * 3;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk = tokio::select! {
                read = tokio::time::timeout(quiet, resp.chunk()) => read
                    .map_err(|_| Broken::Quiet(quiet))??
                    .ok_or(Broken::Ended)?,
                () = self.move_on.notified() => return Err(Broken::Behind),
            };
            // Only the new bytes can end the line: a snapshot line of a large directory
            // comes in thousands of chunks, and searching it all again after each one
            // took minutes at a million sessions (`bench directory --scale`).
            let mut from = buf.len();
            buf.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(at) = buf[from..].iter().position(|&b| b == b'\n') {
                self.take(&buf[start..from + at])?;
                start = from + at + 1;
                from = start;
            }
            buf.drain(..start);
            if buf.len() > MAX_LINE {
                return Err(Broken::Line(format!("over {MAX_LINE} bytes")));
            }
        }
    }

    /// Applies one line of the stream.
    fn take(&self, line: &[u8]) -> Result<(), Broken> {
        let parsed = WatchLine::parse(line).map_err(|e| Broken::Line(e.to_string()))?;
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        let had = self.applied();
        let index = match parsed {
            WatchLine::Heartbeat { .. } => return Ok(()),
            WatchLine::Snapshot { snapshot, index } => {
                *state = *snapshot;
                self.synced.store(true, Ordering::Release);
                index
            }
            // Already applied (a node resent what another had sent): skip.
            WatchLine::Entry { index, .. } if index <= had => return Ok(()),
            WatchLine::Entry { index, .. } if index != had + 1 || !self.synced() => {
                return Err(Broken::Gap { had, got: index })
            }
            WatchLine::Entry { index, entry } => {
                if let Some(env) = entry {
                    env.command
                        .check_known_version()
                        .map_err(|source| Broken::TooNew { index, source })?;
                    state.apply(index, &env);
                    self.last_stamp_ms.store(env.now_ms, Ordering::Release);
                }
                self.entries.fetch_add(1, Ordering::Relaxed);
                index
            }
        };
        self.applied.store(index, Ordering::Release);
        drop(state);
        self.applied_tx.send_replace(index);
        Ok(())
    }
}
