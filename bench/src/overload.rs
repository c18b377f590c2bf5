//! `ownerserve bench overload`: what a flood of long streams does to `ownerserve up`. For
//! each policy it starts `up` (its embedded defaults: 4 simulated workers in real time,
//! admission control as shipped), opens N streaming chat requests at once, each on its own
//! connection, and meanwhile probes `/health` every 50 ms and samples the router process's
//! RSS every 100 ms. It prints, per policy: how many streams were admitted (200) and read
//! to the end, shed (429 / 503), failed otherwise, or got no answer within the deadline;
//! p50/p99 time to response headers and to the end of the stream of the admitted ones;
//! `/health` p50/p99/max; the peak RSS. Every client must get an answer: "no answer" is
//! the failure this measures.

use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::task::JoinSet;

use crate::percentile;
use crate::proxy::start;
use ownerserve_eval::console::say;

/// Flags of `ownerserve bench overload`.
#[derive(Debug, clap::Args)]
pub struct OverloadArgs {
    /// Concurrent streams, all opened at once.
    #[arg(long, default_value_t = 2000)]
    streams: usize,
    /// `max_tokens` of each stream (the sim decodes in real time: a few seconds each).
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// Prompt size of each request, in bytes.
    #[arg(long, default_value_t = 2048)]
    prompt_bytes: usize,
    /// Seconds a client waits for its response headers before counting "no answer".
    #[arg(long, default_value_t = 60)]
    deadline_s: u64,
    /// Policies to run, one `up` each.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ownerserve,round_robin,kv_aware"
    )]
    policies: Vec<String>,
}

/// How one stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// 200 and the stream read to its end: time to headers, time to the end.
    Served { headers: Duration, done: Duration },
    /// 200 but the stream ended with an error event or broke.
    Cut,
    /// 429: shed by admission control.
    Shed429,
    /// 503: over the connection limit or no healthy worker.
    Shed503,
    /// Any other status or a connection error.
    Failed,
    /// No response headers within the deadline.
    NoAnswer,
}

pub async fn run(args: OverloadArgs) -> anyhow::Result<()> {
    say(&format!(
        "bench overload: {} concurrent streams (max_tokens {}, {} B prompts) against `ownerserve up` (defaults, real-time sim), each opened at once; deadline {} s",
        args.streams, args.max_tokens, args.prompt_bytes, args.deadline_s
    ));
    say("| policy | served | cut | 429 | 503 | failed | no answer | headers p50/p99 s | done p50/p99 s | /health p50/p99/max ms | router RSS peak MB |");
    say("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for policy in &args.policies {
        one_policy(&args, policy).await?;
    }
    Ok(())
}

async fn one_policy(args: &OverloadArgs, policy: &str) -> anyhow::Result<()> {
    let policy_arg = policy.to_owned();
    let (up, url) = tokio::task::spawn_blocking(move || {
        start(
            &["up", "--port", "0", "--policy", &policy_arg],
            "router listening on",
        )
    })
    .await??;
    let pid = up.pid();
    let model = model_of(&url).await?;
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "x ".repeat(args.prompt_bytes / 2)}],
        "max_tokens": args.max_tokens,
        "stream": true,
    })
    .to_string();
    let deadline = Duration::from_secs(args.deadline_s);
    let stop = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut side = JoinSet::new();
    side.spawn(probe_health(url.clone(), stop.clone()));
    side.spawn(peak_rss_mb(pid, stop.clone()));
    // One client: each concurrent request gets its own connection (HTTP/1).
    let client = reqwest::Client::new();
    let mut clients = JoinSet::new();
    for _ in 0..args.streams {
        clients.spawn(one_stream(
            client.clone(),
            url.clone(),
            body.clone(),
            deadline,
        ));
    }
    let mut outcomes = Vec::with_capacity(args.streams);
    while let Some(o) = clients.join_next().await {
        outcomes.push(o.unwrap_or(Outcome::Failed));
    }
    stop.notify_waiters();
    let mut health = Vec::new();
    let mut peak = 0.0;
    while let Some(r) = side.join_next().await {
        match r.context("a probe task failed")? {
            Side::Health(h) => health = h,
            Side::Rss(mb) => peak = mb,
        }
    }
    say(&row(policy, &outcomes, &health, peak));
    drop(up);
    Ok(())
}

/// One table row.
fn row(policy: &str, outcomes: &[Outcome], health_ms: &[f64], rss_mb: f64) -> String {
    let count = |f: fn(&Outcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
    let mut headers = Vec::new();
    let mut done = Vec::new();
    for o in outcomes {
        if let Outcome::Served {
            headers: h,
            done: d,
        } = o
        {
            headers.push(h.as_secs_f64());
            done.push(d.as_secs_f64());
        }
    }
    for v in [&mut headers, &mut done] {
        v.sort_by(f64::total_cmp);
    }
    let mut health = health_ms.to_vec();
    health.sort_by(f64::total_cmp);
    format!(
        "| {policy} | {} | {} | {} | {} | {} | {} | {:.2} / {:.2} | {:.2} / {:.2} | {:.1} / {:.1} / {:.1} | {:.0} |",
        headers.len(),
        count(|o| *o == Outcome::Cut),
        count(|o| *o == Outcome::Shed429),
        count(|o| *o == Outcome::Shed503),
        count(|o| *o == Outcome::Failed),
        count(|o| *o == Outcome::NoAnswer),
        percentile(&headers, 50.0),
        percentile(&headers, 99.0),
        percentile(&done, 50.0),
        percentile(&done, 99.0),
        percentile(&health, 50.0),
        percentile(&health, 99.0),
        health.last().copied().unwrap_or(f64::NAN),
        rss_mb,
    )
}

/// The model `up` serves.
pub(crate) async fn model_of(url: &str) -> anyhow::Result<String> {
    let models: serde_json::Value = reqwest::get(format!("{url}/v1/models"))
        .await?
        .json()
        .await?;
    models["data"][0]["id"]
        .as_str()
        .map(str::to_owned)
        .context("`up` serves no model")
}

/// One streaming request, read to the end.
async fn one_stream(
    client: reqwest::Client,
    url: String,
    body: String,
    deadline: Duration,
) -> Outcome {
    let started = Instant::now();
    let sent = client
        .post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(body)
        .send();
    let mut resp = match tokio::time::timeout(deadline, sent).await {
        Err(_) => return Outcome::NoAnswer,
        Ok(Err(_)) => return Outcome::Failed,
        Ok(Ok(r)) => r,
    };
    let headers = started.elapsed();
    match resp.status().as_u16() {
        200 => {}
        429 => return Outcome::Shed429,
        503 => return Outcome::Shed503,
        _ => return Outcome::Failed,
    }
    let mut tail = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                // Only the end matters: whether the last event was `[DONE]` after no error.
                tail.extend_from_slice(&c);
                if tail.len() > 4096 {
                    tail.drain(..tail.len() - 1024);
                }
            }
            Ok(None) => break,
            Err(_) => return Outcome::Cut,
        }
    }
    let text = String::from_utf8_lossy(&tail);
    if text.contains("[DONE]") && !text.contains("\"error\"") {
        Outcome::Served {
            headers,
            done: started.elapsed(),
        }
    } else {
        Outcome::Cut
    }
}

/// What a side task measured.
enum Side {
    /// `/health` latencies in ms.
    Health(Vec<f64>),
    /// Peak RSS in MB.
    Rss(f64),
}

/// Probes `/health` every 50 ms (on a kept-alive connection, as a load balancer does) until
/// `stop`; a probe that fails counts as the 10 s it waited at most.
async fn probe_health(url: String, stop: std::sync::Arc<tokio::sync::Notify>) -> Side {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut out = Vec::new();
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        let t = Instant::now();
        let ok = tokio::select! {
            () = &mut stopped => break,
            r = client.get(format!("{url}/health")).send() => r.is_ok_and(|r| r.status().is_success()),
        };
        out.push(if ok {
            t.elapsed().as_secs_f64() * 1e3
        } else {
            10_000.0
        });
        tokio::select! {
            () = &mut stopped => break,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    Side::Health(out)
}

/// Samples `pid`'s resident set every 100 ms until `stop`; the peak in MB.
async fn peak_rss_mb(pid: u32, stop: std::sync::Arc<tokio::sync::Notify>) -> Side {
    let mut peak = 0.0_f64;
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        if let Some(kb) = crate::proc_stats::rss_kb(pid) {
            peak = peak.max(kb as f64 / 1024.0);
        }
        tokio::select! {
            () = &mut stopped => break,
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
    Side::Rss(peak)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_counts_each_outcome_and_times_only_the_served() {
        let served = |s| Outcome::Served {
            headers: Duration::from_secs(s),
            done: Duration::from_secs(s + 1),
        };
        let outcomes = [
            served(1),
            served(3),
            Outcome::Shed429,
            Outcome::Shed429,
            Outcome::Shed503,
            Outcome::NoAnswer,
            Outcome::Cut,
        ];
        let r = row("p", &outcomes, &[1.0, 2.0, 30.0], 123.4);
        assert_eq!(
            r,
            "| p | 2 | 1 | 2 | 1 | 0 | 1 | 3.00 / 3.00 | 4.00 / 4.00 | 2.0 / 30.0 / 30.0 | 123 |"
        );
    }
}
