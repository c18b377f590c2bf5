//! What a node has applied, kept for the routers that follow it (`GET /directory/v1/watch`,
//! see `node::watch`): the last [`KEPT`] log entries in order, and a signal when more are
//! applied. A follower further behind than that starts again from a snapshot.
//!
//! Entries are pushed by the state machine while it holds its state's write lock, so a
//! snapshot read under the read lock at index `i` is followed, in this feed, by exactly the
//! entries after `i` (unless they were already dropped for room).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::Envelope;

/// Entries kept for followers that fall behind (a reconnecting router resumes from here).
pub const KEPT: usize = 65_536;

/// One applied log entry: its index and, for a directory command, its envelope (blank
/// and membership entries only advance the index).
pub type FedEntry = (u64, Option<Arc<Envelope>>);

#[derive(Debug)]
struct Kept {
    entries: VecDeque<FedEntry>,
    /// Index of the last entry applied (0: none).
    last: u64,
}

/// The applied entries a node keeps for its followers.
#[derive(Debug)]
pub struct Feed {
    kept: Mutex<Kept>,
    applied: watch::Sender<u64>,
}

impl Feed {
    /// An empty feed whose state machine has applied up to `last`.
    pub fn new(last: u64) -> Self {
        Self {
            kept: Mutex::new(Kept {
                entries: VecDeque::new(),
                last,
            }),
            applied: watch::Sender::new(last),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the entry at `index`, just applied.
    pub fn push(&self, index: u64, envelope: Option<Envelope>) {
        let mut k = self.kept();
        // A gap (never expected: entries are applied in order) drops what is kept, so no
        // follower is ever handed a history with a hole.
        if index != k.last + 1 {
            k.entries.clear();
        }
        if k.entries.len() == KEPT {
            k.entries.pop_front();
        }
        k.entries.push_back((index, envelope.map(Arc::new)));
        k.last = index;
        drop(k);
        self.applied.send_replace(index);
    }

    /// The state was replaced by a snapshot up to `last`: what was kept no longer leads
    /// anywhere.
    pub fn reset(&self, last: u64) {
        let mut k = self.kept();
        k.entries.clear();
        k.last = last;
        drop(k);
        self.applied.send_replace(last);
    }

    /// Up to `max` entries after index `after`, in order; `None` when some of them are
    /// no longer kept (the follower needs a snapshot).
    pub fn since(&self, after: u64, max: usize) -> Option<Vec<FedEntry>> {
        let k = self.kept();
        if after >= k.last {
            return Some(Vec::new());
        }
        let first = k.entries.front()?.0;
        if first > after + 1 {
            return None;
        }
        let skip = (after + 1 - first) as usize;
        Some(k.entries.iter().skip(skip).take(max).cloned().collect())
    }

    /// The last applied index.
    pub fn last(&self) -> u64 {
        self.kept().last
    }

    /// Wakes when an entry is applied (or the state replaced).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;

    fn env(now_ms: u64) -> Option<Envelope> {
        Some(Envelope {
            now_ms,
            client: None,
            command: Command::Tick,
        })
    }

    #[test]
    fn a_follower_gets_what_came_after_its_index_or_needs_a_snapshot() {
        let feed = Feed::new(10);
        assert_eq!(feed.since(10, 100), Some(Vec::new()));
        // Nothing kept from before index 11.
        assert_eq!(feed.since(3, 100), None);
        for i in 11..=15 {
            feed.push(i, env(i));
        }
        let got = feed.since(12, 100).expect("kept");
        assert_eq!(
            got.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![13, 14, 15]
        );
        assert_eq!(feed.since(10, 2).expect("kept").len(), 2);
        assert_eq!(feed.since(9, 100), None);
        assert_eq!(feed.since(15, 100), Some(Vec::new()));
        feed.reset(100);
        assert_eq!(feed.since(15, 100), None);
        assert_eq!(feed.last(), 100);
    }

    #[test]
    fn only_the_last_kept_entries_stay() {
        let feed = Feed::new(0);
        for i in 1..=(KEPT as u64 + 5) {
            feed.push(i, None);
        }
        assert_eq!(feed.since(0, 1), None);
        assert_eq!(feed.since(5, 1).expect("kept")[0].0, 6);
    }
}
