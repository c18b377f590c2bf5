//! `ownerserve bench proxy`: how much the router costs as a proxy. In one run it starts a
//! simulated worker in instant mode and a router in front of it (separate processes), then
//! drives both with `wrk` under the same load and prints req/s, p50/p99 and the ratios.
//! The baseline (the worker driven directly) is always measured in the same run.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use ownerserve_eval::console::say;

/// Flags of `ownerserve bench proxy`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Concurrent connections for the throughput runs.
    #[arg(long, default_value_t = 32)]
    connections: u32,
    /// wrk threads.
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// `max_tokens` of every request.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Routing policy of the router under test.
    #[arg(long, default_value = "round_robin")]
    policy: String,
    #[command(flatten)]
    peers: crate::peers::PeerArgs,
}

/// A child process killed on drop.
pub struct Reaped(Child);

impl Reaped {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    /// Sends `signal` (`-STOP`, `-CONT`, ...) to the child with the `kill` command.
    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .context("cannot run kill")?;
        if !status.success() {
            bail!("kill {signal} {} failed: {status}", self.pid());
        }
        Ok(())
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `ownerserve <args>` and returns it with the URL it prints after `marker`.
pub fn start(args: &[&str], marker: &str) -> anyhow::Result<(Reaped, String)> {
    spawn(args, &[], marker, Stdio::inherit())
}

/// [`start`] with `envs` set too (secrets stay out of the process list) and the child's
/// standard input a pipe this process holds open as long as the child is kept: a child
/// started with `--exit-with-stdin` then stops when this process dies, even killed before
/// it could reap it.
pub fn start_tied(
    args: &[&str],
    envs: &[(&str, &str)],
    marker: &str,
) -> anyhow::Result<(Reaped, String)> {
    spawn(args, envs, marker, Stdio::piped())
}

fn spawn(
    args: &[&str],
    envs: &[(&str, &str)],
    marker: &str,
    stdin: Stdio,
) -> anyhow::Result<(Reaped, String)> {
    let exe = std::env::current_exe().context("cannot find the ownerserve binary")?;
    let mut child = Command::new(exe)
        .args(args)
        .env("OWNERSERVE_LOG", "error,openraft=off")
        .envs(envs.iter().copied())
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start ownerserve {args:?}"))?;
    let out = child.stdout.take().context("no stdout")?;
    let child = Reaped(child);
    if let Some(url) = crate::child_output::url_after(out, marker)? {
        return Ok((child, url));
    }
    bail!("ownerserve {args:?} exited before printing `{marker}`")
}

/// One wrk measurement.
#[derive(Debug, Clone, Copy)]
struct Measured {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
}

fn wrk_script(body: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::temp_dir().join(format!(
        "ownerserve-bench-{}-{}.lua",
        std::process::id(),
        body.len()
    ));
    let mut f = std::fs::File::create(&path)?;
    // A Lua long string needs no escaping as long as the body has no "]==]".
    writeln!(
        f,
        "wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.body = [==[{body}]==]"
    )?;
    Ok(path)
}

fn wrk(
    url: &str,
    script: &PathBuf,
    threads: u32,
    conns: u32,
    secs: u64,
) -> anyhow::Result<Measured> {
    let out = Command::new("wrk")
        .args([
            "--latency",
            "-t",
            &threads.min(conns).to_string(),
            "-c",
            &conns.to_string(),
            "-d",
            &format!("{secs}s"),
            "-s",
        ])
        .arg(script)
        .arg(url)
        .output()
        .context("cannot run wrk (install it: apt-get install -y wrk)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("wrk failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    // One reading of wrk's output, shared with `bench proxy --peers` (peer_load.rs).
    let m = crate::peer_load::parse_wrk(&text)?;
    if m.non_2xx > 0 {
        bail!(
            "the server answered errors under load: {} non-2xx answers",
            m.non_2xx
        );
    }
    if m.p50_us.is_nan() {
        bail!("no latency distribution in wrk output:\n{text}");
    }
    Ok(Measured {
        rps: m.rps,
        p50_us: m.p50_us,
        p99_us: m.p99_us,
    })
}

fn chat_body(bytes: usize, max_tokens: u32) -> String {
    let filler = "the quick brown fox jumps over the lazy dog ";
    let head = format!(
        r#"{{"model":"meta-llama/Llama-3.1-8B-Instruct","max_tokens":{max_tokens},"messages":[{{"role":"system","content":"You are a coding agent."}},{{"role":"user","content":""#
    );
    let tail = r#""}]}"#;
    let room = bytes.saturating_sub(head.len() + tail.len());
    let content: String = filler.chars().cycle().take(room).collect();
    format!("{head}{content}{tail}")
}

/// Runs the benchmark and prints a Markdown table.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.peers.peers {
        return crate::peers::run(&args.peers, args.duration_s.max(1));
    }
    Command::new("wrk")
        .arg("--version")
        .output()
        .context("wrk is needed for this benchmark: apt-get install -y wrk")?;
    let (_worker, worker_url) = start(&["sim-worker", "--port", "0", "--instant"], "listening on")?;
    let worker_flag = format!("{worker_url},role=decode,engine=sim");
    let (_router, router_url) = start(
        &[
            "router",
            "--port",
            "0",
            "--worker",
            &worker_flag,
            "--policy",
            &args.policy,
        ],
        "listening on",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let direct = format!("{worker_url}/v1/chat/completions");
    let routed = format!("{router_url}/v1/chat/completions");
    let secs = args.duration_s.max(1);

    say(&format!(
        "bench proxy: wrk {}s per run, {} threads; sim worker (instant) direct vs through the router (policy {})",
        secs, args.threads, args.policy
    ));
    say("| body | connections | direct req/s | router req/s | ratio | direct p50/p99 µs | router p50/p99 µs | added p50 µs |");
    say("|---|---:|---:|---:|---:|---:|---:|---:|");
    for (label, size, conns) in [
        ("2 KB", 2048, args.connections),
        ("32 KB", 32 * 1024, args.connections),
        ("2 KB", 2048, 1),
    ] {
        let script = wrk_script(&chat_body(size, args.max_tokens))?;
        // Warm both paths (connections, caches) before measuring.
        wrk(&direct, &script, 1, conns, 1)?;
        wrk(&routed, &script, 1, conns, 1)?;
        let d = wrk(&direct, &script, args.threads, conns, secs)?;
        let r = wrk(&routed, &script, args.threads, conns, secs)?;
        let _ = std::fs::remove_file(&script);
        say(&format!(
            "| {label} | {conns} | {:.0} | {:.0} | {:.2}x | {:.0} / {:.0} | {:.0} / {:.0} | {:.0} |",
            d.rps,
            r.rps,
            r.rps / d.rps,
            d.p50_us,
            d.p99_us,
            r.p50_us,
            r.p99_us,
            r.p50_us - d.p50_us
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_requested_size_and_are_valid_requests() {
        for size in [2048, 32 * 1024] {
            let body = chat_body(size, 16);
            assert_eq!(body.len(), size);
            ownerserve_shim::openai::parse(
                body.as_bytes(),
                ownerserve_shim::openai::Endpoint::ChatCompletions,
            )
            .unwrap();
        }
    }
}
