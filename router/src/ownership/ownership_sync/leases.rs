//! The workers' directory leases: one per worker, shared by every router of a cluster
//! (the lowest live one), renewed while the worker is healthy.

use super::commands::dir_worker;
use ownerserve_ownership::ids::{LeaseId, WorkerId as DirWorkerId};
use ownerserve_ownership::node::DirectoryClient;
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::WorkerId;

/// The live lease of `worker` with the lowest id in the local copy of the directory: every
/// router of a cluster converges on it, so a worker has one lease however many routers
/// renew it (a lease one router granted in a race with another simply expires).
pub(super) fn shared_lease(client: &dyn DirectoryClient, worker: DirWorkerId) -> Option<LeaseId> {
    let mut found = None;
    client.read_local(&mut |d| {
        found = d
            .leases
            .iter()
            .find(|(id, l)| l.worker == worker && d.lease_live(**id))
            .map(|(id, _)| *id);
    });
    found
}

/// The lease a command for `worker` goes under: the shared one first (routers that
/// granted at once converge on it, and a session claimed or recorded under the other one
/// would lose its owner when that one lapses, since no router renews it), else the one
/// this router renews (`own`), so a router that has not renewed yet can still write.
pub(super) fn lease_to_write(
    client: &dyn DirectoryClient,
    worker: WorkerId,
    own: Option<LeaseId>,
) -> Option<LeaseId> {
    shared_lease(client, dir_worker(worker)).or(own)
}

/// Renews the worker's shared lease (or the one this router knows), or grants one.
pub(super) async fn keep_or_grant(
    client: &dyn DirectoryClient,
    known: Option<LeaseId>,
    worker: WorkerId,
    ttl_ms: u64,
) -> Option<LeaseId> {
    let shared = shared_lease(client, dir_worker(worker));
    for lease in shared
        .into_iter()
        .chain(known.filter(|k| Some(*k) != shared))
    {
        let kept = client.write(Command::KeepAlive { lease }).await;
        if matches!(kept, Ok(Outcome::LeaseRenewed { .. })) {
            return Some(lease);
        }
        // The lease ended before this renewal (its sessions lost their owner): worth an
        // operator's attention, unlike a renewal that merely timed out.
        if let Ok(Outcome::Rejected(why)) = &kept {
            tracing::warn!(worker = %worker, lease = lease.0, ?why, "directory lease ended before its renewal");
        }
    }
    // Another router may have granted one since the local copy was read: catch up and
    // look again before granting a second.
    if client.catch_up().await {
        if let Some(lease) = shared_lease(client, dir_worker(worker)) {
            let kept = client.write(Command::KeepAlive { lease }).await;
            if matches!(kept, Ok(Outcome::LeaseRenewed { .. })) {
                return Some(lease);
            }
        }
    }
    let granted = client
        .write(Command::GrantLease {
            worker: dir_worker(worker),
            ttl_ms,
        })
        .await;
    match granted {
        Ok(Outcome::LeaseGranted { lease, .. }) => Some(lease),
        _ => None,
    }
}
