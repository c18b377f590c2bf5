//! A process's resource use as Linux's `/proc` shows it: resident memory, threads and
//! open file descriptors (`None` where `/proc` cannot tell: another OS, a process gone).

/// `VmRSS` of `pid` in kB.
pub fn rss_kb(pid: u32) -> Option<u64> {
    status_number(&pid.to_string(), "VmRSS:")
}

/// `VmRSS` of this process in kB.
pub fn own_rss_kb() -> Option<u64> {
    status_number("self", "VmRSS:")
}

/// Threads of `pid`.
pub fn threads(pid: u32) -> Option<u64> {
    status_number(&pid.to_string(), "Threads:")
}

/// Open file descriptors of `pid`.
pub fn open_fds(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.count() as u64)
}

/// The first number after `key` in `/proc/<who>/status`.
fn status_number(who: &str, key: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{who}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_threads_and_descriptors() {
        let pid = std::process::id();
        assert!(rss_kb(pid).is_some_and(|kb| kb > 0));
        assert!(own_rss_kb().is_some_and(|kb| kb > 0));
        assert!(threads(pid).is_some_and(|n| n >= 1));
        assert!(open_fds(pid).is_some_and(|n| n >= 3));
        assert_eq!(rss_kb(u32::MAX), None);
    }
}
