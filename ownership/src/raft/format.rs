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
//! - 3 (0.2.0, written since before its release): the snapshot file keeps the state's JSON
//!   as it is, under `state`, where formats 1 and 2 kept its bytes as an array of numbers
//!   under `data` (3.5 times the state's size, and most of a build's and a load's time at
//!   a million sessions). The state's JSON (labelled 3) and the log's entries keep format
//!   2's shape; what an `InstallSnapshot` ships (the state's JSON) is unchanged, so nodes
//!   of 0.1.0 and of this release still send each other snapshots during a rolling upgrade. A 0.1.0 node does not read a format 3
//!   file: a node rolled back to 0.1.0 starts from its log alone, or from a snapshot its
//!   leader sends.
//!
//! A reader refuses a format newer than [`Format::CURRENT`] with an error naming both,
//! rather than drop what it does not know.

use std::io::Write;
use std::path::Path;

use openraft::storage::SnapshotMeta;
use openraft::{BasicNode, LogId, StoredMembership};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::NodeId;
use crate::Directory;

/// A format of the node's files and snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Format(pub u32);

impl Format {
    /// 0.1.0's: nothing was labelled.
    pub const UNLABELLED: Format = Format(1);
    /// The last format whose snapshot file kept the state as an array of numbers.
    pub const STATE_AS_NUMBERS: Format = Format(2);
    /// What this release writes.
    pub const CURRENT: Format = Format(3);

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
    #[error("the snapshot file of format {format} holds no state (`{field}`)")]
    NoState { format: Format, field: &'static str },
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
/// `InstallSnapshot`, so the file is what a node receives from its leader, labelled:
/// `{"format": 3, "meta": {..}, "state": <the state's JSON, as is>}`.
#[derive(Debug, Clone)]
pub struct SnapshotFile {
    /// The format it was read in; written, this release's.
    pub format: Format,
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    /// The JSON of a [`MachineState`].
    pub data: Vec<u8>,
}

/// A snapshot file as read, in any format: the state's JSON is `state` (format 3) or the
/// array of its bytes `data` (formats 1 and 2).
#[derive(Deserialize)]
struct StoredFile<'a> {
    #[serde(default = "Format::unlabelled")]
    format: Format,
    meta: SnapshotMeta<NodeId, BasicNode>,
    #[serde(borrow, default)]
    state: Option<&'a RawValue>,
    #[serde(default)]
    data: Option<Vec<u8>>,
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
        let file: StoredFile<'_> =
            serde_json::from_slice(bytes).map_err(|source| FormatError::Json {
                what: "snapshot file",
                source,
            })?;
        let format = file.format.check("snapshot file")?;
        let data = if format > Format::STATE_AS_NUMBERS {
            file.state
                .ok_or(FormatError::NoState {
                    format,
                    field: "state",
                })?
                .get()
                .as_bytes()
                .to_vec()
        } else {
            file.data.ok_or(FormatError::NoState {
                format,
                field: "data",
            })?
        };
        Ok(Self {
            format,
            meta: file.meta,
            data,
        })
    }

    /// The state it holds.
    pub fn state(&self) -> Result<MachineState, FormatError> {
        MachineState::parse(&self.data)
    }

    /// The file's bytes before the state's JSON: `{"format":3,"meta":{..},"state":`.
    fn head(&self) -> Result<Vec<u8>, FormatError> {
        let json = |source| FormatError::Json {
            what: "snapshot file",
            source,
        };
        let mut head = b"{\"format\":".to_vec();
        serde_json::to_writer(&mut head, &Format::CURRENT).map_err(json)?;
        head.extend_from_slice(b",\"meta\":");
        serde_json::to_writer(&mut head, &self.meta).map_err(json)?;
        head.extend_from_slice(b",\"state\":");
        Ok(head)
    }

    /// The file's bytes, in this release's format. The state's JSON is copied in as it is:
    /// it was written by `serde_json` ([`SnapshotFile::of`]) or read as JSON
    /// ([`SnapshotFile::parse`], an `InstallSnapshot` parsed before it is kept).
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        let mut out = self.head()?;
        out.reserve(self.data.len() + 1);
        out.extend_from_slice(&self.data);
        out.push(b'}');
        Ok(out)
    }

    /// Writes the file at `path` atomically: a temporary file beside it, fsynced, renamed
    /// over it, and the folder fsynced, so a crash leaves the old file or the new one. The
    /// state's JSON goes to the file from where it is, without a copy of the whole file.
    pub fn write(&self, path: &Path) -> Result<(), FormatError> {
        let head = self.head()?;
        write_parts_atomically(path, &[&head, &self.data, b"}"]).map_err(|source| {
            FormatError::Write {
                path: path.to_owned(),
                source,
            }
        })
    }
}

/// Writes `bytes` at `path` atomically (a temporary file, fsync, rename, fsync of the
/// folder).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_parts_atomically(path, &[bytes])
}

/// Writes `parts`, one after another, at `path` atomically (as [`write_atomically`]).
fn write_parts_atomically(path: &Path, parts: &[&[u8]]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    for part in parts {
        f.write_all(part)?;
    }
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

    /// A state with something in it, and a file of it at index 42.
    fn file() -> SnapshotFile {
        let mut state = MachineState::default();
        state.directory.grace_ms = 750;
        state.last_applied = Some(LogId::new(openraft::CommittedLeaderId::new(3, 1), 42));
        let meta = SnapshotMeta {
            last_log_id: state.last_applied,
            ..SnapshotMeta::default()
        };
        SnapshotFile::of(meta, &state).unwrap()
    }

    /// `file` as formats 1 and 2 wrote it: the state's bytes as an array of numbers.
    fn as_numbers(file: &SnapshotFile, format: Option<u32>) -> Vec<u8> {
        let mut json = serde_json::json!({"meta": file.meta, "data": file.data});
        if let Some(f) = format {
            json["format"] = f.into();
        }
        serde_json::to_vec(&json).unwrap()
    }

    #[test]
    fn a_file_keeps_the_state_s_json_as_it_is_and_reads_back_the_same() {
        let file = file();
        let bytes = file.to_bytes().unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["format"], 3);
        assert_eq!(json["state"]["directory"]["grace_ms"], 750);
        assert!(json.get("data").is_none());
        // The state's bytes once, and a little for the label and the meta.
        assert!(bytes.len() < file.data.len() + 300, "{} bytes", bytes.len());
        let back = SnapshotFile::parse(&bytes).unwrap();
        assert_eq!(back.format, Format::CURRENT);
        assert_eq!(back.meta, file.meta);
        assert_eq!(back.data, file.data);
        assert_eq!(back.state().unwrap().directory.grace_ms, 750);
    }

    #[test]
    fn files_of_formats_1_and_2_keep_loading_and_are_written_again_in_format_3() {
        let file = file();
        for (label, read_as) in [(None, Format::UNLABELLED), (Some(2), Format(2))] {
            let old = SnapshotFile::parse(&as_numbers(&file, label)).unwrap();
            assert_eq!(old.format, read_as);
            assert_eq!(old.meta, file.meta);
            assert_eq!(old.data, file.data);
            let state = old.state().unwrap();
            assert_eq!(state.directory.grace_ms, 750);
            assert_eq!(state.last_applied.map(|l| l.index), Some(42));
            let again = SnapshotFile::parse(&old.to_bytes().unwrap()).unwrap();
            assert_eq!(
                (again.format, again.data),
                (Format::CURRENT, file.data.clone())
            );
        }
    }

    #[test]
    fn a_newer_format_is_refused_by_name_and_a_file_without_its_state_is_refused() {
        let mut json: serde_json::Value =
            serde_json::from_slice(&file().to_bytes().unwrap()).unwrap();
        json["format"] = 4.into();
        let err = SnapshotFile::parse(&serde_json::to_vec(&json).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the snapshot file has format 4; this release reads formats 1 to 3: run a newer release"
        );
        json["format"] = 3.into();
        json.as_object_mut().unwrap().remove("state");
        let err = SnapshotFile::parse(&serde_json::to_vec(&json).unwrap()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the snapshot file of format 3 holds no state (`state`)"
        );
        let numbers = as_numbers(&file(), Some(2));
        let mut json: serde_json::Value = serde_json::from_slice(&numbers).unwrap();
        json.as_object_mut().unwrap().remove("data");
        assert!(matches!(
            SnapshotFile::parse(&serde_json::to_vec(&json).unwrap()),
            Err(FormatError::NoState { field: "data", .. })
        ));
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
