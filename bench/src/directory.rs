//! `ownerserve bench directory`: ownership writes on a local 3-node cluster (separate
//! `ownerserve directory` processes, fsynced redb logs): throughput and p50/p99 commit
//! latency with one write in flight (the baseline: no batching possible) and with many
//! (openraft batches them into one append, one fsync); a router's side of it (`replica`:
//! lookups from its replica, a new session's claim, the replica's lag); and the state
//! machine's memory for one million sessions, measured in this process.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use ownerserve_ownership::ids::{SessionId, WorkerId};
use ownerserve_ownership::{Command, Directory, Envelope};

use super::percentile;
use super::proxy::{start, Reaped};
use ownerserve_eval::console::say;

/// Flags of `ownerserve bench directory`.
#[derive(Debug, clap::Args)]
pub struct DirectoryBenchArgs {
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    duration_s: u64,
    /// Writes in flight for the many-writers run.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Claims per `Batch` command in the batched run.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Batches in flight in the batched run.
    #[arg(long, default_value_t = 1)]
    batches_in_flight: usize,
    /// Sessions for the memory measurement.
    #[arg(long, default_value_t = 1_000_000)]
    sessions: usize,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

struct Cluster {
    _nodes: Vec<Reaped>,
    urls: Vec<String>,
    dir: std::path::PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The secret of the benchmark's own cluster (its nodes live as long as the run), sent in
/// `ownerserve_ownership::node::secret::HEADER`.
const CLUSTER_SECRET: &str = "ownerserve-bench-directory";

fn start_cluster() -> anyhow::Result<Cluster> {
    let ports = [free_port()?, free_port()?, free_port()?];
    let dir = std::env::temp_dir().join(format!("ownerserve-bench-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let peers: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
        .collect();
    let mut nodes = Vec::new();
    let mut urls = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let id = (i + 1).to_string();
        let listen = format!("127.0.0.1:{port}");
        let data = dir.join(format!("node{id}"));
        let data = data.to_str().context("temp path")?.to_owned();
        let mut args = vec![
            "directory",
            "--id",
            &id,
            "--listen",
            &listen,
            "--data-dir",
            &data,
            "--cluster-secret",
            CLUSTER_SECRET,
        ];
        for p in &peers {
            args.push("--peer");
            args.push(p);
        }
        if i == 0 {
            args.push("--init");
        }
        let (child, url) = start(&args, "listening on")?;
        nodes.push(child);
        urls.push(url);
    }
    Ok(Cluster {
        _nodes: nodes,
        urls,
        dir,
    })
}

async fn leader(http: &reqwest::Client, c: &Cluster) -> anyhow::Result<String> {
    for _ in 0..200 {
        for url in &c.urls {
            if let Ok(r) = http.get(format!("{url}/directory/v1/cluster")).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    if v["state"] == "Leader" {
                        return Ok(url.clone());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("no leader elected")
}

async fn write(http: &reqwest::Client, leader: &str, command: &Value) -> anyhow::Result<Value> {
    let resp = http
        .post(format!("{leader}/directory/v1/commands"))
        .json(&json!({"command": command}))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("write failed: {}", resp.status());
    }
    Ok(resp.json::<Value>().await?["outcome"].clone())
}

fn claim(key: u64, lease: u64) -> Value {
    json!({"Claim": {"key": key, "lease": lease,
        "spec": {"parent": null, "blocks": [0, 16], "kv_type": "gqa-bf16", "size_bytes": 1024},
        "expect_epoch": null}})
}

/// Runs `concurrency` writers, each sending `batch` claims per command (1: a plain claim),
/// for `secs`; returns (claims/s, sorted commit latencies in ms).
async fn load(
    http: &reqwest::Client,
    leader: &str,
    lease: u64,
    concurrency: usize,
    batch: usize,
    secs: u64,
    key_base: u64,
) -> anyhow::Result<(f64, Vec<f64>)> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..concurrency as u64 {
        let (http, leader) = (http.clone(), leader.to_owned());
        tasks.spawn(async move {
            let (mut lat, mut claims) = (Vec::new(), 0usize);
            let mut key = key_base + (w << 32);
            while Instant::now() < deadline {
                let cmd = if batch <= 1 {
                    claim(key, lease)
                } else {
                    let commands: Vec<Value> =
                        (0..batch as u64).map(|i| claim(key + i, lease)).collect();
                    json!({"Batch": {"commands": commands}})
                };
                let t = Instant::now();
                if write(&http, &leader, &cmd).await.is_ok() {
                    lat.push(t.elapsed().as_secs_f64() * 1e3);
                    claims += batch.max(1);
                }
                key += batch.max(1) as u64;
            }
            (lat, claims)
        });
    }
    let (mut all, mut claims) = (Vec::new(), 0usize);
    while let Some(r) = tasks.join_next().await {
        let (lat, n) = r?;
        all.extend(lat);
        claims += n;
    }
    let rate = claims as f64 / started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    Ok((rate, all))
}

/// This process's resident memory, in bytes (0 where `/proc` cannot tell).
pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn sessions_memory(n: usize) -> anyhow::Result<(u64, u64)> {
    let before = rss_bytes();
    let mut d = Directory::new(500);
    let env = |command| Envelope {
        now_ms: 1,
        client: None,
        command,
    };
    let granted = d.apply(
        1,
        &env(Command::GrantLease {
            worker: WorkerId(0),
            ttl_ms: u64::MAX / 4,
        }),
    );
    let ownerserve_ownership::Outcome::LeaseGranted { lease, .. } = granted else {
        bail!("lease not granted: {granted:?}");
    };
    for i in 0..n {
        d.apply(
            i as u64 + 2,
            &env(Command::SetDecodeOwner {
                session: SessionId(format!("session-{i:08}")),
                lease,
                prefix: None,
                tail_tokens: 100,
                predicted_tool_gap_ms: Some(30_000),
                expect_epoch: None,
            }),
        );
    }
    let after = rss_bytes();
    if d.sessions.len() != n {
        bail!("only {} of {n} sessions were created", d.sessions.len());
    }
    std::hint::black_box(&d);
    Ok((before, after))
}

/// Runs the benchmark and prints a Markdown table.
pub async fn run(args: DirectoryBenchArgs) -> anyhow::Result<()> {
    let cluster = start_cluster()?;
    let mut secret = reqwest::header::HeaderMap::new();
    secret.insert(
        "x-ownerserve-cluster-secret",
        reqwest::header::HeaderValue::from_static(CLUSTER_SECRET),
    );
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .default_headers(secret)
        .build()?;
    let leader = leader(&http, &cluster).await?;
    // A router's replica follows the cluster through every load below.
    let router = super::replica::RouterSide::connect(cluster.urls.clone(), CLUSTER_SECRET)?;
    let granted = write(
        &http,
        &leader,
        &json!({"GrantLease": {"worker": 0, "ttl_ms": 3_600_000u64}}),
    )
    .await?;
    let lease = granted["LeaseGranted"]["lease"]
        .as_u64()
        .context("no lease granted")?;
    let secs = args.duration_s.max(1);
    say(&format!(
        "bench directory: 3 `ownerserve directory` processes on 127.0.0.1, redb logs fsynced per append, {secs}s per run"
    ));
    say("| workload | writes/s | p50 ms | p99 ms | target |");
    say("|---|---:|---:|---:|---|");
    let (r1, l1) = load(&http, &leader, lease, 1, 1, secs, 1 << 40).await?;
    say(&format!(
        "| claims, 1 in flight (baseline: no batching) | {r1:.0} | {:.2} | {:.2} | |",
        percentile(&l1, 50.0),
        percentile(&l1, 99.0)
    ));
    let c = args.concurrency.max(1);
    let (rn, ln) = load(&http, &leader, lease, c, 1, secs, 2 << 40).await?;
    say(&format!(
        "| claims, {c} in flight (openraft batches the appends) | {rn:.0} ({:.1}x) | {:.2} | {:.2} | |",
        rn / r1,
        percentile(&ln, 50.0),
        percentile(&ln, 99.0)
    ));
    let (b, f) = (args.batch.max(2), args.batches_in_flight.max(1));
    let (rb, lb) = load(&http, &leader, lease, f, b, secs, 3 << 40).await?;
    say(&format!(
        "| claims in `Batch` commands of {b}, {f} in flight (latency per batch) | {rb:.0} ({:.1}x) | {:.2} | {:.2} | ≥ 10,000/s, p99 ≤ 10 ms |",
        rb / r1,
        percentile(&lb, 50.0),
        percentile(&lb, 99.0)
    ));
    router.run(lease, secs).await?;
    drop(cluster);
    let (before, after) =
        tokio::task::spawn_blocking(move || sessions_memory(args.sessions)).await??;
    say(&format!(
        "| state machine with {} sessions: resident memory | {:.0} MB (process {:.0} MB before) | | | ≤ 1 GB |",
        args.sessions,
        after.saturating_sub(before) as f64 / 1e6,
        before as f64 / 1e6
    ));
    Ok(())
}
