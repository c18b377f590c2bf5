//! Transparent huge pages for the serving commands' heap.
//!
//! The router's hottest memory is large and read at random: the approximate KV index (~235
//! MB of hash table at its default million blocks), the prompt cache, the session table. With 4 KiB
//! pages nearly every index lookup also misses the TLB; on agent-sized session steps that
//! was ~12% of the router's core (`docs/BENCHMARKS.md`, issue 19). Under the kernels'
//! usual `madvise` mode the kernel backs memory with 2 MiB pages only where asked, and
//! glibc's malloc asks for all of its heap when the tunable `glibc.malloc.hugetlb=1` is set.
//! A tunable is read once at process start, so a serving command re-executes itself with it
//! (same pid, arguments and environment otherwise) before doing anything else. Done without
//! `unsafe` (the workspace forbids it), unlike an allocator that calls `madvise` itself.
//!
//! Skipped when the kernel's mode is `always` (huge pages anyway) or `never`, when the
//! tunable is already set, on a non-glibc build, and when `OWNERSERVE_HUGE_PAGES=off`.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// glibc's tunable: malloc marks its heap and mmap'd chunks `MADV_HUGEPAGE`.
const TUNABLE: &str = "glibc.malloc.hugetlb";
/// The kernel's THP mode; the selected one is in brackets.
const THP_MODE: &str = "/sys/kernel/mm/transparent_hugepage/enabled";
/// Set to `off` (or `0`, `false`) to keep 4 KiB pages.
pub const OPT_OUT: &str = "OWNERSERVE_HUGE_PAGES";

/// Re-executes this process with the tunable set when it would help. Returns only when it
/// did not (not needed, or the exec failed: the process then runs on as it is).
pub fn reexec_with_huge_pages() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        return;
    }
    let Some(value) = tunables_to_set(
        std::env::var(OPT_OUT).ok().as_deref(),
        &std::env::var("GLIBC_TUNABLES").unwrap_or_default(),
        &std::fs::read_to_string(THP_MODE).unwrap_or_default(),
    ) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    // `exec` returns only on failure.
    let _failed = Command::new(&exe)
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", value)
        .exec();
}

/// The `GLIBC_TUNABLES` to re-execute with, given the opt-out variable, the tunables set
/// now and the kernel's THP mode file; `None` to run on as is.
fn tunables_to_set(opt_out: Option<&str>, tunables: &str, thp_mode: &str) -> Option<String> {
    let opted_out =
        opt_out.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"));
    if opted_out || tunables.contains(TUNABLE) || !thp_mode.contains("[madvise]") {
        return None;
    }
    Some(match tunables {
        "" => format!("{TUNABLE}=1"),
        set => format!("{set}:{TUNABLE}=1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MADVISE: &str = "always [madvise] never\n";

    #[test]
    fn asks_for_huge_pages_only_where_the_kernel_waits_to_be_asked() {
        assert_eq!(
            tunables_to_set(None, "", MADVISE).as_deref(),
            Some("glibc.malloc.hugetlb=1")
        );
        assert_eq!(
            tunables_to_set(None, "glibc.malloc.arena_max=2", MADVISE).as_deref(),
            Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
            "the operator's tunables are kept"
        );
        assert_eq!(
            tunables_to_set(None, "glibc.malloc.hugetlb=0", MADVISE),
            None
        );
        assert_eq!(tunables_to_set(Some("OFF"), "", MADVISE), None);
        assert!(tunables_to_set(Some("on"), "", MADVISE).is_some());
        assert_eq!(tunables_to_set(None, "", "[always] madvise never"), None);
        assert_eq!(tunables_to_set(None, "", "always madvise [never]"), None);
        assert_eq!(
            tunables_to_set(None, "", ""),
            None,
            "no THP file: nothing to ask"
        );
    }
}
