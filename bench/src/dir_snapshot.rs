//! `bench directory`'s in-process side: the pure state machine grown session by session
//! (its resident memory at each count), and a node's snapshot of it through the node's own
//! code (`StateMachineStore`: install, build, load at start), beside the floor of each, the
//! bare `serde_json` encoding and decoding of the same state; and how long the node's
//! `apply` waits while a snapshot is built beside it.

use std::io::Cursor;
use std::path::Path;
use std::time::Instant;

use anyhow::bail;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, SnapshotMeta};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

use ownerserve_ownership::ids::{LeaseId, SessionId, WorkerId};
use ownerserve_ownership::raft::state_machine::{MachineState, StateMachineStore};
use ownerserve_ownership::{Command, Directory, Envelope, Outcome};

use super::dir_cluster::own_rss_bytes;

/// Grace of the benchmark's directories (the node's default).
const GRACE_MS: u64 = 500;

/// A session's owner claim as a router commits it for a new session (the same command the
/// cluster side writes).
pub fn new_session(i: usize, lease: LeaseId) -> Command {
    Command::SetDecodeOwner {
        session: SessionId(format!("session-{i:08}")),
        lease,
        prefix: None,
        tail_tokens: 100,
        predicted_tool_gap_ms: Some(30_000),
        expect_epoch: None,
    }
}

/// A pure directory grown one `SetDecodeOwner` at a time, and this process's resident
/// memory before it started.
pub struct Grown {
    directory: Directory,
    lease: LeaseId,
    rss_before: u64,
    index: u64,
}

impl Grown {
    /// An empty directory with one worker's lease.
    pub fn new() -> anyhow::Result<Self> {
        let rss_before = own_rss_bytes();
        let mut directory = Directory::new(GRACE_MS);
        let granted = directory.apply(
            1,
            &envelope(Command::GrantLease {
                worker: WorkerId(0),
                ttl_ms: u64::MAX / 4,
            }),
        );
        let Outcome::LeaseGranted { lease, .. } = granted else {
            bail!("lease not granted: {granted:?}");
        };
        Ok(Self {
            directory,
            lease,
            rss_before,
            index: 1,
        })
    }

    /// Adds sessions until it holds `n`.
    pub fn grow_to(&mut self, n: usize) -> anyhow::Result<()> {
        for i in self.directory.sessions.len()..n {
            self.index += 1;
            self.directory
                .apply(self.index, &envelope(new_session(i, self.lease)));
        }
        if self.directory.sessions.len() != n {
            bail!(
                "only {} of {n} sessions were created",
                self.directory.sessions.len()
            );
        }
        Ok(())
    }

    /// This process's resident growth since [`Grown::new`], in bytes.
    pub fn resident_bytes(&self) -> u64 {
        own_rss_bytes().saturating_sub(self.rss_before)
    }

    /// This process's resident memory before the directory, in bytes.
    pub fn rss_before(&self) -> u64 {
        self.rss_before
    }
}

fn envelope(command: Command) -> Envelope {
    Envelope {
        now_ms: 1,
        client: None,
        command,
    }
}

/// Builds `store`'s snapshot while applying entries after `last` to it one at a time (Raft
/// blanks: an apply's lock and bookkeeping, no command), as a node applies what it commits
/// while openraft builds its snapshot on another task; the build's seconds and the longest
/// apply's.
async fn build_beside_applies(
    store: &mut StateMachineStore,
    last: u64,
) -> anyhow::Result<(f64, f64)> {
    let mut builder = store.get_snapshot_builder().await;
    let mut building = tokio::task::JoinSet::new();
    let started = Instant::now();
    building.spawn(async move {
        let built = builder.build_snapshot().await;
        (built.map(drop), started.elapsed().as_secs_f64())
    });
    let (mut index, mut longest) = (last, 0f64);
    let build_s = loop {
        if let Some(done) = building.try_join_next() {
            let (built, secs) = done?;
            built?;
            break secs;
        }
        index += 1;
        let entry = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        };
        let t = Instant::now();
        store.apply([entry]).await?;
        longest = longest.max(t.elapsed().as_secs_f64());
        tokio::task::yield_now().await;
    };
    Ok((build_s, longest))
}

/// A snapshot of one directory, timed.
#[derive(Debug, Clone, Copy, Default)]
pub struct SnapshotFigures {
    /// Bytes of the state's JSON (what a node snapshots, and what a replica is sent).
    pub state_bytes: u64,
    /// Floor of a build: `serde_json::to_vec` of the state, in seconds.
    pub encode_s: f64,
    /// Floor of an install or a load: `serde_json::from_slice` of it, in seconds.
    pub decode_s: f64,
    /// `StateMachineStore::build_snapshot`: encode, write the file, fsync; seconds.
    pub build_s: f64,
    /// The longest `StateMachineStore::apply` of one entry while the build ran (entries
    /// applied one after another beside it, as a node keeps applying): seconds.
    pub apply_wait_s: f64,
    /// Bytes of the snapshot file it wrote.
    pub file_bytes: u64,
    /// `StateMachineStore::install_snapshot` of the state's JSON (a follower receiving it).
    pub install_s: f64,
    /// `StateMachineStore::open` on the file: a restarted node loading its snapshot.
    pub load_s: f64,
}

/// Snapshots `grown`'s directory through a node's state machine store kept in `dir`
/// (emptied first, removed after).
pub async fn measure(grown: &mut Grown, dir: &Path) -> anyhow::Result<SnapshotFigures> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let figures = measure_in(grown, dir).await;
    let _ = std::fs::remove_dir_all(dir);
    figures
}

async fn measure_in(grown: &mut Grown, dir: &Path) -> anyhow::Result<SnapshotFigures> {
    let last = Some(LogId::new(CommittedLeaderId::new(1, 1), grown.index));
    let state = MachineState {
        directory: std::mem::take(&mut grown.directory),
        last_applied: last,
        ..MachineState::default()
    };
    let t = Instant::now();
    let encoded = serde_json::to_vec(&state);
    let encode_s = t.elapsed().as_secs_f64();
    let membership = state.membership.clone();
    grown.directory = state.directory;
    let data = encoded?;
    let t = Instant::now();
    let decoded: MachineState = serde_json::from_slice(&data)?;
    let decode_s = t.elapsed().as_secs_f64();
    drop(decoded);
    let state_bytes = data.len() as u64;

    let mut store = StateMachineStore::open(Some(dir), GRACE_MS)?;
    let meta = SnapshotMeta {
        last_log_id: last,
        last_membership: membership,
        snapshot_id: format!("1-{}", grown.index),
    };
    let t = Instant::now();
    store
        .install_snapshot(&meta, Box::new(Cursor::new(data)))
        .await?;
    let install_s = t.elapsed().as_secs_f64();
    let (build_s, apply_wait_s) = build_beside_applies(&mut store, grown.index).await?;
    drop(store);
    let file_bytes = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    let t = Instant::now();
    let loaded = StateMachineStore::open(Some(dir), GRACE_MS)?;
    let load_s = t.elapsed().as_secs_f64();
    let sessions = loaded.read(|s| s.directory.sessions.len());
    if sessions != grown.directory.sessions.len() {
        bail!(
            "the loaded snapshot has {sessions} sessions, not {}",
            grown.directory.sessions.len()
        );
    }
    Ok(SnapshotFigures {
        state_bytes,
        encode_s,
        decode_s,
        build_s,
        apply_wait_s,
        file_bytes,
        install_s,
        load_s,
    })
}
