//! `ownerserve bench classes`: admission classes under overload. Each phase starts `up` on
//! the same small fleet (hybrid sim workers in real time, vLLM's priority scheduling, a few
//! slots per worker and a short queue, so the router's queue is where overload waits) and
//! runs closed-loop streaming clients for a fixed time:
//! 1. *unloaded*: the interactive clients alone;
//! 2. *classes*: the same interactive clients, plus batch and background floods that
//!    ask for several times the fleet's slots, each labelled `x-ownerserve-class`;
//! 3. *one class* (the baseline, same run): the same floods unlabelled, so every request
//!    is `interactive`, as a router without classes serves them.
//!
//! It prints per phase and class the requests sent, served to `[DONE]`, shed (429 / 503)
//! and time to first token p50/p99, then interactive p99 TTFT under overload over its
//! unloaded value, with classes and without.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use crate::overload::model_of;
use crate::percentile;
use crate::proxy::start;
use ownerserve_eval::console::say;

/// Flags of `ownerserve bench classes`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClassesArgs {
    /// Seconds each phase runs.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Hybrid sim workers.
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// `max_inflight_per_worker`: the router's slots per worker.
    #[arg(long, default_value_t = 16)]
    slots_per_worker: u32,
    /// `max_queued_per_model`.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Interactive clients, each waiting `think_ms` between its requests.
    #[arg(long, default_value_t = 4)]
    interactive: usize,
    /// Think time of an interactive client between requests, ms.
    #[arg(long, default_value_t = 250)]
    think_ms: u64,
    /// Batch clients, each sending its next request as soon as one ends (or is shed).
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Background clients, likewise.
    #[arg(long, default_value_t = 64)]
    background: usize,
    /// Mean `max_tokens` of an interactive request.
    #[arg(long, default_value_t = 64)]
    interactive_tokens: u32,
    /// Mean `max_tokens` of a batch or background request. Every request's is spread over
    /// ½–1½ times its class's mean, so closed-loop clients do not run in lockstep.
    #[arg(long, default_value_t = 256)]
    flood_tokens: u32,
    /// Prompt bytes of each request (each prompt is unique).
    #[arg(long, default_value_t = 2048)]
    prompt_bytes: usize,
}

/// The classes, in the order they are printed.
const CLASSES: [&str; 3] = ["interactive", "batch", "background"];

/// What a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Unloaded,
    Classes,
    OneClass,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Unloaded => "unloaded",
            Phase::Classes => "classes",
            Phase::OneClass => "one class (baseline)",
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// Served to `[DONE]`, its first token after this long.
    Served(Duration),
    Shed429,
    Shed503,
    Failed,
}

/// One client's results, by class index.
type Results = Vec<(usize, Outcome)>;

pub async fn run(args: ClassesArgs) -> anyhow::Result<()> {
    say(&format!(
        "bench classes: {} hybrid sim workers (real time, vLLM priority scheduling), {} slots each, queue {}; {} interactive clients (think {} ms, max_tokens {}), {} batch and {} background clients (max_tokens {}), {} B unique prompts; {} s per phase",
        args.workers, args.slots_per_worker, args.queue, args.interactive, args.think_ms,
        args.interactive_tokens, args.batch, args.background, args.flood_tokens,
        args.prompt_bytes, args.seconds
    ));
    say("| phase | class | sent | served | 429 | 503 | failed | TTFT p50 / p99 ms |");
    say("|---|---|---:|---:|---:|---:|---:|---:|");
    let mut p99 = Vec::new();
    for phase in [Phase::Unloaded, Phase::Classes, Phase::OneClass] {
        let results = one_phase(&args, phase).await?;
        for (i, class) in CLASSES.iter().enumerate() {
            let of: Vec<Outcome> = results
                .iter()
                .filter(|(c, _)| *c == i)
                .map(|(_, o)| *o)
                .collect();
            if of.is_empty() {
                continue;
            }
            let (line, p) = row(phase.name(), class, &of);
            say(&line);
            if i == 0 {
                p99.push(p);
            }
        }
    }
    if let [unloaded, classes, one] = p99[..] {
        say(&format!(
            "interactive p99 TTFT under overload / unloaded: with classes {:.2}x, without (one class) {:.2}x",
            classes / unloaded,
            one / unloaded
        ));
    }
    Ok(())
}

/// The `up` config of every phase.
fn config(args: &ClassesArgs) -> String {
    format!(
        r#"[router]
host = "127.0.0.1"
port = 0
policy = "ownerserve"
worker_threads = 0
busy_poll_us = 0

[router.admission]
max_inflight_per_worker = {slots}
max_queued_per_model = {queue}

[router.upstream]
request_timeout_s = 600

[router.directory]
mode = "embedded"
worker_lease_ttl_ms = 10000

[sim]
model = "llama-3.1-8b"
gpu = "h100"
gpus = 1
block_size = 16
max_num_batched_tokens = 8192
max_num_seqs = 256
scheduling_policy = "priority"
time_scale = 1.0

[[fleet]]
role = "hybrid"
count = {workers}
"#,
        slots = args.slots_per_worker,
        queue = args.queue,
        workers = args.workers,
    )
}

async fn one_phase(args: &ClassesArgs, phase: Phase) -> anyhow::Result<Results> {
    let path = std::env::temp_dir().join(format!(
        "ownerserve-bench-classes-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, config(args)).context("cannot write the bench's config")?;
    let config_arg = path.display().to_string();
    let (up, url) = tokio::task::spawn_blocking(move || {
        start(&["up", "--config", &config_arg], "router listening on")
    })
    .await??;
    let model = model_of(&url).await?;
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let client = reqwest::Client::new();
    let unique = Arc::new(AtomicU64::new(0));
    let mut clients = JoinSet::new();
    let mut spawn = |class: usize, n: usize, think: Duration, max_tokens: u32| {
        let label = match phase {
            Phase::OneClass => None,
            _ => Some(CLASSES[class]),
        };
        for i in 0..n {
            // Clients start spread over the first second, not all in the same instant.
            let start_after = Duration::from_millis((i as u64 * 1000) / n.max(1) as u64);
            let c = Client {
                http: client.clone(),
                url: url.clone(),
                model: model.clone(),
                label,
                class,
                max_tokens,
                prompt_bytes: args.prompt_bytes,
                unique: unique.clone(),
            };
            clients.spawn(c.run(until, think, start_after));
        }
    };
    spawn(
        0,
        args.interactive,
        Duration::from_millis(args.think_ms),
        args.interactive_tokens,
    );
    if phase != Phase::Unloaded {
        spawn(1, args.batch, Duration::ZERO, args.flood_tokens);
        spawn(2, args.background, Duration::ZERO, args.flood_tokens);
    }
    let mut results = Vec::new();
    while let Some(r) = clients.join_next().await {
        results.extend(r.context("a client task failed")?);
    }
    drop(up);
    let _ = std::fs::remove_file(&path);
    Ok(results)
}

/// One closed-loop client.
struct Client {
    http: reqwest::Client,
    url: String,
    model: String,
    /// Its `x-ownerserve-class`, or none (the baseline).
    label: Option<&'static str>,
    class: usize,
    max_tokens: u32,
    prompt_bytes: usize,
    unique: Arc<AtomicU64>,
}

impl Client {
    /// Sends requests one after another until `until`, `think` apart; a request still
    /// running at `until` is finished and counted.
    async fn run(self, until: Instant, think: Duration, start_after: Duration) -> Results {
        let mut out = Vec::new();
        tokio::time::sleep(start_after).await;
        while Instant::now() < until {
            let outcome = self.one().await;
            out.push((self.class, outcome));
            // A shed request's client backs off as `Retry-After` would ask, at least 1 s.
            let pause = match outcome {
                Outcome::Served(_) => think,
                _ => think.max(Duration::from_secs(1)),
            };
            tokio::time::sleep(pause).await;
        }
        out
    }

    async fn one(&self) -> Outcome {
        let n = self.unique.fetch_add(1, Ordering::Relaxed);
        // A unique prompt: no request finds another's prefix cached.
        let text = format!("{n} {}", "lorem ipsum ".repeat(self.prompt_bytes / 12));
        let body = serde_json::json!({
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": spread(self.max_tokens, n),
            "stream": true,
        });
        let mut req = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&body);
        if let Some(l) = self.label {
            req = req.header("x-ownerserve-class", l);
        }
        let started = Instant::now();
        let Ok(mut resp) = req.send().await else {
            return Outcome::Failed;
        };
        match resp.status().as_u16() {
            200 => {}
            429 => return Outcome::Shed429,
            503 => return Outcome::Shed503,
            _ => return Outcome::Failed,
        }
        let mut first = None;
        let mut tail = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    if first.is_none() && c.windows(5).any(|w| w == b"data:") {
                        first = Some(started.elapsed());
                    }
                    tail.extend_from_slice(&c);
                    if tail.len() > 4096 {
                        tail.drain(..tail.len() - 1024);
                    }
                }
                Ok(None) => break,
                Err(_) => return Outcome::Failed,
            }
        }
        let text = String::from_utf8_lossy(&tail);
        match first {
            Some(t) if text.contains("[DONE]") && !text.contains("\"error\"") => Outcome::Served(t),
            _ => Outcome::Failed,
        }
    }
}

/// `max_tokens` for request `n`: spread evenly over ½–1½ × `tokens` (deterministically),
/// so closed-loop clients do not finish, and send their next prompts, in lockstep.
fn spread(tokens: u32, n: u64) -> u32 {
    let step = (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as u32; // 0..1024
    (tokens / 2 + tokens * step / 1024).max(1)
}

/// One table row, and the class's p99 TTFT in ms.
fn row(phase: &str, class: &str, outcomes: &[Outcome]) -> (String, f64) {
    let count = |want: Outcome| outcomes.iter().filter(|o| **o == want).count();
    let mut ttft: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Served(t) => Some(t.as_secs_f64() * 1e3),
            _ => None,
        })
        .collect();
    ttft.sort_by(f64::total_cmp);
    let p99 = percentile(&ttft, 99.0);
    let line = format!(
        "| {phase} | {class} | {} | {} | {} | {} | {} | {:.0} / {:.0} |",
        outcomes.len(),
        ttft.len(),
        count(Outcome::Shed429),
        count(Outcome::Shed503),
        count(Outcome::Failed),
        percentile(&ttft, 50.0),
        p99
    );
    (line, p99)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_counts_each_outcome_and_times_only_the_served() {
        let ms = |m| Outcome::Served(Duration::from_millis(m));
        let (line, p99) = row(
            "p",
            "batch",
            &[
                ms(10),
                ms(30),
                Outcome::Shed429,
                Outcome::Shed503,
                Outcome::Failed,
            ],
        );
        assert_eq!(line, "| p | batch | 5 | 2 | 1 | 1 | 1 | 30 / 30 |");
        assert_eq!(p99, 30.0);
    }

    #[test]
    fn lengths_spread_over_half_to_one_and_a_half_times() {
        let l: Vec<u32> = (0..1000).map(|n| spread(256, n)).collect();
        assert!(l.iter().all(|t| (128..384).contains(t)));
        let mean = l.iter().map(|t| f64::from(*t)).sum::<f64>() / 1000.0;
        assert!((mean - 256.0).abs() < 10.0, "{mean}");
    }

    #[test]
    fn the_config_loads_as_an_up_config() {
        let args = ClassesArgs {
            seconds: 1,
            workers: 3,
            slots_per_worker: 5,
            queue: 7,
            interactive: 1,
            think_ms: 0,
            batch: 1,
            background: 1,
            interactive_tokens: 1,
            flood_tokens: 1,
            prompt_bytes: 1,
        };
        let t: toml::Table = config(&args).parse().unwrap();
        assert_eq!(
            t["router"]["admission"]["max_inflight_per_worker"].as_integer(),
            Some(5)
        );
        assert_eq!(t["sim"]["scheduling_policy"].as_str(), Some("priority"));
    }
}
