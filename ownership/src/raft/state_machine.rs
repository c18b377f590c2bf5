//! The replicated state machine: the pure [`Directory`] plus what openraft needs beside it
//! (last applied log id, membership), with snapshots written atomically to a file
//! (tmp file, fsync, rename, fsync of the folder) and loaded again at start.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};

use super::feed::Feed;
use super::{io_err, NodeId, TypeConfig};
use crate::{Directory, Outcome};

/// Everything a snapshot holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MachineState {
    pub directory: Directory,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    data: Vec<u8>,
}

/// Shared handle to a node's state machine; clones see the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    state: Arc<RwLock<MachineState>>,
    snapshot: Arc<Mutex<Option<StoredSnapshot>>>,
    /// Where the current snapshot is kept (`None`: memory only, for tests).
    path: Option<PathBuf>,
    /// The entries applied lately, for the routers that follow this node.
    feed: Arc<Feed>,
}

type StoreResult<T> = Result<T, StorageError<NodeId>>;

impl StateMachineStore {
    /// A state machine whose snapshots live in `dir/snapshot.json`; loads it if present.
    pub fn open(dir: Option<&Path>, grace_ms: u64) -> std::io::Result<Self> {
        let path = dir.map(|d| d.join("snapshot.json"));
        let mut state = MachineState {
            directory: Directory::new(grace_ms),
            ..MachineState::default()
        };
        let mut snapshot = None;
        if let Some(p) = path.as_ref().filter(|p| p.exists()) {
            let bytes = std::fs::read(p)?;
            let stored: StoredSnapshot =
                serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
            state = serde_json::from_slice(&stored.data).map_err(std::io::Error::other)?;
            snapshot = Some(stored);
        }
        let last = state.last_applied.map_or(0, |l| l.index);
        Ok(Self {
            state: Arc::new(RwLock::new(state)),
            snapshot: Arc::new(Mutex::new(snapshot)),
            path,
            feed: Arc::new(Feed::new(last)),
        })
    }

    /// Reads the current state (a local, possibly stale, view on followers).
    pub fn read<T>(&self, f: impl FnOnce(&MachineState) -> T) -> T {
        f(&self.state.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// The entries applied lately (pushed under the state's write lock, so a state read
    /// at index `i` is followed in the feed by exactly the entries after `i`).
    pub fn feed(&self) -> &Feed {
        &self.feed
    }

    fn persist(&self, stored: &StoredSnapshot) -> StoreResult<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let sig = Some(stored.meta.signature());
        let write = || -> std::io::Result<()> {
            let tmp = path.with_extension("tmp");
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&serde_json::to_vec(stored).map_err(std::io::Error::other)?)?;
            f.sync_all()?;
            std::fs::rename(&tmp, path)?;
            if let Some(dir) = path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| StorageIOError::write_snapshot(sig, openraft::AnyError::new(&e)).into())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let (data, last_applied, membership) = {
            let st = self.state.read().unwrap_or_else(|e| e.into_inner());
            let data = serde_json::to_vec(&*st)
                .map_err(|e| io_err(StorageIOError::read_state_machine, &e))?;
            (data, st.last_applied, st.membership.clone())
        };
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}", l.leader_id, l.index),
            None => "empty".to_owned(),
        };
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id,
        };
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: data.clone(),
        };
        self.persist(&stored)?;
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(stored);
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StoreResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        Ok(self.read(|s| (s.last_applied, s.membership.clone())))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<Option<Outcome>>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut st = self.state.write().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for entry in entries {
            st.last_applied = Some(entry.log_id);
            let index = entry.log_id.index;
            out.push(match entry.payload {
                EntryPayload::Blank => {
                    self.feed.push(index, None);
                    None
                }
                EntryPayload::Normal(env) => {
                    let outcome = st.directory.apply(index, &env);
                    self.feed.push(index, Some(env));
                    Some(outcome)
                }
                EntryPayload::Membership(m) => {
                    st.membership = StoredMembership::new(Some(entry.log_id), m);
                    self.feed.push(index, None);
                    None
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let data = snapshot.into_inner();
        let state: MachineState = serde_json::from_slice(&data).map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                openraft::AnyError::new(&e),
            ))
        })?;
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        self.persist(&stored)?;
        let last = state.last_applied.map_or(0, |l| l.index);
        let mut current = self.state.write().unwrap_or_else(|e| e.into_inner());
        *current = state;
        self.feed.reset(last);
        drop(current);
        *self.snapshot.lock().unwrap_or_else(|e| e.into_inner()) = Some(stored);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        Ok(self
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(|s| Snapshot {
                meta: s.meta,
                snapshot: Box::new(Cursor::new(s.data)),
            }))
    }
}
