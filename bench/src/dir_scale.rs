//! `ownerserve bench directory --scale 100000,300000,1000000`: the directory's costs as
//! its sessions grow, one column per session count. In this process: the state machine's
//! memory per session, and a node's snapshot of it (size; build, install and load through
//! the node's own `StateMachineStore`, each beside the bare `serde_json` floor). Against a
//! 3-node cluster of `ownerserve directory` processes filled to each count: the batched
//! write rate while filling, one claim at a time (the baseline), each node's memory, a new
//! router replica's catch-up (snapshot + tail) and a follower's recovery from `kill -9`
//! while the cluster keeps committing. Then a 5-node cluster's write rates. Prints the
//! figures as they come, then the table with the targets; `--plot-dir` draws the curves.

use std::path::PathBuf;

use ownerserve_eval::console::say;
use ownerserve_ownership::ids::LeaseId;

use super::dir_cluster::{grant_lease, http_client, leader, status, Cluster, Writer};
use super::dir_live::{self, CatchUp, Recovery, Tail, MISSED_ENTRIES};
use super::dir_report::{mb, plots, short, table, Live, Point};
use super::dir_snapshot::{self, Grown, SnapshotFigures};
use super::percentile;

/// What `--scale` runs with.
pub struct ScaleOptions {
    /// Session counts, ascending.
    pub counts: Vec<usize>,
    /// Cluster sizes: the first gets every row, the others the write rates and memory.
    pub nodes: Vec<usize>,
    /// Batches in flight while filling.
    pub batches_in_flight: usize,
    /// Seconds of one-at-a-time claims per point.
    pub one_at_a_time_s: u64,
    /// Claims per second committed while a replica or a restarted node catches up.
    pub tail_rate: u64,
    /// Where to draw the PNG plots (none: no plots).
    pub plot_dir: Option<PathBuf>,
}

/// Says so when the cluster did not settle after a recovery (the next figures are taken
/// anyway, and show it).
fn settled(done: anyhow::Result<()>) {
    if let Err(e) = done {
        say(&format!("  the cluster did not settle: {e:#}"));
    }
}

/// Prints a point's catch-up and recoveries as they were measured, failures included.
fn report(
    n: usize,
    caught: &anyhow::Result<CatchUp>,
    recovered: &anyhow::Result<Recovery>,
    installed: &anyhow::Result<Recovery>,
) {
    let n = short(n);
    match caught {
        Ok(c) => say(&format!(
            "  {n}: new replica synced {:.2} s, caught up {:.2} s ({} tail entries, {} reconnects)",
            c.synced_s, c.caught_up_s, c.tail_entries, c.reconnects
        )),
        Err(e) => say(&format!("  {n}: new replica FAILED: {e:#}")),
    }
    for (case, r) in [
        ("follower after kill -9", recovered),
        (
            "follower down past the leader's log, sent its snapshot",
            installed,
        ),
    ] {
        match r {
            Ok(r) => say(&format!(
                "  {n}: {case}: listening {:.2} s, caught up {:.2} s (snapshot file {:.0} MB, log {:.0} MB)",
                r.listening_s, r.caught_up_s, mb(r.snapshot_bytes), mb(r.log_bytes)
            )),
            Err(e) => say(&format!("  {n}: {case}: FAILED: {e:#}")),
        }
    }
}

/// Runs the curve and prints it.
pub async fn run(opts: ScaleOptions) -> anyhow::Result<()> {
    let mut counts = opts.counts.clone();
    counts.sort_unstable();
    counts.dedup();
    let mut points: Vec<Point> = counts
        .iter()
        .map(|&n| Point {
            n,
            memory_b: 0.0,
            snapshot: SnapshotFigures::default(),
            live: opts.nodes.iter().map(|_| Live::default()).collect(),
        })
        .collect();
    say(&format!(
        "bench directory --scale: sessions {}; clusters of {:?} `ownerserve directory` processes on 127.0.0.1 (redb, fsync)",
        counts.iter().map(|&n| short(n)).collect::<Vec<_>>().join(", "),
        opts.nodes
    ));
    in_process(&mut points).await?;
    for (k, &nodes) in opts.nodes.iter().enumerate() {
        live(&mut points, k, nodes, &opts).await?;
    }
    table(&points, &opts.nodes, opts.tail_rate);
    if let Some(dir) = &opts.plot_dir {
        plots(&points, &opts.nodes, dir)?;
    }
    Ok(())
}

async fn in_process(points: &mut [Point]) -> anyhow::Result<()> {
    let mut grown = Grown::new()?;
    let dir = std::env::temp_dir().join(format!("ownerserve-bench-snap-{}", std::process::id()));
    for p in points.iter_mut() {
        grown.grow_to(p.n)?;
        p.memory_b = grown.resident_bytes() as f64 / p.n as f64;
        p.snapshot = dir_snapshot::measure(&mut grown, &dir).await?;
        let s = &p.snapshot;
        say(&format!(
            "  {}: state machine {:.0} B/session (process {:.0} MB before); state JSON {:.0} MB, encode {:.2} s, decode {:.2} s; node's snapshot: build {:.2} s (longest apply beside it {:.1} ms), file {:.0} MB, install {:.2} s, load {:.2} s",
            short(p.n), p.memory_b, grown.rss_before() as f64 / 1e6, mb(s.state_bytes), s.encode_s,
            s.decode_s, s.build_s, s.apply_wait_s * 1e3, mb(s.file_bytes), s.install_s, s.load_s
        ));
    }
    Ok(())
}

async fn live(
    points: &mut [Point],
    k: usize,
    nodes: usize,
    opts: &ScaleOptions,
) -> anyhow::Result<()> {
    let mut cluster = Cluster::start(nodes)?;
    let http = http_client()?;
    let lead = leader(&http, &cluster.urls).await?;
    let lease = LeaseId(grant_lease(&http, &lead).await?);
    let term = |v: serde_json::Value| v["term"].as_u64().unwrap_or(0);
    let first_term = term(status(&http, &lead).await?);
    let to_cluster = Writer::new(&http, &cluster.urls, &lead);
    let (mut have, mut one_next) = (0, 10_000_000);
    for p in points.iter_mut() {
        let l = &mut p.live[k];
        let batched =
            dir_live::fill(&to_cluster, lease, (have, p.n), opts.batches_in_flight).await?;
        have = p.n;
        let (one, next) =
            dir_live::one_at_a_time(&to_cluster, lease, one_next, opts.one_at_a_time_s).await?;
        one_next = next;
        l.rss_max = (0..nodes).map(|i| cluster.rss_bytes(i)).max().unwrap_or(0);
        say(&format!(
            "  {nodes} nodes, {}: filling {:.0} claims/s batched (p99 {:.1} ms, max {:.1} ms), one at a time {:.0}/s (p99 {:.2} ms); largest node {:.0} MB",
            short(p.n), batched.rate, percentile(&batched.latencies_ms, 99.0),
            batched.latencies_ms.last().copied().unwrap_or(0.0), one.rate,
            percentile(&one.latencies_ms, 99.0), mb(l.rss_max)
        ));
        (l.batched, l.one) = (Some(batched), Some(one));
        if k == 0 {
            let tail = Tail::start(&to_cluster, lease, p.n, opts.tail_rate);
            let caught = dir_live::catch_up(&cluster.urls, &tail).await;
            let recovered = dir_live::recover(&mut cluster, &http, &tail, MISSED_ENTRIES).await;
            tail.stop().await;
            settled(dir_live::settle(&http, &cluster.urls).await);
            let installed =
                dir_live::recover_from_snapshot(&mut cluster, &http, &to_cluster, lease, p.n).await;
            settled(dir_live::settle(&http, &cluster.urls).await);
            report(p.n, &caught, &recovered, &installed);
            l.catch_up = Some(caught.map_err(|e| format!("{e:#}")));
            l.recovery = Some(recovered.map_err(|e| format!("{e:#}")));
            l.installed = Some(installed.map_err(|e| format!("{e:#}")));
        }
    }
    let lead_now = leader(&http, &cluster.urls).await?;
    let elections = term(status(&http, &lead_now).await?).saturating_sub(first_term);
    say(&format!(
        "  {nodes} nodes: the Raft term rose by {elections} during the run (elections)"
    ));
    Ok(())
}
