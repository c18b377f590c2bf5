//! Line-by-line JSON decoding shared by the JSONL readers, with 1-based line numbers.

use std::path::Path;

use serde::de::DeserializeOwned;

use super::error::{LineProblem, WorkloadError};

/// Reads a whole trace file, mapping IO failures to [`WorkloadError::Io`].
pub(crate) fn read_text(path: &Path) -> Result<String, WorkloadError> {
    std::fs::read_to_string(path).map_err(|source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Decodes every non-blank line as `T`, paired with its 1-based line number.
pub(crate) fn parse_lines<T: DeserializeOwned>(
    text: &str,
    path: &Path,
) -> Result<Vec<(usize, T)>, WorkloadError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record = serde_json::from_str(line).map_err(|e| line_error(path, i + 1, e.into()))?;
        out.push((i + 1, record));
    }
    if out.is_empty() {
        return Err(WorkloadError::Empty {
            path: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Builds the error for a bad line.
pub(crate) fn line_error(path: &Path, line: usize, problem: LineProblem) -> WorkloadError {
    WorkloadError::Line {
        path: path.to_path_buf(),
        line,
        problem,
    }
}
