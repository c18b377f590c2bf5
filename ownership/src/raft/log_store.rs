//! The Raft log on redb: table `logs` (index → JSON entry) and table `meta` (vote, last
//! purged, and the log's `format`, `super::format`: a log without one is 0.1.0's, read
//! alike; one newer than this release's is refused at open). Every write transaction commits with `Durability::Immediate`,
//! so an appended batch is fsynced once before openraft is told it is durable. Writes run
//! on the blocking pool: an fsync must not stall the runtime thread, which in a router
//! with the embedded directory also relays every request.

use std::fmt::Debug;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, StorageError, StorageIOError, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::format::{Format, FormatError};
use super::{io_err, NodeId, TypeConfig};

const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("logs");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

/// redb's page cache for the log: 4 MiB. redb's default is 1 GiB, a ceiling rather than
/// a reservation, and every page the log touches stays cached under it: a node's
/// resident memory rose with its log's history for as long as it ran (about 0.5 MB a
/// minute in the soak; with 16 MiB it still crept for the first half hour). A Raft log is
/// written at its end and read back within moments (replication, apply), and purged
/// behind each snapshot, so its working set is its last few hundred entries; a follower
/// catching up from further back reads through the OS's page cache.
const LOG_CACHE_BYTES: usize = 4 << 20;

/// The `meta` key of the log's format.
const FORMAT_KEY: &str = "format";

/// Why a node's log could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum LogOpenError {
    #[error("cannot open the log database")]
    Database(#[from] redb::DatabaseError),
    #[error("cannot read or label the log")]
    Storage(#[from] redb::Error),
    #[error("the log's format label is not a number")]
    Label(#[from] serde_json::Error),
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// The durable log of one node.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

type StoreResult<T> = Result<T, StorageError<NodeId>>;

impl LogStore {
    /// Opens (or creates) the log file, and labels it with this release's format.
    pub fn open(path: &Path) -> Result<Self, LogOpenError> {
        let db = redb::Builder::new()
            .set_cache_size(LOG_CACHE_BYTES)
            .create(path)?;
        let found = Self::format_of(&db)?;
        if let Some(format) = found {
            format.check("raft log")?;
        }
        if found != Some(Format::CURRENT) {
            let label = serde_json::to_vec(&Format::CURRENT)?;
            let mut tx = db.begin_write().map_err(redb::Error::from)?;
            tx.set_durability(Durability::Immediate)
                .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            tx.open_table(META)
                .map_err(redb::Error::from)?
                .insert(FORMAT_KEY, label.as_slice())
                .map_err(redb::Error::from)?;
            tx.commit().map_err(redb::Error::from)?;
        }
        Ok(Self { db: Arc::new(db) })
    }

    /// The format the log is labelled with (`None`: unlabelled, 0.1.0's).
    pub fn format(&self) -> Result<Option<Format>, LogOpenError> {
        Self::format_of(&self.db)
    }

    fn format_of(db: &Database) -> Result<Option<Format>, LogOpenError> {
        let tx = db.begin_read().map_err(redb::Error::from)?;
        let table = match tx.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(redb::Error::from(e).into()),
        };
        let Some(label) = table.get(FORMAT_KEY).map_err(redb::Error::from)? else {
            return Ok(None);
        };
        Ok(Some(serde_json::from_slice(label.value())?))
    }

    async fn write<T: Send + 'static>(
        &self,
        make: fn(openraft::AnyError) -> StorageIOError<NodeId>,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<T, redb::Error> + Send + 'static,
    ) -> StoreResult<T> {
        let db = Arc::clone(&self.db);
        let run = move || -> Result<T, redb::Error> {
            let mut tx = db.begin_write()?;
            tx.set_durability(Durability::Immediate)
                .map_err(|e| redb::Error::Corrupted(e.to_string()))?;
            let out = f(&tx)?;
            tx.commit()?;
            Ok(out)
        };
        match tokio::task::spawn_blocking(run).await {
            Ok(done) => done.map_err(|e| io_err(make, &e)),
            Err(e) => Err(io_err(make, &e)),
        }
    }

    async fn put_meta<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        make: fn(openraft::AnyError) -> StorageIOError<NodeId>,
    ) -> StoreResult<()> {
        let bytes = serde_json::to_vec(value).map_err(|e| io_err(make, &e))?;
        let key = key.to_owned();
        self.write(make, move |tx| {
            tx.open_table(META)?
                .insert(key.as_str(), bytes.as_slice())?;
            Ok(())
        })
        .await
    }

    fn get_meta<T: DeserializeOwned>(
        &self,
        key: &str,
        make: fn(openraft::AnyError) -> StorageIOError<NodeId>,
    ) -> StoreResult<Option<T>> {
        let read = || -> Result<Option<Vec<u8>>, redb::Error> {
            let tx = self.db.begin_read()?;
            let table = match tx.open_table(META) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            Ok(table.get(key)?.map(|v| v.value().to_vec()))
        };
        match read().map_err(|e| io_err(make, &e))? {
            None => Ok(None),
            Some(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io_err(make, &e)),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        let read = || -> Result<Vec<Vec<u8>>, redb::Error> {
            let tx = self.db.begin_read()?;
            let table = match tx.open_table(LOGS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            let mut out = Vec::new();
            for item in table.range::<u64>(range)? {
                out.push(item?.1.value().to_vec());
            }
            Ok(out)
        };
        let raw = read().map_err(|e| io_err(StorageIOError::read_logs, &e))?;
        raw.iter()
            .map(|b| serde_json::from_slice(b).map_err(|e| io_err(StorageIOError::read_logs, &e)))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged: Option<LogId<NodeId>> =
            self.get_meta("last_purged", StorageIOError::read_logs)?;
        let read = || -> Result<Option<Vec<u8>>, redb::Error> {
            let tx = self.db.begin_read()?;
            let table = match tx.open_table(LOGS) {
                Ok(t) => t,
                Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            let last = table.last()?.map(|(_, v)| v.value().to_vec());
            Ok(last)
        };
        let last = read().map_err(|e| io_err(StorageIOError::read_logs, &e))?;
        let last_log_id = match last {
            Some(bytes) => {
                let entry: Entry<TypeConfig> = serde_json::from_slice(&bytes)
                    .map_err(|e| io_err(StorageIOError::read_logs, &e))?;
                Some(entry.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.put_meta("vote", vote, StorageIOError::write_vote)
            .await
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.get_meta("vote", StorageIOError::read_vote)
    }

    // `save_committed` / `read_committed` keep openraft's defaults (not persisted): saving
    // them would cost an fsync per commit on every node, and after a restart the commit
    // index is learned again from the quorum. (Persisting it with a non-durable redb commit
    // instead lost acknowledged entries under kill -9: tests/faults/e2e_directory.rs caught it.)
    // The catch: a leader restarted in its old term does not know what is committed, so
    // `ensure_linearizable` alone can let it serve stale state; the node's reads go through
    // a committed barrier instead (`Node::read_barrier` in the router crate).

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        for e in entries {
            let bytes =
                serde_json::to_vec(&e).map_err(|err| io_err(StorageIOError::write_logs, &err))?;
            encoded.push((e.log_id.index, bytes));
        }
        // One transaction, one fsync, for the whole batch; only then is it acknowledged.
        let result = self
            .write(StorageIOError::write_logs, move |tx| {
                let mut table = tx.open_table(LOGS)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice())?;
                }
                Ok(())
            })
            .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.write(StorageIOError::write_logs, move |tx| {
            tx.open_table(LOGS)?
                .retain_in::<u64, _>(log_id.index.., |_, _| false)?;
            Ok(())
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        let bytes = serde_json::to_vec(&Some(log_id))
            .map_err(|e| io_err(StorageIOError::write_logs, &e))?;
        self.write(StorageIOError::write_logs, move |tx| {
            tx.open_table(META)?
                .insert("last_purged", bytes.as_slice())?;
            tx.open_table(LOGS)?
                .retain_in::<u64, _>(..=log_id.index, |_, _| false)?;
            Ok(())
        })
        .await
    }
}
