//! `ownerserve bench directory`: ownership writes on a local 3-node cluster (separate
//! `ownerserve directory` processes, fsynced redb logs): throughput and p50/p99 commit
//! latency with one write in flight (the baseline: no batching possible) and with many
//! (openraft batches them into one append, one fsync); a router's side of it (`replica`:
//! lookups from its replica, a new session's claim, the replica's lag); and the state
//! machine's memory for one million sessions, measured in this process. `--scale` runs
//! the curve over session counts instead (`dir_scale`).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::dir_cluster::{self, write, Cluster, CLUSTER_SECRET};
use super::percentile;
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
    /// Session counts of the scale curve (e.g. `100000,300000,1000000`): memory, snapshot
    /// size and time, a new replica's catch-up, a node's recovery and write rates at each,
    /// instead of the default rows.
    #[arg(long, value_delimiter = ',')]
    scale: Vec<usize>,
    /// Cluster sizes of the scale curve: the first gets every row, the others the writes.
    #[arg(long, value_delimiter = ',', default_value = "3,5")]
    scale_nodes: Vec<usize>,
    /// Seconds of one-at-a-time claims at each point of the scale curve.
    #[arg(long, default_value_t = 3)]
    scale_secs: u64,
    /// Claims per second the cluster commits while a new replica or a restarted node
    /// catches up (scale curve).
    #[arg(long, default_value_t = 10_000)]
    tail_rate: u64,
    /// Folder for the scale curve's PNG plots.
    #[arg(long)]
    plot_dir: Option<std::path::PathBuf>,
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
pub(crate) use super::dir_cluster::own_rss_bytes as rss_bytes;

fn sessions_memory(n: usize) -> anyhow::Result<(u64, u64)> {
    let mut grown = super::dir_snapshot::Grown::new()?;
    grown.grow_to(n)?;
    Ok((
        grown.rss_before(),
        grown.rss_before() + grown.resident_bytes(),
    ))
}

/// Runs the benchmark and prints a Markdown table.
pub async fn run(args: DirectoryBenchArgs) -> anyhow::Result<()> {
    if !args.scale.is_empty() {
        return super::dir_scale::run(super::dir_scale::ScaleOptions {
            counts: args.scale,
            nodes: args.scale_nodes,
            batches_in_flight: args.batches_in_flight,
            one_at_a_time_s: args.scale_secs,
            tail_rate: args.tail_rate,
            plot_dir: args.plot_dir,
        })
        .await;
    }
    let cluster = Cluster::start(3)?;
    let http = dir_cluster::http_client()?;
    let leader = dir_cluster::leader(&http, &cluster.urls).await?;
    // A router's replica follows the cluster through every load below.
    let router = super::replica::RouterSide::connect(cluster.urls.clone(), CLUSTER_SECRET)?;
    let lease = dir_cluster::grant_lease(&http, &leader).await?;
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
