//! The approximate-mode expiry queue: `(expires_at_ms, worker, seq)` entries in insertion
//! order (non-decreasing with a fixed TTL), kept in chunks so that stale entries can be
//! dropped a chunk at a time. An entry goes stale when its hold is pruned with its block
//! or refreshed to a later grain (which queues a new entry); stale entries are harmless to
//! [`super::KvIndex::expire`], which checks the hold, but they cost memory until their
//! TTL. Dropping them from one chunk keeps the order of the whole queue, so the compaction
//! runs in steps of bounded work, between which the index serves requests.

use std::collections::VecDeque;

use crate::ids::WorkerId;

/// One entry: when it is due, whose hold, on which block.
pub(super) type Expiry = (u64, WorkerId, u64);

/// Entries per chunk as pushed (compaction leaves fewer).
const CHUNK: usize = 4096;

/// The queue.
#[derive(Debug, Clone, Default)]
pub(super) struct ExpiryQueue {
    chunks: VecDeque<VecDeque<Expiry>>,
    len: usize,
    /// The next chunk a compaction step examines.
    cursor: usize,
    /// Chunks left in the compaction pass under way (0: none).
    pass_left: usize,
}

impl ExpiryQueue {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn push_back(&mut self, e: Expiry) {
        match self.chunks.back_mut() {
            Some(last) if last.len() < CHUNK => last.push_back(e),
            _ => {
                let mut chunk = VecDeque::with_capacity(CHUNK);
                chunk.push_back(e);
                self.chunks.push_back(chunk);
            }
        }
        self.len += 1;
    }

    pub(super) fn front(&self) -> Option<&Expiry> {
        self.chunks.front().and_then(VecDeque::front)
    }

    pub(super) fn pop_front(&mut self) -> Option<Expiry> {
        let first = self.chunks.front_mut()?;
        let e = first.pop_front();
        if first.is_empty() {
            self.chunks.pop_front();
            self.cursor = self.cursor.saturating_sub(1);
        }
        if e.is_some() {
            self.len -= 1;
        }
        e
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Expiry> {
        self.chunks.iter().flatten()
    }

    /// One compaction step: the entries of up to `chunks` chunks that `live` rejects are
    /// dropped, from where the last step stopped. A pass over every chunk starts when
    /// none is under way; returns whether the pass has chunks left.
    pub(super) fn compact_some(&mut self, chunks: usize, live: impl Fn(&Expiry) -> bool) -> bool {
        if self.pass_left == 0 {
            self.pass_left = self.chunks.len();
        }
        for _ in 0..chunks {
            if self.pass_left == 0 || self.chunks.is_empty() {
                self.pass_left = 0;
                break;
            }
            if self.cursor >= self.chunks.len() {
                self.cursor = 0;
            }
            self.pass_left -= 1;
            let chunk = &mut self.chunks[self.cursor];
            let before = chunk.len();
            chunk.retain(|e| live(e));
            self.len -= before - chunk.len();
            if chunk.is_empty() {
                self.chunks.remove(self.cursor);
            } else {
                // A chunk left with a few entries must not keep a whole chunk's memory.
                if chunk.len() < chunk.capacity() / 4 {
                    chunk.shrink_to_fit();
                }
                self.cursor += 1;
            }
        }
        self.pass_left > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(at: u64) -> Expiry {
        (at, WorkerId(0), at)
    }

    #[test]
    fn entries_come_out_in_order_across_chunks_and_compaction_steps() {
        let mut q = ExpiryQueue::default();
        for at in 0..3 * CHUNK as u64 + 10 {
            q.push_back(e(at));
        }
        assert_eq!(q.len(), 3 * CHUNK + 10);
        // Odd entries are stale; a pass is 4 chunks, taken one step at a time.
        let live = |x: &Expiry| x.0.is_multiple_of(2);
        assert!(q.compact_some(1, live));
        assert!(q.compact_some(2, live));
        assert!(!q.compact_some(1, live));
        assert_eq!(q.len(), (3 * CHUNK + 10) / 2);
        // Pushes and pops meanwhile keep the order.
        q.push_back(e(1_000_000));
        let out: Vec<u64> = std::iter::from_fn(|| q.pop_front().map(|x| x.0)).collect();
        let mut want: Vec<u64> = (0..3 * CHUNK as u64 + 10)
            .filter(|a| a.is_multiple_of(2))
            .collect();
        want.push(1_000_000);
        assert_eq!(out, want);
        assert_eq!(q.len(), 0);
        assert!(q.front().is_none());
    }

    #[test]
    fn a_pass_ends_even_where_nothing_goes_and_empty_chunks_are_dropped() {
        let mut q = ExpiryQueue::default();
        for at in 0..2 * CHUNK as u64 {
            q.push_back(e(at));
        }
        assert!(q.compact_some(1, |_| true));
        assert!(!q.compact_some(5, |_| true));
        assert_eq!(q.len(), 2 * CHUNK);
        // Everything stale: both chunks go.
        assert!(!q.compact_some(2, |_| false));
        assert_eq!(q.len(), 0);
        assert_eq!(q.chunks.len(), 0);
        // A chunk left with one entry gives back its memory.
        for at in 0..CHUNK as u64 {
            q.push_back(e(at));
        }
        q.compact_some(1, |x| x.0 == 7);
        assert_eq!(q.iter().map(|x| x.0).collect::<Vec<_>>(), vec![7]);
        assert!(q.chunks[0].capacity() < CHUNK / 4);
    }
}
