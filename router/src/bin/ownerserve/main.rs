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
//! - [`huge_pages`]: the serving commands re-execute themselves with glibc's malloc asking
//!   for transparent huge pages.
#![forbid(unsafe_code)]

mod cli;
mod fuzz;
mod huge_pages;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    if cli.serves() {
        huge_pages::reexec_with_huge_pages();
    }
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
