//! `GET /directory/v1/watch?after=N`: the node's applied log as a stream, for the routers
//! that keep a live replica of the directory (`replica`). One JSON object per line:
//!
//! - `{"snapshot": <Directory>, "index": I}`: the whole state at index `I`, first when the
//!   entries after `N` are no longer kept (or `N` is 0: a new replica learns the state's
//!   settings, such as its grace, from it);
//! - `{"index": I, "entry": <Envelope> | null}`: the entry applied at `I`, in order
//!   (`null`: a Raft blank or membership entry, which only advances the index);
//! - `{"heartbeat": I}` after a second without entries, so a follower can tell a quiet
//!   node from a dead connection.
//!
//! Only committed entries are ever applied, so any node (follower or leader) can be
//! followed; a follower is at most a heartbeat behind the leader. The stream ends when the
//! node stops.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::raft::feed::Feed;
use crate::{Directory, Envelope};

use super::Node;

/// How long a watch stays quiet before a heartbeat line.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Most entries written in one chunk.
const CHUNK: usize = 1024;

/// One line of the stream.
#[derive(Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum WatchLine {
    Snapshot {
        snapshot: Box<Directory>,
        index: u64,
    },
    Entry {
        index: u64,
        entry: Option<Arc<Envelope>>,
    },
    Heartbeat {
        heartbeat: u64,
        /// When the node sent it (Unix ms; 0 from a node that does not say). Routers of
        /// the previous release judge their replica's freshness by it; this release's
        /// routers go by their read lease (`read_lease`) instead.
        #[serde(default)]
        sent_ms: u64,
    },
}

impl WatchLine {
    /// Reads one line of the stream. A snapshot line is read apart from the untagged enum:
    /// serde reads an untagged variant from a buffered copy of the line, which cannot turn
    /// the directory's map keys (JSON strings such as `"12288"`) back into the integer ids
    /// they stand for, so a snapshot with any lease in it failed as a snapshot and was read
    /// as an entry without one (`{"index": I}`): a replica that started, or came back, after
    /// the first lease was granted never synced.
    pub fn parse(line: &[u8]) -> Result<Self, serde_json::Error> {
        #[derive(Deserialize)]
        struct Probe<'a> {
            #[serde(borrow, default)]
            snapshot: Option<&'a serde_json::value::RawValue>,
            #[serde(default)]
            index: u64,
        }
        let probe: Probe<'_> = serde_json::from_slice(line)?;
        match probe.snapshot {
            Some(raw) => Ok(WatchLine::Snapshot {
                snapshot: serde_json::from_str(raw.get())?,
                index: probe.index,
            }),
            None => serde_json::from_slice(line),
        }
    }
}

/// The `after` of a watch's query (0 when absent or not a number: from the start).
fn after(uri: &Uri) -> u64 {
    uri.query()
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("after="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Where one watcher is.
struct Watcher {
    node: Arc<Node>,
    after: u64,
    applied: watch::Receiver<u64>,
    /// Send the state first (a new follower, or one further behind than the feed keeps).
    snapshot: bool,
}

pub(super) async fn watch(State(node): State<Arc<Node>>, uri: Uri) -> Response {
    let after = after(&uri);
    let feed: &Feed = node.machine.feed();
    let watcher = Watcher {
        applied: feed.subscribe(),
        after,
        snapshot: after == 0,
        node: node.clone(),
    };
    let stream = futures_util::stream::unfold(watcher, |mut w| async move {
        let stopping = w.node.stopping.clone();
        tokio::select! {
            chunk = w.next_chunk() => Some((Ok::<Bytes, std::io::Error>(chunk), w)),
            // The node stops: the follower moves to another node now.
            () = stopping.cancelled() => None,
        }
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

impl Watcher {
    /// The next lines to send: the state, entries, or a heartbeat after a quiet second.
    async fn next_chunk(&mut self) -> Bytes {
        loop {
            if !self.snapshot {
                match self.node.machine.feed().since(self.after, CHUNK) {
                    Some(entries) if !entries.is_empty() => return self.entries(entries),
                    Some(_) => {}
                    None => self.snapshot = true,
                }
            }
            if self.snapshot {
                self.snapshot = false;
                return self.state();
            }
            // `changed` fails only when the node is gone; the heartbeat then ends nothing,
            // the server's shutdown does.
            let woke = tokio::time::timeout(HEARTBEAT, self.applied.changed()).await;
            if !matches!(woke, Ok(Ok(()))) {
                let heartbeat = self.node.machine.feed().last();
                return line(&WatchLine::Heartbeat {
                    heartbeat,
                    sent_ms: super::unix_ms(),
                });
            }
        }
    }

    fn entries(&mut self, entries: Vec<crate::raft::feed::FedEntry>) -> Bytes {
        let mut out = Vec::new();
        for (index, entry) in entries {
            self.after = index;
            out.extend_from_slice(&line(&WatchLine::Entry { index, entry }));
        }
        out.into()
    }

    /// The state and its index, read under the state's lock: the feed holds exactly
    /// what comes after it.
    fn state(&mut self) -> Bytes {
        let (snapshot, index) = self.node.machine.read(|s| {
            (
                Box::new(s.directory.clone()),
                s.last_applied.map_or(0, |l| l.index),
            )
        });
        self.after = index;
        line(&WatchLine::Snapshot { snapshot, index })
    }
}

fn line(l: &WatchLine) -> Bytes {
    let mut v = serde_json::to_vec(l).unwrap_or_default();
    v.push(b'\n');
    v.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Envelope;
    use crate::ids::WorkerId;
    use crate::Command;

    #[test]
    fn a_snapshot_line_with_leases_is_read_as_a_snapshot() {
        let mut d = Directory::new(500);
        d.apply(
            1,
            &Envelope {
                now_ms: 1_000,
                client: None,
                command: Command::GrantLease {
                    worker: WorkerId(2),
                    ttl_ms: 6_000,
                },
            },
        );
        assert_eq!(d.leases.len(), 1);
        let sent = line(&WatchLine::Snapshot {
            snapshot: Box::new(d.clone()),
            index: 1,
        });
        match WatchLine::parse(sent.trim_ascii_end()).unwrap() {
            WatchLine::Snapshot { snapshot, index } => {
                assert_eq!((*snapshot, index), (d, 1));
            }
            other => panic!("read as {other:?}"),
        }
        let beat = line(&WatchLine::Heartbeat {
            heartbeat: 4,
            sent_ms: 9,
        });
        assert!(matches!(
            WatchLine::parse(beat.trim_ascii_end()).unwrap(),
            WatchLine::Heartbeat {
                heartbeat: 4,
                sent_ms: 9
            }
        ));
    }
}
