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
#![forbid(unsafe_code)]

mod auth;
mod bench;
mod cli;
mod config;
mod demotion;
mod directory;
mod directory_client;
mod dispatch;
mod error;
mod evaluate;
mod explain;
mod health;
mod kv;
mod metrics;
mod ownership_sync;
mod registry;
mod server;
mod sessions;
mod up;
mod upstream;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("OWNERSERVE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(cli.run())
}
