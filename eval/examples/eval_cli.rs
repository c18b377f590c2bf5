//! The evaluation commands alone (`simulate`, `report`), without the router: a smaller
//! release binary that links in a fraction of `ownerserve`'s time, for iterating on the
//! simulator. `ownerserve simulate` / `ownerserve report` take the same arguments.
//!
//! `cargo run --release -p ownerserve-eval --example eval_cli -- report --matrix ...`

use std::io::Write as _;

use clap::{Parser, Subcommand};
use ownerserve_eval::commands::{self, ReportArgs, SimulateArgs};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate policies over a workload on one cluster.
    Simulate(SimulateArgs),
    /// Compare policies per cluster, or run the evaluation matrix.
    Report(ReportArgs),
}

fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Simulate(a) => commands::simulate(a),
        Command::Report(a) => commands::report(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
