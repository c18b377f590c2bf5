//! `ownerserve fuzz`: every parser that takes outside bytes, driven by
//! `ownerserve_bench::fuzz` (the mutation engine) with valid seeds and a dictionary per
//! target. Each target checks properties, not only the absence of panics:
//! - `openai`: a client body through the OpenAI parser of every proxied endpoint;
//! - `kv-events`: an engine's ZMQ message (msgpack `EventBatch`) decoded and normalised;
//! - `sse-relay`: a worker's response body (scripted frames, maybe ending in an error)
//!   through the router's relay: the client gets exactly the worker's bytes, plus one
//!   error event and `[DONE]` on an SSE stream that broke;
//! - `worker-http`: a worker's HTTP/1.1 response, arriving in pieces, through the router's
//!   own reader (`upstream::http1::Received`): no body holds more bytes than came in, and
//!   every input ends framed or refused;
//! - `directory`: a Raft append (or a list of command envelopes) decoded and applied to the
//!   directory state machine, whose invariants must hold after every entry;
//! - `config`: a router TOML file (and `up`'s) parsed and validated.

use anyhow::bail;
use ownerserve_bench::fuzz::{hex, run, Target};
use ownerserve_eval::console::say;

mod config;
mod directory;
mod kv_events;
mod openai;
mod sse_relay;
mod worker_http;

/// Flags of `ownerserve fuzz`.
#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// Targets to run (comma-separated): openai, kv-events, sse-relay, worker-http, directory, config.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "openai,kv-events,sse-relay,worker-http,directory,config"
    )]
    targets: Vec<String>,
    /// Inputs per target.
    #[arg(long, default_value_t = 1_000_000)]
    inputs: u64,
    /// Seed of the mutation engine (the same seed replays the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs each target; fails if any panicked.
pub fn fuzz(args: &FuzzArgs) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    say(&format!(
        "fuzz: {} inputs per target, seed {}",
        args.inputs, args.seed
    ));
    say("| target | executions | accepted | executions/s | panics |");
    say("|---|---:|---:|---:|---:|");
    for name in &args.targets {
        let mut target = target(name)?;
        let started = std::time::Instant::now();
        let report = run(&mut target, args.inputs, args.seed);
        say(&format!(
            "| {name} | {} | {} | {:.0} | {} |",
            report.executions,
            report.accepted,
            report.executions as f64 / started.elapsed().as_secs_f64(),
            report.panic_count
        ));
        for (msg, input) in &report.panics {
            say(&format!(
                "  panic in {name}: {msg}\n  input (hex): {}",
                hex(input)
            ));
        }
        if report.panic_count > 0 {
            failed.push(name.clone());
        }
    }
    if !failed.is_empty() {
        bail!("panics in {}", failed.join(", "));
    }
    Ok(())
}

/// Every target, in the order a run takes them.
const TARGETS: [&str; 6] = [
    "openai",
    "kv-events",
    "sse-relay",
    "worker-http",
    "directory",
    "config",
];

/// The target called `name`.
pub fn target(name: &str) -> anyhow::Result<Target> {
    Ok(match name {
        "openai" => openai::target(),
        "kv-events" => kv_events::target(),
        "sse-relay" => sse_relay::target()?,
        "worker-http" => worker_http::target(),
        "directory" => directory::target(),
        "config" => config::target(),
        other => {
            bail!("no fuzz target `{other}` ({})", TARGETS.join(", "))
        }
    })
}

fn tokens(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// JSON tokens that reach the corners of a JSON parser and of what reads its values.
const JSON_TOKENS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e400",
    "-0",
    "1.5",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "\"\"",
    "[]",
    "{}",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "[[[[[[[[",
    "{\"a\":",
    ",",
    ":",
    "\"",
    "\\",
];

#[cfg(test)]
mod tests {
    use ownerserve_bench::fuzz::Verdict;

    use super::*;

    /// The short run CI makes: every target, 20,000 inputs each, no panic.
    #[test]
    fn every_target_survives_a_short_run() {
        for name in TARGETS {
            let mut t = target(name).unwrap();
            let r = run(&mut t, 20_000, 1);
            assert_eq!(
                r.panic_count,
                0,
                "{name}: {:?}",
                r.panics.first().map(|(m, i)| (m, hex(i)))
            );
            assert!(
                r.accepted > 0,
                "{name}: no input was accepted, the seeds are wrong"
            );
        }
    }

    #[test]
    fn every_seed_is_accepted() {
        for name in TARGETS {
            let mut t = target(name).unwrap();
            let seeds = t.seeds.clone();
            for (i, s) in seeds.iter().enumerate() {
                assert_eq!((t.run)(s), Verdict::Accepted, "{name} seed {i}");
            }
        }
    }
}
