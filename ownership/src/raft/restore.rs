//! A node's data folder made from a backup (`ownerserve ctl directory restore`), offline,
//! as etcd's `snapshot restore` does: every node of the new cluster gets the same
//! snapshot, with the new cluster's members, and starts from it; no node has a log yet.
//!
//! Why not install the backup on a running cluster: a snapshot replaces history, which a
//! Raft log cannot carry but as one entry holding the whole state, and openraft installs
//! a snapshot only on a follower, from its leader. A fresh cluster whose nodes all start
//! from the same snapshot needs neither.
//!
//! What the restored state changes:
//! - its last log id keeps the backup's index (epochs are derived from log positions, so
//!   every later owner change gets a higher one) with term 0, so the new cluster's first
//!   election (term 1) is newer than anything in its log;
//! - its members are the new cluster's;
//! - every lease lasts at least one of its TTLs from the restore (as a new etcd leader
//!   extends leases on election): the routers still running renew them and keep their
//!   sessions, and the others' expire one TTL later.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use openraft::storage::SnapshotMeta;
use openraft::{BasicNode, CommittedLeaderId, LogId, Membership, StoredMembership};

use super::format::{FormatError, SnapshotFile};
use super::state_machine::SNAPSHOT_FILE;
use super::NodeId;

/// What a restore wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// The log index the new cluster starts after.
    pub index: u64,
    pub sessions: usize,
    pub leases: usize,
    pub artifacts: usize,
}

/// Why a data folder could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error("the backup holds no applied entry: nothing to restore")]
    Empty,
    #[error("{} already holds a node's data: restore into a new folder", path.display())]
    NotFresh { path: PathBuf },
    #[error("cannot create {}", path.display())]
    Folder {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the new cluster needs at least one member")]
    NoMembers,
}

/// Writes `data_dir/snapshot.json` for a node of the cluster `members` from `backup`,
/// at `now_ms` (Unix ms): the folder must not hold a node's data already.
pub fn restore(
    backup: &SnapshotFile,
    members: &BTreeMap<NodeId, BasicNode>,
    now_ms: u64,
    data_dir: &Path,
) -> Result<Restored, RestoreError> {
    if members.is_empty() {
        return Err(RestoreError::NoMembers);
    }
    for name in [SNAPSHOT_FILE, "log.redb"] {
        let path = data_dir.join(name);
        if path.exists() {
            return Err(RestoreError::NotFresh { path });
        }
    }
    let mut state = backup.state()?;
    let index = state.last_applied.ok_or(RestoreError::Empty)?.index;
    let last = LogId::new(CommittedLeaderId::new(0, 0), index);
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    state.last_applied = Some(last);
    state.membership =
        StoredMembership::new(Some(last), Membership::new(vec![voters], members.clone()));
    for lease in state.directory.leases.values_mut() {
        lease.expires_at_ms = lease.expires_at_ms.max(now_ms.saturating_add(lease.ttl_ms));
    }
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: state.membership.clone(),
        snapshot_id: format!("restored-{index}"),
    };
    let file = SnapshotFile::of(meta, &state)?;
    std::fs::create_dir_all(data_dir).map_err(|source| RestoreError::Folder {
        path: data_dir.to_owned(),
        source,
    })?;
    file.write(&data_dir.join(SNAPSHOT_FILE))?;
    let d = &state.directory;
    Ok(Restored {
        index,
        sessions: d.sessions.len(),
        leases: d.leases.len(),
        artifacts: d.artifacts.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkerId;
    use crate::raft::state_machine::MachineState;
    use crate::state::Lease;

    fn backup() -> SnapshotFile {
        let mut state = MachineState::default();
        state.directory.leases.insert(
            crate::ids::LeaseId(7),
            Lease {
                worker: WorkerId(0),
                ttl_ms: 6_000,
                expires_at_ms: 1_000,
                keys: Default::default(),
            },
        );
        state.last_applied = Some(LogId::new(CommittedLeaderId::new(3, 1), 42));
        SnapshotFile::of(SnapshotMeta::default(), &state).unwrap()
    }

    #[test]
    fn a_restored_node_starts_after_the_backup_s_index_in_term_0_with_the_new_members() {
        let dir = std::env::temp_dir().join(format!("ownerserve-restore-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let members: BTreeMap<NodeId, BasicNode> = [(4, BasicNode::new("10.0.0.4:7000"))].into();
        let done = restore(&backup(), &members, 50_000, &dir).unwrap();
        assert_eq!((done.index, done.leases), (42, 1));
        let file = SnapshotFile::parse(&std::fs::read(dir.join(SNAPSHOT_FILE)).unwrap()).unwrap();
        let state = file.state().unwrap();
        let last = LogId::new(CommittedLeaderId::new(0, 0), 42);
        assert_eq!(state.last_applied, Some(last));
        assert_eq!(file.meta.last_log_id, Some(last));
        assert_eq!(state.membership.voter_ids().collect::<Vec<_>>(), [4]);
        // The lease lasts one TTL from the restore.
        let lease = &state.directory.leases[&crate::ids::LeaseId(7)];
        assert_eq!(lease.expires_at_ms, 56_000);
        // Never over a node's data.
        assert!(matches!(
            restore(&backup(), &members, 50_000, &dir),
            Err(RestoreError::NotFresh { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
