//! Errors of the trace readers: which file, which line, and what was wrong with it.

use std::path::PathBuf;

/// Reading a trace failed; line numbers are 1-based, as an editor shows them.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    /// The file could not be opened or read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The trace file.
        path: PathBuf,
        /// The underlying IO error.
        #[source]
        source: std::io::Error,
    },
    /// One line of the file is malformed or breaks an invariant.
    #[error("{}:{line}: bad record", path.display())]
    Line {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        #[source]
        problem: LineProblem,
    },
    /// The file holds no records.
    #[error("{} holds no records", path.display())]
    Empty {
        /// The trace file.
        path: PathBuf,
    },
}

impl WorkloadError {
    /// The 1-based line at fault, if the error is about one line.
    pub fn line(&self) -> Option<usize> {
        match self {
            Self::Line { line, .. } => Some(*line),
            Self::Io { .. } | Self::Empty { .. } => None,
        }
    }
}

/// What is wrong with one line of a trace.
#[derive(Debug, thiserror::Error)]
pub enum LineProblem {
    /// Not the JSON object the format expects.
    #[error("invalid json record")]
    Json(#[from] serde_json::Error),
    /// `hash_ids` does not have ceil(input_length / block) entries.
    #[error("expected {expected} hash ids for the input length, found {found}")]
    HashIdsLength {
        /// ceil(input_length / block).
        expected: usize,
        /// `hash_ids.len()`.
        found: usize,
    },
    /// `block_size` differs from the first line's, or is zero.
    #[error("block size {found} differs from the file's {expected} or is zero")]
    BlockSize {
        /// The first line's block size.
        expected: u32,
        /// This line's.
        found: u32,
    },
    /// A CSV line does not have the expected number of fields.
    #[error("expected {expected} comma-separated fields, found {found}")]
    FieldCount {
        /// Fields the format has.
        expected: usize,
        /// Fields on the line.
        found: usize,
    },
    /// A CSV field is not a non-negative integer.
    #[error("field {field} is not a token count")]
    Number {
        /// The column name.
        field: &'static str,
    },
    /// A timestamp is not `YYYY-MM-DD HH:MM:SS[.fraction]`.
    #[error("timestamp is not YYYY-MM-DD HH:MM:SS[.fraction]")]
    Timestamp,
    /// The CSV header is not the expected one.
    #[error("header is not {expected}")]
    Header {
        /// The header the format has.
        expected: &'static str,
    },
    /// The same session has two lines with the same turn.
    #[error("turn {turn} appears twice in its session")]
    DuplicateTurn {
        /// The repeated turn.
        turn: u32,
    },
}
