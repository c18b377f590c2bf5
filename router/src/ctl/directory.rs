//! `ctl directory backup` and `ctl directory restore`: a backup is the directory's whole
//! state as a snapshot file (`GET /admin/v1/snapshot`, admin token, read through the
//! leader as of every write acknowledged before it), the same file a node keeps as its
//! `snapshot.json`; a restore makes a new node's data folder from one, offline
//! (`ownerserve_ownership::raft::restore`: every node of the new cluster gets the same
//! snapshot with the new members, and starts from it).

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Subcommand;
use serde_json::{json, Value};

use ownerserve_ownership::node::{parse_peers, unix_ms};
use ownerserve_ownership::raft::format::{write_atomically, SnapshotFile};
use ownerserve_ownership::raft::restore::restore;

use super::client::Api;

/// `ctl directory ...`.
#[derive(Debug, Subcommand)]
pub enum DirectoryCommand {
    /// Write the directory's state, as of every write acknowledged before the call, to
    /// FILE (atomically): a backup, through any node or a router with an embedded directory.
    Backup { file: PathBuf },
    /// Make a new node's data folder from a backup (or a node's own snapshot.json),
    /// offline: run it for every node of the new cluster, with the same --peer list, then
    /// start each node on its folder. Every lease lasts one TTL from the restore.
    Restore {
        file: PathBuf,
        /// The node's data folder (created; must not hold a node's data).
        #[arg(long)]
        data_dir: PathBuf,
        /// The new cluster's members, `ID=HOST:PORT` (repeat, or comma-separated), as
        /// `ownerserve directory --peer` takes them.
        #[arg(
            long = "peer",
            visible_alias = "peers",
            value_delimiter = ',',
            required = true
        )]
        peers: Vec<String>,
    },
}

/// Runs a `ctl directory` command; what it did, as JSON and in words.
pub async fn run(api: &Api, command: DirectoryCommand) -> anyhow::Result<(Value, String)> {
    match command {
        DirectoryCommand::Backup { file } => backup(api, &file).await,
        DirectoryCommand::Restore {
            file,
            data_dir,
            peers,
        } => {
            let members = parse_peers(&peers)?;
            let backup = read(&file)?;
            let done = restore(&backup, &members, unix_ms(), &data_dir)
                .with_context(|| format!("cannot restore into {}", data_dir.display()))?;
            let words = format!(
                "{} restored at log index {}: {} sessions, {} leases, {} prefixes; start the node on it with the same --peer list",
                data_dir.display(),
                done.index,
                done.sessions,
                done.leases,
                done.artifacts
            );
            let answer = json!({"data_dir": data_dir, "index": done.index,
                "sessions": done.sessions, "leases": done.leases, "prefixes": done.artifacts});
            Ok((answer, words))
        }
    }
}

async fn backup(api: &Api, file: &Path) -> anyhow::Result<(Value, String)> {
    let bytes = api.get_bytes("/admin/v1/snapshot").await?;
    // Kept only if this release reads it back.
    let parsed = SnapshotFile::parse(&bytes).context("the server's answer is not a backup")?;
    let state = parsed.state().context("the backup's state does not read")?;
    write_atomically(file, &bytes).with_context(|| format!("cannot write {}", file.display()))?;
    let index = state.last_applied.map_or(0, |l| l.index);
    let d = &state.directory;
    let words = format!(
        "backup of log index {index} ({} sessions, {} leases, {} prefixes, directory version {}) written to {} ({} bytes)",
        d.sessions.len(),
        d.leases.len(),
        d.artifacts.len(),
        d.version,
        file.display(),
        bytes.len()
    );
    let answer = json!({"file": file, "index": index, "bytes": bytes.len(),
        "sessions": d.sessions.len(), "leases": d.leases.len(), "prefixes": d.artifacts.len(),
        "version": d.version});
    Ok((answer, words))
}

fn read(file: &Path) -> anyhow::Result<SnapshotFile> {
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    SnapshotFile::parse(&bytes).with_context(|| format!("{} is not a backup", file.display()))
}
