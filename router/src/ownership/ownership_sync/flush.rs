//! The sync task: renews the leases, batches the queued records into the directory, and
//! holds (bounded) the records that wait for a lease, for the flush in flight, or to be
//! tried again after a write the directory did not answer. A record is written, or
//! dropped and counted (`ownerserve_ownership_records_dropped_total`): never lost quietly.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ownerserve_ownership::command::MAX_BATCH;
use ownerserve_ownership::ids::LeaseId;
use ownerserve_ownership::node::DirectoryClient;
use ownerserve_ownership::{Command, Outcome, Rejection};
use ownerserve_planner::ids::WorkerId;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::commands::commands_for;
use super::leases::{keep_or_grant, lease_to_write};
use super::{Leases, Routed, SyncSettings};
use crate::fleet::registry::Registry;

/// Most records the sync holds besides its channel: waiting for a lease, or for the flush
/// in flight to finish (beyond, dropped and counted; each record holds a prompt's tokens).
pub(super) const MAX_WAITING: usize = 1024;

pub(super) async fn run(
    client: Arc<dyn DirectoryClient>,
    registry: Arc<Registry>,
    s: SyncSettings,
    mut rx: mpsc::Receiver<Routed>,
    shared: Leases,
) {
    let ttl_ms = s.lease_ttl.as_millis() as u64;
    let mut leases: HashMap<WorkerId, LeaseId> = HashMap::new();
    let every = (s.lease_ttl / 3).max(Duration::from_millis(50));
    let mut renew = tokio::time::interval(every);
    let mut flush = tokio::time::interval(s.flush_every.max(Duration::from_millis(5)));
    // Not a burst of catch-up ticks after a long flush.
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: Vec<Routed> = Vec::new();
    // One flush in flight, off this loop: a directory slow to commit (a starved or
    // fsync-bound leader: 1-30 s measured beside three CPU vLLM engines on 2 cores) must
    // not hold up the renewals until the leases lapse. Dropped with the loop at shutdown.
    let mut writing: JoinSet<Unwritten> = JoinSet::new();
    loop {
        tokio::select! {
            // While `pending` is full the channel fills instead, and `record` counts drops.
            r = rx.recv(), if pending.len() < MAX_WAITING => match r {
                Some(r) => pending.push(r),
                None => return,
            },
            _ = renew.tick() => {
                // Renew healthy workers' leases (grant one to a healthy worker without), all
                // at once and each within a renewal period, so one slow answer (an election)
                // cannot let the others lapse.
                let mut renewals = tokio::task::JoinSet::new();
                for w in registry.all().iter().filter(|w| w.is_healthy()) {
                    let (client, known, id) = (client.clone(), leases.get(&w.id).copied(), w.id);
                    let name = w.spec.name.clone();
                    renewals.spawn(async move {
                        let kept = keep_or_grant(&*client, known, id, ttl_ms);
                        (id, name, tokio::time::timeout(every, kept).await.ok().flatten())
                    });
                }
                while let Some(Ok((id, name, lease))) = renewals.join_next().await {
                    match lease {
                        Some(lease) => {
                            leases.insert(id, lease);
                            shared.lock().unwrap_or_else(|e| e.into_inner()).insert(id, lease);
                        }
                        None => tracing::warn!(worker = %name, "no directory lease"),
                    }
                }
            }
            Some(done) = writing.join_next() => {
                let Unwritten { lapsed, failed, refused } = done.unwrap_or_default();
                if refused > 0 {
                    s.dropped.inc_by(refused as u64);
                }
                // Batches the directory did not answer for (a leader killed or electing):
                // tried again, first, until written or dropped for room (counted).
                let mut retry = failed;
                for Lapsed { worker, lease, records } in lapsed {
                    // The directory ended the lease (it was not renewed in time): the next
                    // renewal grants a new one, and these records wait for it.
                    if leases.get(&worker) == Some(&lease) {
                        leases.remove(&worker);
                    }
                    retry.extend(records);
                }
                // Older than what arrived meanwhile: they go first, so a session's records
                // still land in the order its steps were served.
                retry.append(&mut pending);
                pending = retry;
            }
            _ = flush.tick(), if writing.is_empty() => {
                // Records of a worker without a lease (the directory may still be electing a
                // leader, or the lease lapsed) wait for one, up to a bound.
                let (ready, waiting): (Vec<Routed>, Vec<Routed>) =
                    pending.drain(..).partition(|r| leases.contains_key(&r.worker));
                pending = waiting;
                if pending.len() > MAX_WAITING {
                    let dropped = pending.len() - MAX_WAITING;
                    pending.drain(..dropped);
                    s.dropped.inc_by(dropped as u64);
                    tracing::warn!(dropped, "ownership records dropped: no directory lease");
                }
                if !ready.is_empty() {
                    let (client, leases) = (client.clone(), leases.clone());
                    writing.spawn(async move {
                        write_records(&*client, ready, &leases, s.block_size).await
                    });
                }
            }
        }
    }
}

/// Records the directory refused because their worker's lease had ended.
pub(super) struct Lapsed {
    worker: WorkerId,
    lease: LeaseId,
    records: Vec<Routed>,
}

/// What a flush did not write: records refused for a lease that ended (they wait for the
/// next one), records of batches the directory did not answer (tried again), and how
/// many records a batch refused as a whole (dropped, counted).
#[derive(Default)]
pub(super) struct Unwritten {
    pub lapsed: Vec<Lapsed>,
    pub failed: Vec<Routed>,
    pub refused: usize,
}

/// Writes the records' commands in batches of whole records, so that a refusal maps back
/// to the records it touched; returns what was not written (the rest are written, or
/// refused for good one command at a time, e.g. fenced).
pub(super) async fn write_records(
    client: &dyn DirectoryClient,
    ready: Vec<Routed>,
    leases: &HashMap<WorkerId, LeaseId>,
    block_size: usize,
) -> Unwritten {
    // Each batch with its records, their leases and how many of its commands each made.
    type Of = Vec<(Routed, LeaseId, usize)>;
    let mut batches: Vec<(Vec<Command>, Of)> = Vec::new();
    for r in ready {
        let Some(lease) = lease_to_write(client, r.worker, leases.get(&r.worker).copied()) else {
            continue;
        };
        let commands = commands_for(&r, lease, block_size);
        let n = commands.len();
        match batches.last_mut() {
            Some((batch, of)) if batch.len() + n <= MAX_BATCH => {
                batch.extend(commands);
                of.push((r, lease, n));
            }
            _ => batches.push((commands, vec![(r, lease, n)])),
        }
    }
    let mut out = Unwritten::default();
    for (batch, of) in batches {
        let outcomes = match client.write(Command::Batch { commands: batch }).await {
            Ok(Outcome::Batch { outcomes }) => outcomes,
            Ok(other) => {
                tracing::warn!(outcome = ?other, "ownership records refused");
                out.refused += of.len();
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "ownership records not committed; retrying");
                out.failed.extend(of.into_iter().map(|(r, _, _)| r));
                continue;
            }
        };
        let mut outcomes = outcomes.into_iter();
        for (r, lease, n) in of {
            let ended = outcomes.by_ref().take(n).any(|o| {
                matches!(
                    o,
                    Outcome::Rejected(Rejection::UnknownLease(_) | Rejection::LeaseExpired(_))
                )
            });
            if !ended {
                continue;
            }
            match out.lapsed.iter_mut().find(|l| l.lease == lease) {
                Some(l) => l.records.push(r),
                None => out.lapsed.push(Lapsed {
                    worker: r.worker,
                    lease,
                    records: vec![r],
                }),
            }
        }
    }
    out
}
