//! The folder a process keeps its throwaway state in (the embedded directory's Raft log
//! when no `directory_data_dir` is set, `up --ha`'s nodes' data).

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

/// A folder under the system's temp folder that no earlier process used: named by this
/// process's id and the start time in nanoseconds. By pid alone, a process killed before it
/// could remove its folder (SIGKILL, a crash) left it for the next process given the same
/// pid, which then recovered that process's leases, owners and prefixes as its own (seen
/// in the tests: with 1,123 such folders in /tmp and pids up to 32,768, one `up` in ~30
/// started on another's directory).
pub fn scratch_dir(what: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::env::temp_dir().join(format!(
        "ownerserve-{what}-{}-{nanos:x}",
        std::process::id()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_folders_of_one_process_differ() {
        let (a, b) = (scratch_dir("directory"), scratch_dir("directory"));
        assert_ne!(a, b);
        let name = a.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert!(name.starts_with(&format!("ownerserve-directory-{}-", std::process::id())));
    }
}
