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
//! The allocator is jemalloc, with background threads: they return a thread's freed pages
//! to the OS ten seconds after it freed them, whatever that thread does next. glibc's
//! per-thread arenas kept them (an hour's soak: a directory node +35%), and so did mimalloc
//! for a router (+55%; `docs/BENCHMARKS.md`, `bench soak`). Its live and resident bytes are
//! `ownerserve_heap_allocated_bytes` and `ownerserve_heap_resident_bytes` on `/metrics`.
#![forbid(unsafe_code)]

mod cli;
mod fuzz;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's live and resident bytes, as of now (its statistics are refreshed by
/// advancing its epoch).
fn heap() -> Option<(u64, u64)> {
    use tikv_jemalloc_ctl::{epoch, stats};
    epoch::advance().ok()?;
    let allocated = stats::allocated::read().ok()?;
    let resident = stats::resident::read().ok()?;
    Some((allocated as u64, resident as u64))
}

fn main() -> ExitCode {
    ownerserve_edge::runtime_metrics::install_heap_probe(heap);
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
