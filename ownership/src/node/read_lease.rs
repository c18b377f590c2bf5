//! A router's read lease on its replica: how long what the replica holds may be read as
//! current without asking the leader.
//!
//! Every commit this router sends is a read index for free: its log index is above every
//! entry committed before it was sent. Once the replica has applied that index, the replica
//! holds every write acknowledged before the send, and it is read as current for
//! [`READ_LEASE`] after the *send* (this router's clock only; no clock is compared across
//! machines). A router that sends nothing for that long (idle, paused, cut off) asks the
//! leader for a read index before its next step plans on the replica.
//!
//! The other half is on the writer: a move of a session off a live owner holds its first
//! step's answer until the same span has passed since its commit (the step runs on the new
//! owner meanwhile). A client sends a session's next step only once it has that answer, and
//! a router that plans it on its owner without a round trip read a copy sent for at most
//! that span before: after the move's commit, so the copy holds the move. A session's steps
//! never go back to the owner it left (`bench replicas` counted 34 and 7 such sessions with
//! 2 and 4 routers before, a replica being one step behind).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The default span a read stays current; a move's first answer is held as long. Every router of a cluster
/// must use the same span (`directory.read_lease_ms`). Twice the routers' default flush
/// interval (50 ms): a router under traffic sends a read that often, so its steps rarely
/// ask the leader; each move costs this much more before its first step.
pub const READ_LEASE: Duration = Duration::from_millis(100);

/// Reads in flight kept at most (a commit that never lands is forgotten, which only
/// shortens the lease).
const PENDING: usize = 64;

/// The reads a router sent and the latest its replica has applied.
#[derive(Debug)]
pub struct ReadLease {
    span: Duration,
    reads: Mutex<Reads>,
    /// One catch-up at a time: concurrent steps that find the lease lapsed share the next
    /// read instead of each asking the leader.
    turn: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Reads {
    /// Reads whose index the replica has not applied yet: (sent, log index).
    pending: VecDeque<(Instant, u64)>,
    /// When the latest read the replica has applied was sent.
    current: Option<Instant>,
}

impl ReadLease {
    /// A lease of `span` per read.
    pub fn new(span: Duration) -> Self {
        Self {
            span,
            reads: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
        }
    }

    /// How long a read stays current, and a move's first answer is held after its commit.
    pub fn span(&self) -> Duration {
        self.span
    }

    /// A commit sent at `sent` was written at log `index`.
    pub fn note(&self, sent: Instant, index: u64) {
        if index == 0 {
            return;
        }
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        if reads.pending.len() == PENDING {
            reads.pending.pop_front();
        }
        reads.pending.push_back((sent, index));
    }

    /// When the latest read the replica holds (it has applied up to `applied`) was sent.
    pub fn current(&self, applied: u64) -> Option<Instant> {
        let mut reads = self.reads.lock().unwrap_or_else(|e| e.into_inner());
        let mut current = reads.current;
        reads.pending.retain(|&(sent, index)| {
            let held = index <= applied;
            if held {
                current = current.max(Some(sent));
            }
            !held
        });
        reads.current = current;
        current
    }

    /// Whether the replica (applied up to `applied`) may be read as current now.
    pub fn held(&self, applied: u64) -> bool {
        self.current(applied)
            .is_some_and(|sent| sent.elapsed() <= self.span)
    }

    /// Waits until no other catch-up of this router is in flight.
    pub async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.turn.lock().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_read_is_current_once_applied_and_for_its_span_after_it_was_sent() {
        let lease = ReadLease::new(Duration::from_millis(200));
        assert!(!lease.held(0), "nothing read yet");
        let sent = Instant::now();
        lease.note(sent, 10);
        assert!(!lease.held(9), "the replica has not applied the read");
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(lease.held(10));
        tokio::time::advance(Duration::from_millis(51)).await;
        assert!(!lease.held(10), "counted from the send, not from the apply");
    }

    #[tokio::test(start_paused = true)]
    async fn the_latest_read_applied_counts_whatever_order_commits_land_in() {
        let lease = ReadLease::new(Duration::from_millis(200));
        let early = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        let late = Instant::now();
        lease.note(late, 20);
        lease.note(early, 15);
        assert_eq!(lease.current(15), Some(early));
        assert_eq!(lease.current(20), Some(late));
        // An older read applied later does not take the lease back.
        lease.note(early, 25);
        assert_eq!(lease.current(30), Some(late));
        tokio::time::advance(Duration::from_millis(150)).await;
        assert!(lease.held(30));
    }

    #[tokio::test(start_paused = true)]
    async fn reads_never_applied_are_bounded() {
        let lease = ReadLease::new(Duration::from_millis(200));
        for i in 0..1_000 {
            lease.note(Instant::now(), 100 + i);
        }
        let kept = lease.reads.lock().map(|r| r.pending.len()).unwrap_or(0);
        assert_eq!(kept, PENDING);
        assert!(lease.held(2_000));
    }
}
