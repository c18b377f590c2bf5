//! `ownerserve`: the OwnerServe binary. It parses the command line and calls into the
//! crates that do the work; nothing else lives here.
//!
//! # Layout
//! - [`cli`]: the subcommands and their flags, each handed to its crate: the router, `up`
//!   and `ctl` (`ownerserve_router`), `directory` (the directory node), `sim-worker`
//!   (`ownerserve_shim::sim`), `bench` (`ownerserve_bench`), and `simulate`, `report`,
//!   `replay` (`ownerserve_eval::commands`).
//! - [`fuzz`]: `ownerserve fuzz`, the fuzz targets of every parser that takes outside
//!   bytes, on `ownerserve_bench::fuzz`'s mutation engine.
//!
//! The allocator is mimalloc: it returns freed pages to the OS, where glibc's malloc kept
//! them in its per-thread arenas (an hour's soak: a directory node +35% on glibc, +5% on
//! mimalloc; `docs/BENCHMARKS.md`, `bench soak`). Where the kernel's transparent huge pages
//! wait to be asked (`madvise` mode), mimalloc asks for its arenas, so the router's large
//! tables (the KV index, the prompt cache) sit on 2 MiB pages with no setting;
//! `MIMALLOC_ALLOW_THP=0` turns that off.
#![forbid(unsafe_code)]

mod cli;
mod fuzz;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let mut runtime = match cli.worker_threads() {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut pool = tokio::runtime::Builder::new_multi_thread();
            if n > 1 {
                pool.worker_threads(n);
            }
            pool
        }
    };
    let run = runtime
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(cli.run()));
    match run {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report(&e);
            ExitCode::FAILURE
        }
    }
}

/// Prints an error and its causes on one line (no backtrace: the message is for operators).
#[expect(clippy::print_stderr, reason = "the CLI's own error output")]
fn report(e: &anyhow::Error) {
    eprintln!("error: {e:#}");
}
