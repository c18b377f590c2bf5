//! Transparent huge pages for the serving commands' heap.
//!
//! The router's hottest memory is large and read at random: the approximate KV index (about
//! 150 MB at its default million blocks), the prompt cache, the session table. With 4 KiB
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
    let opted_out = std::env::var(OPT_OUT)
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"));
    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    let madvise_mode = std::fs::read_to_string(THP_MODE).is_ok_and(|m| m.contains("[madvise]"));
    if opted_out || tunables.contains(TUNABLE) || !madvise_mode {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    let value = match tunables.as_str() {
        "" => format!("{TUNABLE}=1"),
        set => format!("{set}:{TUNABLE}=1"),
    };
    // `exec` returns only on failure.
    let _failed = Command::new(&exe)
        .arg0(argv0)
        .args(args)
        .env("GLIBC_TUNABLES", value)
        .exec();
}
