//! `ownerserve`: the OwnerServe binary.
//!
//! # Layout
//! - [`cli`]: the command line (`up`, `router`, `sim-worker`).
//! - [`config`]: TOML + env + flags, validated before any socket opens.
//! - [`server`]: the OpenAI proxy and operator API; [`error`] maps every error to HTTP;
//!   [`auth`] guards the operator API with bearer tokens; [`explain`] answers
//!   `/admin/v1/plan/explain` with the cost planner's choice.
//! - [`registry`] and [`health`]: the workers and their health.
//! - [`kv`]: the KV index, its event subscribers, load scrapers and expiry.
//! - [`upstream`]: the pooled client and the streaming relay to and from workers.
//! - [`up`]: the whole stack in one process.
//! - [`directory`]: one node of the replicated ownership directory; [`directory_client`]
//!   how the router reaches it; [`ownership_sync`] what the router records there.
//! - [`mod@bench`]: benchmark commands.
//! - [`metrics`]: the Prometheus metrics of every server; [`request_id`] the middleware
//!   that gives each request its id, span and metrics; [`logging`] text or JSON logs.
//! - [`ctl`]: `ownerserve ctl`, the operator API from the command line.
#![forbid(unsafe_code)]

mod auth;
mod bench;
mod cli;
mod config;
mod ctl;
mod demotion;
mod directory;
mod directory_client;
mod dispatch;
mod error;
mod evaluate;
mod explain;
mod health;
mod kv;
mod logging;
mod metrics;
mod ownership_sync;
mod prompt_cache;
mod registry;
mod request_id;
mod server;
mod sessions;
mod up;
mod upstream;

use std::process::ExitCode;

use clap::Parser;

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
