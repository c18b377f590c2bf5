//! What a node has applied, kept for the routers that follow it (`GET /directory/v1/watch`,
//! see `node::watch`): the last log entries in order, at most [`KEPT`] of them and at most
//! a byte budget of their estimated size, and a signal when more are applied. A follower
//! further behind than that starts again from a snapshot (the whole state, sent once: a
//! heavier resume, but the path every new follower takes anyway).
//!
//! The budget follows the state's size: twice the node's last snapshot, within
//! [`MIN_KEPT_BYTES`] and [`KEPT_BYTES`] ([`Feed::fit_to_snapshot`]). Entries beyond
//! that weigh more than the state they lead to, and a follower that far behind is
//! served as well by the snapshot; kept, they only hold memory (at a hundred sessions
//! the fixed 64 MiB bound took hours to fill, and a node's memory grew all that while).
//!
//! The byte bound is what holds memory: an entry is a batch of up to `MAX_BATCH`
//! commands, so 65,536 of them can weigh anything from a few MB to GBs. Each entry's size
//! is estimated once, when it is pushed, as the length of its JSON (strings and ids
//! dominate a command; its JSON is within a small factor of its heap size), a batch's
//! vector of commands, and a fixed cost per entry.
//!
//! Entries are pushed by the state machine while it holds its state's write lock, so a
//! snapshot read under the read lock at index `i` is followed, in this feed, by exactly the
//! entries after `i` (unless they were already dropped for room).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::Envelope;

/// Most entries kept for followers that fall behind (a reconnecting router resumes from
/// here).
pub const KEPT: usize = 65_536;

/// Most bytes of entries kept (estimated by [`entry_bytes`]): 64 MiB, whichever of this
/// and [`KEPT`] is reached first. A lease renewal weighs about 0.2 KB and a router's batch
/// of step records a few KB (each claim carries its chain's checkpoints), so a mix of them
/// reaches either bound after tens of thousands of entries; a run of large batches meets
/// this one first. The cost: a router that falls further behind than what is kept (a
/// long partition, a slow reader) is sent the whole state again instead of the entries it
/// missed.
pub const KEPT_BYTES: usize = 64 << 20;

/// The least budget [`Feed::fit_to_snapshot`] sets: 4 MiB, minutes of a small
/// directory's writes, so a router restarted or paused for a while resumes from the
/// entries it missed however small the state.
pub const MIN_KEPT_BYTES: usize = 4 << 20;

/// What an entry costs beyond its envelope's JSON: its slot in the queue, the `Arc` and
/// the envelope's own struct.
const ENTRY_OVERHEAD_BYTES: usize =
    std::mem::size_of::<FedEntry>() + std::mem::size_of::<Envelope>() + 16;

/// One applied log entry: its index and, for a directory command, its envelope (blank
/// and membership entries only advance the index).
pub type FedEntry = (u64, Option<Arc<Envelope>>);

/// The estimated size of an entry with `envelope` ([`KEPT_BYTES`]): its JSON, plus a
/// batch's slots (each command of a batch takes a whole `Command` in its vector, more
/// than a small command's JSON).
pub fn entry_bytes(envelope: Option<&Envelope>) -> usize {
    let Some(e) = envelope else {
        return ENTRY_OVERHEAD_BYTES;
    };
    let mut counted = CountedBytes(0);
    // A command always serializes (no maps with non-string keys); a failure counts what
    // was written before it.
    let _ = serde_json::to_writer(&mut counted, e);
    let slots = match &e.command {
        crate::Command::Batch { commands } => {
            commands.len() * std::mem::size_of::<crate::Command>()
        }
        _ => 0,
    };
    ENTRY_OVERHEAD_BYTES + counted.0 + slots
}

/// A writer that only counts what is written to it.
struct CountedBytes(usize);

impl std::io::Write for CountedBytes {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct Kept {
    entries: VecDeque<FedEntry>,
    /// Each kept entry's estimated size, in the same order.
    sizes: VecDeque<usize>,
    /// Their sum.
    bytes: usize,
    /// Index of the last entry applied (0: none).
    last: u64,
}

impl Kept {
    fn clear(&mut self) {
        self.entries.clear();
        self.sizes.clear();
        self.bytes = 0;
    }

    fn pop_oldest(&mut self) {
        self.entries.pop_front();
        self.bytes -= self.sizes.pop_front().unwrap_or(0);
    }
}

/// The applied entries a node keeps for its followers.
#[derive(Debug)]
pub struct Feed {
    kept: Mutex<Kept>,
    /// Most bytes of entries kept: [`KEPT_BYTES`] until a snapshot sets it.
    budget: AtomicUsize,
    applied: watch::Sender<u64>,
}

impl Feed {
    /// An empty feed whose state machine has applied up to `last`.
    pub fn new(last: u64) -> Self {
        Self {
            kept: Mutex::new(Kept {
                entries: VecDeque::new(),
                sizes: VecDeque::new(),
                bytes: 0,
                last,
            }),
            budget: AtomicUsize::new(KEPT_BYTES),
            applied: watch::Sender::new(last),
        }
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the entry at `index`, just applied, dropping the oldest beyond [`KEPT`]
    /// entries or the byte budget.
    pub fn push(&self, index: u64, envelope: Option<Envelope>) {
        let budget = self.budget.load(Ordering::Relaxed);
        self.push_within(index, envelope, KEPT, budget);
    }

    /// Sets the byte budget from the size of the snapshot just built or installed:
    /// twice it, within [`MIN_KEPT_BYTES`] and [`KEPT_BYTES`]; drops the oldest entries
    /// beyond it now.
    pub fn fit_to_snapshot(&self, snapshot_bytes: usize) {
        let budget = snapshot_bytes
            .saturating_mul(2)
            .clamp(MIN_KEPT_BYTES, KEPT_BYTES);
        self.budget.store(budget, Ordering::Relaxed);
        let mut k = self.kept();
        while k.bytes > budget {
            k.pop_oldest();
        }
    }

    /// [`Self::push`] within `most` entries and `most_bytes`.
    fn push_within(&self, index: u64, envelope: Option<Envelope>, most: usize, most_bytes: usize) {
        // Sized before the lock: the state machine holds its write lock meanwhile, not
        // the followers reading this feed.
        let size = entry_bytes(envelope.as_ref());
        let mut k = self.kept();
        // A gap (never expected: entries are applied in order) drops what is kept, so no
        // follower is ever handed a history with a hole.
        if index != k.last + 1 {
            k.clear();
        }
        while !k.entries.is_empty() && (k.entries.len() >= most || k.bytes + size > most_bytes) {
            k.pop_oldest();
        }
        k.entries.push_back((index, envelope.map(Arc::new)));
        k.sizes.push_back(size);
        k.bytes += size;
        k.last = index;
        drop(k);
        self.applied.send_replace(index);
    }

    /// The state was replaced by a snapshot up to `last`: what was kept no longer leads
    /// anywhere.
    pub fn reset(&self, last: u64) {
        let mut k = self.kept();
        k.clear();
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

    /// The estimated bytes of the entries kept ([`entry_bytes`] summed).
    pub fn bytes(&self) -> usize {
        self.kept().bytes
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
    fn a_snapshot_sets_the_budget_to_twice_its_size_within_the_bounds_and_trims_to_it() {
        let feed = Feed::new(0);
        let big = |i| {
            Some(Envelope {
                now_ms: i,
                client: None,
                command: Command::EndSession {
                    session: crate::ids::SessionId("s".repeat(100_000)),
                    epoch: crate::ids::Epoch(1),
                },
            })
        };
        for i in 1..=100 {
            feed.push(i, big(i));
        }
        assert!(feed.bytes() > 9 << 20, "{}", feed.bytes());
        // A tiny state: the floor.
        feed.fit_to_snapshot(1_000);
        assert!(feed.bytes() <= MIN_KEPT_BYTES && feed.bytes() > MIN_KEPT_BYTES - 200_000);
        assert_eq!(feed.last(), 100);
        assert!(feed.since(99, 10).is_some() && feed.since(50, 10).is_none());
        // Later entries keep within it.
        for i in 101..=200 {
            feed.push(i, big(i));
        }
        assert!(feed.bytes() <= MIN_KEPT_BYTES);
        // A larger state: twice its size.
        feed.fit_to_snapshot(4 << 20);
        for i in 201..=300 {
            feed.push(i, big(i));
        }
        assert!(feed.bytes() <= 8 << 20 && feed.bytes() > (8 << 20) - 200_000);
        // A huge one: the ceiling.
        feed.fit_to_snapshot(1 << 30);
        for i in 301..=1_000 {
            feed.push(i, big(i));
        }
        assert!(feed.bytes() <= KEPT_BYTES && feed.bytes() > KEPT_BYTES - 200_000);
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

    fn batch_of(sessions: usize) -> Option<Envelope> {
        let commands = (0..sessions)
            .map(|i| Command::EndSession {
                session: crate::ids::SessionId(format!("session-{i:06}")),
                epoch: crate::ids::Epoch(i as u64),
            })
            .collect();
        Some(Envelope {
            now_ms: 1,
            client: None,
            command: Command::Batch { commands },
        })
    }

    #[test]
    fn an_entry_is_sized_by_its_json_and_a_fixed_cost() {
        let blank = entry_bytes(None);
        assert_eq!(blank, ENTRY_OVERHEAD_BYTES);
        let one = entry_bytes(batch_of(1).as_ref());
        let hundred = entry_bytes(batch_of(100).as_ref());
        let json = serde_json::to_vec(&batch_of(100))
            .expect("serializes")
            .len();
        assert_eq!(hundred, blank + json + 100 * std::mem::size_of::<Command>());
        assert!(hundred - blank > 10 * (one - blank), "grows with the batch");
    }

    #[test]
    fn a_renewal_and_a_batch_of_step_records_weigh_what_the_bound_assumes() {
        use crate::command::{checkpoints_of, ArtifactSpec};
        use crate::ids::{ClientId, LeaseId, PrefixKey, SessionId};
        let env = |command| Envelope {
            now_ms: 1_764_400_000_000,
            client: Some((ClientId(u64::MAX / 3), 12_345)),
            command,
        };
        let renewal = entry_bytes(Some(&env(Command::KeepAlive {
            lease: LeaseId(123_456_789),
        })));
        // Four steps' records of a 4,000-token (250-block) prompt each.
        let hashes: Vec<u64> = (0..250).map(|i| u64::MAX / 7 - i).collect();
        let record = |i: usize| {
            [
                Command::Claim {
                    key: PrefixKey(hashes[249]),
                    lease: LeaseId(123_456_789),
                    spec: ArtifactSpec {
                        parent: None,
                        blocks: (0, 250),
                        kv_type: "kv".into(),
                        size_bytes: 0,
                        checkpoints: checkpoints_of(&hashes),
                    },
                    expect_epoch: None,
                },
                Command::SetDecodeOwner {
                    session: SessionId(format!("agent-{i}-session")),
                    lease: LeaseId(123_456_789),
                    prefix: Some(PrefixKey(hashes[249])),
                    tail_tokens: 7,
                    predicted_tool_gap_ms: Some(4_000),
                    expect_epoch: None,
                },
            ]
        };
        let batch = entry_bytes(Some(&env(Command::Batch {
            commands: (0..4).flat_map(record).collect(),
        })));
        assert!((100..300).contains(&renewal), "{renewal}");
        assert!((1_000..5_000).contains(&batch), "{batch}");
    }

    #[test]
    fn big_entries_are_dropped_by_bytes_before_the_count_is_reached() {
        let feed = Feed::new(0);
        let each = entry_bytes(batch_of(100).as_ref());
        // Room for ten such entries by bytes, a thousand by count.
        for i in 1..=25 {
            feed.push_within(i, batch_of(100), 1_000, 10 * each);
        }
        assert_eq!(feed.since(14, 100), None, "dropped for room");
        let kept = feed.since(15, 100).expect("the last ten kept");
        assert_eq!(
            kept.iter().map(|e| e.0).collect::<Vec<_>>(),
            (16..=25).collect::<Vec<_>>()
        );
        assert!(feed.bytes() <= 10 * each);
        // An entry larger than the whole budget is still kept, alone.
        feed.push_within(26, batch_of(1_000), 1_000, 10 * each);
        assert_eq!(feed.since(25, 100).expect("kept").len(), 1);
        assert_eq!(feed.since(24, 100), None);
        // Small entries fill the room freed.
        for i in 27..=40 {
            feed.push_within(i, None, 1_000, 10 * each);
        }
        assert_eq!(feed.since(26, 100).expect("kept").len(), 14);
        // A reset forgets the bytes too.
        feed.reset(100);
        assert_eq!(feed.bytes(), 0);
    }
}
