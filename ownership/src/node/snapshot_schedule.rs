//! When a node builds its snapshot. openraft's default (`LogsSinceLast(5000)`) has every
//! member build one at the same log index, all at once: at a million sessions three or
//! five encodings and 230 MB writes at the same moment on the same cores, which is when a
//! batch's commit waits longest (`docs/BENCHMARKS.md`, `bench directory --scale`). Here
//! each voter builds every [`PERIOD`] entries too, but at its own phase of the period
//! (its rank among the voters), so their builds are spread over the period.
//!
//! [`due_at`] is pure; [`run`] follows openraft's metrics and asks for a build
//! (`Raft::trigger().snapshot()`) when one is due, the policy given to openraft being
//! `SnapshotPolicy::Never`.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::raft::NodeId;

use super::Node;

/// Entries between two snapshots of one node (openraft's default).
pub const PERIOD: u64 = 5_000;

/// The index at which a node whose last snapshot is at `last` builds its next: the first
/// index of its phase (`rank` of `voters`, a `rank / voters` share of the period) at
/// least half a period after `last`. A node snapshots every `period` entries once in
/// phase, and at most 1.5 periods after a snapshot it was sent or restarted from.
pub fn due_at(last: u64, rank: u64, voters: u64, period: u64) -> u64 {
    let period = period.max(2);
    let phase = period * rank.min(voters.saturating_sub(1)) / voters.max(1);
    let earliest = last.saturating_add(period / 2);
    let at = earliest - earliest % period + phase;
    if at >= earliest {
        at
    } else {
        at + period
    }
}

/// This node's rank among `voters` (a node that is not one ranks after them), and how
/// many there are.
fn rank_of(id: NodeId, voters: impl Iterator<Item = NodeId>) -> (u64, u64) {
    let (mut rank, mut n) = (0, 0);
    for v in voters {
        if v < id {
            rank += 1;
        }
        n += 1;
    }
    (rank, n)
}

/// Asks openraft for a snapshot whenever this node's is due, until `cancel`.
pub async fn run(node: Arc<Node>, cancel: CancellationToken) {
    let mut metrics = node.raft.metrics();
    // The applied index a build was last asked at: asked again an eighth of a period
    // later if none came (openraft ignores an ask while a build runs).
    let mut asked: Option<u64> = None;
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            () = cancel.cancelled() => return,
        }
        let (applied, last, rank, voters) = {
            let m = metrics.borrow_and_update();
            let (rank, voters) = rank_of(node.id, m.membership_config.membership().voter_ids());
            (
                m.last_applied.map_or(0, |l| l.index),
                m.snapshot.map_or(0, |l| l.index),
                rank,
                voters,
            )
        };
        if applied < due_at(last, rank, voters, PERIOD)
            || asked.is_some_and(|at| at > last && applied < at + PERIOD / 8)
        {
            continue;
        }
        asked = Some(applied);
        if node.raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_voters_snapshot_a_third_of_a_period_apart_every_period() {
        let at = |rank| {
            let mut last = 0;
            (0..4)
                .map(|_| {
                    last = due_at(last, rank, 3, 6_000);
                    last
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(at(0), [6_000, 12_000, 18_000, 24_000]);
        assert_eq!(at(1), [8_000, 14_000, 20_000, 26_000]);
        assert_eq!(at(2), [4_000, 10_000, 16_000, 22_000]);
    }

    #[test]
    fn a_snapshot_received_off_phase_is_followed_by_one_in_phase_within_one_and_a_half_periods() {
        // Rank 1 of 2: phase 2,500 of 5,000.
        assert_eq!(due_at(7_400, 1, 2, 5_000), 12_500);
        assert_eq!(due_at(9_900, 1, 2, 5_000), 12_500);
        assert_eq!(due_at(10_100, 1, 2, 5_000), 17_500);
        // One voter: every period from 0, as openraft's own policy.
        assert_eq!(due_at(0, 0, 1, 5_000), 5_000);
        assert_eq!(due_at(5_000, 0, 1, 5_000), 10_000);
    }

    #[test]
    fn a_node_s_rank_is_its_place_among_the_voters() {
        assert_eq!(rank_of(3, [1, 3, 5].into_iter()), (1, 3));
        assert_eq!(rank_of(9, [1, 3, 5].into_iter()), (3, 3));
    }
}
