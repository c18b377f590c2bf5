//! The ownership directory and its Raft node: the state's size (leases, prefixes by
//! owner state, sessions and forks, pinned sessions) and the replicated counters of ownership changes (forks,
//! migrations, lease expiries and revocations), read at scrape time; commands proposed
//! through this node by kind and result, and how long each took to commit and apply;
//! Raft's term, leader, log, commit and apply indexes from openraft's metrics.

use std::time::Duration;

use openraft::ServerState;
use prometheus::{GaugeVec, Histogram, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use crate::{Command, Outcome};

use ownerserve_edge::exposition::{
    counter_vec, gauge_vec, histogram, int_gauge, int_gauge_vec, sync_counter, LATENCY_BUCKETS,
};

use super::Node;

/// Every command kind, to start their counters at zero.
const COMMANDS: [&str; 18] = [
    "grant_lease",
    "keep_alive",
    "revoke_lease",
    "claim",
    "extend",
    "release",
    "forget_artifact",
    "replicate_read_only",
    "migrate",
    "set_decode_owner",
    "fork",
    "end_session",
    "demote_session",
    "pin_session",
    "label_session",
    "record_response",
    "tick",
    "batch",
];

/// Every rejection reason, likewise.
const REJECTIONS: [&str; 14] = [
    "unknown_lease",
    "lease_expired",
    "unknown_prefix",
    "unknown_session",
    "session_exists",
    "stale_epoch",
    "not_ready",
    "no_owner",
    "stale_retry",
    "bad_batch",
    "pinned",
    "bad_response_id",
    "referenced",
    "recently_accessed",
];

const STATES: [(ServerState, &str); 5] = [
    (ServerState::Leader, "leader"),
    (ServerState::Follower, "follower"),
    (ServerState::Candidate, "candidate"),
    (ServerState::Learner, "learner"),
    (ServerState::Shutdown, "shutdown"),
];

/// Raft figures read from openraft's metrics, each its own gauge.
const RAFT_FIGURES: [(&str, &str); 8] = [
    ("ownerserve_raft_node_id", "This node's Raft id."),
    ("ownerserve_raft_term", "Current Raft term (a rising term means elections)."),
    ("ownerserve_raft_leader_id", "The leader's node id as this node knows it (0: none)."),
    ("ownerserve_raft_last_log_index", "Index of the last entry in this node's log."),
    ("ownerserve_raft_committed_index", "Commit index: the highest index a quorum of voters matched (on the leader; the applied index elsewhere)."),
    ("ownerserve_raft_applied_index", "Index of the last entry applied to this node's state machine."),
    ("ownerserve_raft_voters", "Voting members of the cluster, as this node sees the membership."),
    ("ownerserve_raft_learners", "Non-voting members of the cluster."),
];

/// The directory node's metrics.
#[derive(Debug, Clone)]
pub struct DirectoryMetrics {
    leases: IntGauge,
    /// What this node keeps of its applied entries for the routers that follow it
    /// (`raft::feed`), estimated bytes.
    feed_bytes: IntGauge,
    prefixes: IntGaugeVec,
    sessions: IntGaugeVec,
    pinned: IntGauge,
    responses: IntGaugeVec,
    changes: IntCounterVec,
    commands: IntCounterVec,
    rejections: IntCounterVec,
    apply_latency: Histogram,
    raft: Vec<IntGauge>,
    quorum_ack_age: GaugeVec,
    raft_state: IntGaugeVec,
}

impl DirectoryMetrics {
    /// Registers the directory metrics; every label set starts at zero.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self {
            leases: int_gauge(
                registry,
                "ownerserve_directory_leases",
                "Worker leases in this node's directory state.",
            )?,
            feed_bytes: int_gauge(
                registry,
                "ownerserve_directory_feed_bytes",
                "Estimated bytes of the applied entries this node keeps for the routers that follow it (at most 65,536 entries or 64 MiB).",
            )?,
            prefixes: int_gauge_vec(
                registry,
                "ownerserve_directory_prefixes",
                "Prefix artifacts in this node's directory state, by state: owned (a live owner), recompute (the owner died with no copy), unowned (released).",
                &["state"],
            )?,
            sessions: int_gauge_vec(
                registry,
                "ownerserve_directory_sessions",
                "Sessions in this node's directory state, by kind: root or fork (a child of another session).",
                &["kind"],
            )?,
            pinned: int_gauge(
                registry,
                "ownerserve_directory_pinned_sessions",
                "Sessions an operator pinned to their decode owner.",
            )?,
            responses: int_gauge_vec(
                registry,
                "ownerserve_directory_stored_responses",
                "Stored responses (OpenAI Responses, store: true) recorded in this node's directory state, by state: held (its worker has a live lease), lapsed (its worker's last lease lapsed: it waits three TTLs for the worker to come back) or lost (its worker left or did not come back).",
                &["state"],
            )?,
            changes: counter_vec(
                registry,
                "ownerserve_directory_changes_total",
                "Ownership changes applied (replicated: every node reports the cluster's totals): fork, prefix_migration, session_move, lease_expiry, lease_revocation.",
                &["change"],
            )?,
            commands: counter_vec(
                registry,
                "ownerserve_directory_commands_total",
                "Directory commands proposed through this node and applied, by command (batches counted per command) and result (ok or rejected).",
                &["command", "result"],
            )?,
            rejections: counter_vec(
                registry,
                "ownerserve_directory_rejections_total",
                "Directory commands refused, by reason (stale_epoch is fencing at work).",
                &["reason"],
            )?,
            apply_latency: histogram(
                registry,
                "ownerserve_raft_apply_latency_seconds",
                "Time from proposing an entry on this node until it was committed and applied (openraft client_write).",
                LATENCY_BUCKETS,
            )?,
            raft: RAFT_FIGURES
                .iter()
                .map(|(name, help)| int_gauge(registry, name, help))
                .collect::<prometheus::Result<_>>()?,
            quorum_ack_age: gauge_vec(
                registry,
                "ownerserve_raft_quorum_ack_age_seconds",
                "Time since a quorum last acknowledged the leader (leader only).",
                &[],
            )?,
            raft_state: int_gauge_vec(
                registry,
                "ownerserve_raft_state",
                "1 for this Raft node's current state (leader, follower, candidate, learner, shutdown).",
                &["state"],
            )?,
        };
        for c in COMMANDS {
            for r in ["ok", "rejected"] {
                m.commands.with_label_values(&[c, r]);
            }
        }
        for r in REJECTIONS {
            m.rejections.with_label_values(&[r]);
        }
        for state in ["held", "lost"] {
            m.responses.with_label_values(&[state]);
        }
        Ok(m)
    }

    /// A proposal through this node was committed and applied after `elapsed`.
    pub fn applied(&self, names: &[&'static str], outcome: Option<&Outcome>, elapsed: Duration) {
        self.apply_latency.observe(elapsed.as_secs_f64());
        let Some(outcome) = outcome else { return };
        match outcome {
            Outcome::Batch { outcomes } => {
                for (name, o) in names.iter().zip(outcomes) {
                    self.count(name, o);
                }
            }
            o => {
                if let Some(name) = names.first() {
                    self.count(name, o);
                }
            }
        }
    }

    fn count(&self, command: &str, outcome: &Outcome) {
        let rejected = match outcome {
            Outcome::Rejected(r) => Some(r),
            _ => None,
        };
        let result = if rejected.is_some() { "rejected" } else { "ok" };
        self.commands.with_label_values(&[command, result]).inc();
        if let Some(r) = rejected {
            self.rejections.with_label_values(&[r.name()]).inc();
        }
    }

    /// Reads the node's state and Raft metrics into the gauges.
    pub fn refresh(&self, node: &Node) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        let stats = node.machine.read(|s| {
            let d = &s.directory;
            let owned = d.artifacts.values().filter(|a| a.owner.is_some()).count();
            let recompute = d
                .artifacts
                .values()
                .filter(|a| a.owner.is_none() && a.needs_recompute)
                .count();
            let unowned = d.artifacts.len() - owned - recompute;
            for (state, n) in [
                ("owned", owned),
                ("recompute", recompute),
                ("unowned", unowned),
            ] {
                self.prefixes.with_label_values(&[state]).set(count(n));
            }
            let forks = d.sessions.values().filter(|x| x.parent.is_some()).count();
            for (kind, n) in [("root", d.sessions.len() - forks), ("fork", forks)] {
                self.sessions.with_label_values(&[kind]).set(count(n));
            }
            self.pinned
                .set(count(d.sessions.values().filter(|x| x.pinned).count()));
            self.leases.set(count(d.leases.len()));
            let lost = d.responses.values().filter(|r| r.lost).count();
            let lapsed = d
                .responses
                .values()
                .filter(|r| r.lapsed_until_ms.is_some())
                .count();
            for (state, n) in [
                ("held", d.responses.len() - lost - lapsed),
                ("lapsed", lapsed),
                ("lost", lost),
            ] {
                self.responses.with_label_values(&[state]).set(count(n));
            }
            d.stats
        });
        for (change, total) in [
            ("fork", stats.forks),
            ("prefix_migration", stats.prefix_migrations),
            ("session_move", stats.session_moves),
            ("lease_expiry", stats.lease_expiries),
            ("lease_revocation", stats.lease_revocations),
        ] {
            sync_counter(&self.changes.with_label_values(&[change]), total);
        }
        self.feed_bytes.set(count(node.machine.feed().bytes()));
        let m = node.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: Vec<u64> = membership.voter_ids().collect();
        let applied = m.last_applied.map_or(0, |l| l.index);
        let committed = m
            .replication
            .as_ref()
            .map_or(applied, |r| quorum_index(&voters, r));
        let leader = m.state == ServerState::Leader;
        let figures = [
            node.id,
            m.current_term,
            m.current_leader.unwrap_or(0),
            m.last_log_index.unwrap_or(0),
            committed,
            applied,
            voters.len() as u64,
            membership.learner_ids().count() as u64,
        ];
        for (gauge, v) in self.raft.iter().zip(figures) {
            gauge.set(i64::try_from(v).unwrap_or(i64::MAX));
        }
        // Only a leader has a quorum acknowledgement to age; elsewhere there is no sample.
        match m.millis_since_quorum_ack.filter(|_| leader) {
            Some(ms) => self
                .quorum_ack_age
                .with_label_values(&[] as &[&str])
                .set(ms as f64 / 1000.0),
            None => {
                let _ = self.quorum_ack_age.remove_label_values(&[] as &[&str]);
            }
        }
        for (state, name) in STATES {
            self.raft_state
                .with_label_values(&[name])
                .set(i64::from(m.state == state));
        }
    }
}

/// The names of a proposal's commands (a batch's, in order), for [`DirectoryMetrics::applied`].
pub fn command_names(command: &Command) -> Vec<&'static str> {
    match command {
        Command::Batch { commands } => commands.iter().map(Command::name).collect(),
        c => vec![c.name()],
    }
}

/// The highest log index a majority of `voters` has (the leader's commit index).
fn quorum_index(
    voters: &[u64],
    matched: &std::collections::BTreeMap<u64, Option<openraft::LogId<u64>>>,
) -> u64 {
    let mut indexes: Vec<u64> = voters
        .iter()
        .map(|v| matched.get(v).copied().flatten().map_or(0, |l| l.index))
        .collect();
    indexes.sort_unstable_by(|a, b| b.cmp(a));
    indexes.get(voters.len() / 2).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

    use std::collections::BTreeMap;

    use openraft::{CommittedLeaderId, LogId};

    use crate::ids::{Epoch, LeaseId, SessionId};
    use crate::Rejection;

    use super::*;

    fn log(index: u64) -> Option<LogId<u64>> {
        Some(LogId::new(CommittedLeaderId::new(1, 1), index))
    }

    #[test]
    fn the_commit_index_is_what_a_majority_of_voters_matched() {
        let matched = BTreeMap::from([(1, log(9)), (2, log(7)), (3, None), (4, log(3))]);
        assert_eq!(quorum_index(&[1, 2, 3], &matched), 7);
        assert_eq!(quorum_index(&[1, 2, 3, 4, 5], &matched), 3);
        assert_eq!(quorum_index(&[1], &matched), 9);
    }

    #[test]
    fn batches_count_per_command_and_rejections_by_reason() {
        let registry = Registry::new();
        let m = DirectoryMetrics::register(&registry).unwrap();
        let stale = Rejection::StaleEpoch {
            current: Epoch(2),
            given: Epoch(1),
        };
        assert!(REJECTIONS.contains(&stale.name()));
        let batch = Command::Batch {
            commands: vec![
                Command::KeepAlive { lease: LeaseId(1) },
                Command::EndSession {
                    session: SessionId("s".into()),
                    epoch: Epoch(1),
                },
            ],
        };
        let names = command_names(&batch);
        assert!(names.iter().all(|n| COMMANDS.contains(n)));
        let outcome = Outcome::Batch {
            outcomes: vec![
                Outcome::LeaseRenewed { expires_at_ms: 1 },
                Outcome::Rejected(stale),
            ],
        };
        m.applied(&names, Some(&outcome), Duration::from_millis(3));
        let text = ownerserve_edge::exposition::render(&registry);
        for line in [
            "ownerserve_directory_commands_total{command=\"keep_alive\",result=\"ok\"} 1",
            "ownerserve_directory_commands_total{command=\"end_session\",result=\"rejected\"} 1",
            "ownerserve_directory_commands_total{command=\"fork\",result=\"ok\"} 0",
            "ownerserve_directory_rejections_total{reason=\"stale_epoch\"} 1",
            "ownerserve_raft_apply_latency_seconds_count 1",
        ] {
            assert!(text.contains(line), "missing {line}\n{text}");
        }
    }
}
