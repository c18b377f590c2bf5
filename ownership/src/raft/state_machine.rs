//! The replicated state machine: the pure [`Directory`] plus what openraft needs beside it
//! (last applied log id, membership), with snapshots written atomically to a file
//! ([`SnapshotFile`], read back in any format this release reads) and loaded again at
//! start.
//!
//! A snapshot of a large state takes seconds of CPU (a million sessions: 230 MB of JSON).
//! `apply` waits only for a copy of the state, taken under its lock; the encoding, the
//! file's write and fsync, and an installed snapshot's parsing run on a blocking thread,
//! off the async runtime's threads that serve the node's Raft RPCs and writes meanwhile.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot, SnapshotMeta};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, StorageError, StorageIOError, StoredMembership,
};

use super::feed::Feed;
pub use super::format::MachineState;
use super::format::{Format, FormatError, SnapshotFile};
use super::{io_err, NodeId, TypeConfig};
use crate::version::Version;
use crate::{Directory, Outcome};

/// The snapshot's file in a node's data folder.
pub const SNAPSHOT_FILE: &str = "snapshot.json";

/// Why a node's snapshot could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// Shared handle to a node's state machine; clones see the same state.
#[derive(Clone)]
pub struct StateMachineStore {
    state: Arc<RwLock<MachineState>>,
    snapshot: Arc<Mutex<Option<SnapshotFile>>>,
    /// Where the current snapshot is kept (`None`: memory only, for tests).
    path: Option<PathBuf>,
    /// The entries applied lately, for the routers that follow this node.
    feed: Arc<Feed>,
}

type StoreResult<T> = Result<T, StorageError<NodeId>>;

impl StateMachineStore {
    /// A state machine whose snapshots live in `dir/snapshot.json`; loads it if present.
    ///
    /// Without a snapshot the directory starts at version 1, as 0.1.0's did: its version
    /// changes only through the log (`Command::SetVersion`), so a node that replays a log
    /// from its start passes through each version at the entry the others did.
    pub fn open(dir: Option<&Path>, grace_ms: u64) -> Result<Self, OpenError> {
        let path = dir.map(|d| d.join(SNAPSHOT_FILE));
        let mut state = MachineState {
            directory: Directory {
                version: Version::FIRST,
                ..Directory::new(grace_ms)
            },
            ..MachineState::default()
        };
        let mut snapshot = None;
        if let Some(p) = path.as_ref().filter(|p| p.exists()) {
            let bytes = std::fs::read(p).map_err(|source| OpenError::Read {
                path: p.clone(),
                source,
            })?;
            let file = SnapshotFile::parse(&bytes)?;
            state = file.state()?;
            snapshot = Some(file);
        }
        let last = state.last_applied.map_or(0, |l| l.index);
        let feed = Feed::new(last);
        if let Some(file) = &snapshot {
            feed.fit_to_snapshot(file.data.len());
        }
        Ok(Self {
            state: Arc::new(RwLock::new(state)),
            snapshot: Arc::new(Mutex::new(snapshot)),
            path,
            feed: Arc::new(feed),
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

    /// The state now, as a snapshot file: what a snapshot and a backup
    /// (`GET /admin/v1/snapshot`) hold. The state is copied under its lock and encoded
    /// after it is released, so `apply` waits for the copy only; the encoding takes
    /// seconds for a large state: call this off the async runtime's threads.
    pub fn snapshot_file(&self) -> Result<SnapshotFile, FormatError> {
        let (meta, state) = {
            let st = self.state.read().unwrap_or_else(|e| e.into_inner());
            let snapshot_id = match st.last_applied {
                Some(l) => format!("{}-{}", l.leader_id, l.index),
                None => "empty".to_owned(),
            };
            let meta = SnapshotMeta {
                last_log_id: st.last_applied,
                last_membership: st.membership.clone(),
                snapshot_id,
            };
            (meta, st.clone())
        };
        SnapshotFile::of(meta, &state)
    }

    /// Writes `file` as the current snapshot and keeps it, unless `built` (this node's own
    /// build) and a newer one is kept already: a build runs beside `install_snapshot`, and
    /// one that ends after a newer snapshot was installed must not replace it, on disk or
    /// in memory (a restart would load the older one, short of the log the install
    /// truncated). Holds the current snapshot's lock while it writes, so the two are
    /// written one after the other.
    fn keep(&self, file: SnapshotFile, built: bool) -> StoreResult<()> {
        let mut current = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if built
            && current
                .as_ref()
                .is_some_and(|c| c.meta.last_log_id > file.meta.last_log_id)
        {
            return Ok(());
        }
        if let Some(path) = &self.path {
            file.write(path).map_err(|e| {
                StorageError::from(StorageIOError::write_snapshot(
                    Some(file.meta.signature()),
                    openraft::AnyError::new(&e),
                ))
            })?;
        }
        self.feed.fit_to_snapshot(file.data.len());
        *current = Some(file);
        Ok(())
    }
}

/// Runs `f` on a blocking thread (CPU-bound work of seconds: encoding, parsing, writing a
/// snapshot), off the async runtime's threads; `make` labels a thread that panicked.
async fn off_runtime<T: Send + 'static>(
    make: fn(openraft::AnyError) -> StorageIOError<NodeId>,
    f: impl FnOnce() -> StoreResult<T> + Send + 'static,
) -> StoreResult<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(done) => done,
        Err(e) => Err(io_err(make, &e)),
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let store = self.clone();
        off_runtime(StorageIOError::read_state_machine, move || {
            let file = store
                .snapshot_file()
                .map_err(|e| io_err(StorageIOError::read_state_machine, &e))?;
            let snapshot = Snapshot {
                meta: file.meta.clone(),
                snapshot: Box::new(Cursor::new(file.data.clone())),
            };
            store.keep(file, true)?;
            Ok(snapshot)
        })
        .await
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
            // An entry raising the directory to rules this release does not know: applied
            // by older rules it would diverge from the nodes that know them, so the node
            // stops (openraft's storage error is fatal) until it runs a newer release.
            if let EntryPayload::Normal(env) = &entry.payload {
                if let Err(e) = env.command.check_known_version() {
                    tracing::error!(index = entry.log_id.index, error = %e, "directory entry not applied");
                    return Err(
                        StorageIOError::apply(entry.log_id, openraft::AnyError::new(&e)).into(),
                    );
                }
            }
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
        let (store, meta) = (self.clone(), meta.clone());
        let state = off_runtime(StorageIOError::write_state_machine, move || {
            let state = MachineState::parse(&data).map_err(|e| {
                StorageError::from(StorageIOError::read_snapshot(
                    Some(meta.signature()),
                    openraft::AnyError::new(&e),
                ))
            })?;
            let file = SnapshotFile {
                format: Format::CURRENT,
                meta,
                data,
            };
            store.keep(file, false)?;
            Ok(state)
        })
        .await?;
        let last = state.last_applied.map_or(0, |l| l.index);
        let mut current = self.state.write().unwrap_or_else(|e| e.into_inner());
        let replaced = std::mem::replace(&mut *current, state);
        self.feed.reset(last);
        drop(current);
        // A large state takes a while to free: after the lock is released.
        drop(replaced);
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

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn file_at(index: u64) -> SnapshotFile {
        let meta = SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(1, 1), index)),
            ..SnapshotMeta::default()
        };
        SnapshotFile::of(meta, &MachineState::default()).unwrap()
    }

    fn kept(store: &StateMachineStore) -> Option<u64> {
        store
            .snapshot
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|f| f.meta.last_log_id.map(|l| l.index))
    }

    #[test]
    fn a_build_ending_after_a_newer_install_does_not_replace_it_on_disk_or_in_memory() {
        let dir = std::env::temp_dir().join(format!("ownerserve-keep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let store = StateMachineStore::open(Some(&dir), 500).unwrap();
        let on_disk = || {
            let bytes = std::fs::read(dir.join(SNAPSHOT_FILE)).unwrap();
            SnapshotFile::parse(&bytes)
                .unwrap()
                .meta
                .last_log_id
                .map(|l| l.index)
        };
        store.keep(file_at(200), false).unwrap();
        store.keep(file_at(150), true).unwrap();
        assert_eq!((kept(&store), on_disk()), (Some(200), Some(200)));
        // A newer build replaces it; an install always does.
        store.keep(file_at(300), true).unwrap();
        assert_eq!((kept(&store), on_disk()), (Some(300), Some(300)));
        store.keep(file_at(250), false).unwrap();
        assert_eq!((kept(&store), on_disk()), (Some(250), Some(250)));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
