//! The format of what a node keeps on disk and ships as a snapshot: the state a snapshot
//! holds ([`MachineState`]) and the one snapshot file ([`SnapshotFile`]), a node's
//! `snapshot.json` and an operator's backup alike.
//!
//! Formats, each a reader of every older one:
//! - 1 (0.1.0): nothing labelled. A snapshot file is `{meta, data}` (`data`: the bytes of
//!   the state's JSON); the redb log's entries are JSON `Entry`s.
//! - 2 (0.2.0): the same shapes, labelled: `format` in the snapshot file and in the
//!   state's JSON, `format` in the log's `meta` table; the state's directory has a
//!   `version` (`crate::version`), tenants' budgets and lapsed owners. A 0.1.0 reader
//!   ignores those (so a node can be rolled back to 0.1.0 while the directory still runs
//!   version 1: the fields are empty until version 2).
//!
//! A reader refuses a format newer than [`Format::CURRENT`] with an error naming both,
//! rather than drop what it does not know.

use std::io::Write;
use std::path::Path;

use openraft::storage::SnapshotMeta;
use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};

use super::NodeId;
use crate::Directory;

/// A format of the node's files and snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Format(pub u32);

impl Format {
    /// 0.1.0's: nothing was labelled.
    pub const UNLABELLED: Format = Format(1);
    /// What this release writes.
    pub const CURRENT: Format = Format(2);

    /// [`Format::UNLABELLED`], for serde: what an unlabelled file is.
    pub fn unlabelled() -> Format {
        Format::UNLABELLED
    }

    /// This format, if this release reads it; `what` names the thing read.
    pub fn check(self, what: &'static str) -> Result<Format, FormatError> {
        if self > Format::CURRENT {
            return Err(FormatError::TooNew { what, found: self });
        }
        Ok(self)
    }
}

impl Default for Format {
    fn default() -> Self {
        Format::CURRENT
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Why a file or snapshot could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "the {what} has format {found}; this release reads formats 1 to {}: run a newer release",
        Format::CURRENT
    )]
    TooNew { what: &'static str, found: Format },
    #[error("the {what} is not a snapshot this release reads")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot write {}", path.display())]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Everything a snapshot holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MachineState {
    /// The format it was written in (0.1.0's has none); in memory and when written, this
    /// release's.
    #[serde(default = "Format::unlabelled")]
    pub format: Format,
    pub directory: Directory,
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
}

impl MachineState {
    /// Reads a state's JSON in any format this release reads (0.1.0's included).
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let state: MachineState =
            serde_json::from_slice(bytes).map_err(|source| FormatError::Json {
                what: "state",
                source,
            })?;
        state.format.check("state")?;
        Ok(MachineState {
            format: Format::CURRENT,
            ..state
        })
    }
}

/// A snapshot as a file: a node's `snapshot.json`, and a backup
/// (`GET /admin/v1/snapshot`). The state travels as the bytes openraft ships in an
/// `InstallSnapshot`, so the file is what a node receives from its leader, labelled.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotFile {
    #[serde(default = "Format::unlabelled")]
    pub format: Format,
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// The JSON of a [`MachineState`].
    pub data: Vec<u8>,
}

impl SnapshotFile {
    /// A file holding `state` as of `meta`.
    pub fn of(
        meta: SnapshotMeta<NodeId, BasicNode>,
        state: &MachineState,
    ) -> Result<Self, FormatError> {
        let data = serde_json::to_vec(state).map_err(|source| FormatError::Json {
            what: "state",
            source,
        })?;
        Ok(Self {
            format: Format::CURRENT,
            meta,
            data,
        })
    }

    /// Reads a file of any format this release reads.
    pub fn parse(bytes: &[u8]) -> Result<Self, FormatError> {
        let file: SnapshotFile =
            serde_json::from_slice(bytes).map_err(|source| FormatError::Json {
                what: "snapshot file",
                source,
            })?;
        file.format.check("snapshot file")?;
        Ok(file)
    }

    /// The state it holds.
    pub fn state(&self) -> Result<MachineState, FormatError> {
        MachineState::parse(&self.data)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        serde_json::to_vec(self).map_err(|source| FormatError::Json {
            what: "snapshot file",
            source,
        })
    }

    /// Writes the file at `path` atomically: a temporary file beside it, fsynced, renamed
    /// over it, and the folder fsynced, so a crash leaves the old file or the new one.
    pub fn write(&self, path: &Path) -> Result<(), FormatError> {
        let bytes = self.to_bytes()?;
        write_atomically(path, &bytes).map_err(|source| FormatError::Write {
            path: path.to_owned(),
            source,
        })
    }
}

/// Writes `bytes` at `path` atomically (a temporary file, fsync, rename, fsync of the
/// folder).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unlabelled_file_is_format_1_and_a_newer_one_is_refused_by_name() {
        let file = SnapshotFile::of(SnapshotMeta::default(), &MachineState::default()).unwrap();
        let mut json = serde_json::to_value(&file).unwrap();
        assert_eq!(json["format"], 2);
        json.as_object_mut().unwrap().remove("format");
        let old = SnapshotFile::parse(&serde_json::to_vec(&json).unwrap()).unwrap();
        assert_eq!(old.format, Format::UNLABELLED);
        json["format"] = 3.into();
        let err = SnapshotFile::parse(&serde_json::to_vec(&json).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the snapshot file has format 3; this release reads formats 1 to 2: run a newer release"
        );
    }

    #[test]
    fn a_file_is_written_whole_or_not_at_all() {
        let dir = std::env::temp_dir().join(format!("ownerserve-format-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("snapshot.json");
        let file = SnapshotFile::of(SnapshotMeta::default(), &MachineState::default()).unwrap();
        file.write(&path).unwrap();
        let back = SnapshotFile::parse(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back.data, file.data);
        assert!(!path.with_extension("tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
