//! `ownerserve bench replicas`: 1, 2, 4 routers sharing one directory in front of the same
//! simulated fleet. A 3-node directory cluster ([`crate::dir_cluster`]) and instant sim
//! workers (the router, not the engine, is the work) start once; for each router count, that
//! many `ownerserve router` processes (policy `ownerserve`, the directory `remote`, each
//! with its own live replica) start, closed-loop session clients ([`crate::replicas_load`])
//! run a warm-up then a measured window through them, and the routers stop. Per count:
//! throughput, latency, the CPU seconds the routers, the directory and the rest used
//! (`/proc/<pid>/stat`), the directory's log entries and commands, the routers' owner
//! claims; then every session's steps against its owner in the directory
//! ([`crate::ownership_check`]). Figures and ratios: [`crate::replicas_report`].
//!
//! Pinning (`--pin`, on by default with two or more CPUs): routers share the upper half of
//! the CPUs (router `i` on one of them, in turn), everything else (this process's clients,
//! the workers, the directory's nodes) the lower half; so on 2 cores every router count gets
//! the same one core, and the per-router-CPU figures say what each router would do on a core
//! of its own. The total client count stays the same for every router count, so each
//! router's load per CPU share stays the same too.

use std::time::Duration;

use anyhow::bail;

use crate::dir_cluster;
use crate::ownership_check;
use crate::replicas_fleet::{
    claims, cpu_list, cpu_now, directory_counts, owners, pin, router_config, start_fleet,
    start_routers, ticks_per_s, Clients, CpuNow, Cpus, Fleet, MODEL,
};
use crate::replicas_load::{self, Plan, Seen};
use crate::replicas_report::{self, Sample};
use ownerserve_eval::console::say;

/// Flags of `ownerserve bench replicas`.
#[derive(Debug, clap::Args)]
pub struct ReplicasArgs {
    /// Router counts of the curve; the first is the baseline.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    routers: Vec<usize>,
    /// Seconds of the measured window per router count.
    #[arg(long, default_value_t = 15)]
    duration_s: u64,
    /// Seconds of load before each window (not measured).
    #[arg(long, default_value_t = 3)]
    warmup_s: u64,
    /// Closed-loop clients in all, spread over the routers (the same for every count).
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// Steps of one session.
    #[arg(long, default_value_t = 8)]
    steps: usize,
    /// Every this-many-th session of a client alternates between two routers (0: none).
    #[arg(long, default_value_t = 4)]
    cross_every: usize,
    /// Simulated workers (instant).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// The routers' policy.
    #[arg(long, default_value = "ownerserve")]
    policy: String,
    /// Bytes of the system prompt every session starts with.
    #[arg(long, default_value_t = 1024)]
    system_bytes: usize,
    /// Pin routers to the upper half of the CPUs and the rest to the lower half.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pin: bool,
}

/// How long the routers' idle CPU is measured, before the warm-up.
const IDLE_WINDOW: Duration = Duration::from_secs(2);
/// Runs the benchmark and prints its table.
pub async fn run(args: ReplicasArgs) -> anyhow::Result<()> {
    if args.routers.is_empty() || args.routers.contains(&0) {
        bail!("--routers needs counts of at least 1");
    }
    let hz = ticks_per_s();
    let n_cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let cpus = args.pin.then(|| Cpus::split(n_cpus)).flatten();
    if let Some(c) = &cpus {
        pin(std::process::id(), &c.load)?;
    }
    let clients = Clients::new()?;
    let fleet = tokio::task::spawn_blocking({
        let (workers, cpus) = (args.workers, cpus.clone());
        move || start_fleet(workers, cpus.as_ref())
    })
    .await??;
    let leader = dir_cluster::leader(&clients.directory, &fleet.cluster.urls).await?;
    say(&format!(
        "bench replicas: {} instant sim workers, a 3-node directory, routers {:?} (policy {}), {} closed-loop clients, {}-step sessions, every {}th alternating two routers; {} s warm-up, {} s measured per count",
        args.workers, args.routers, args.policy, args.clients, args.steps, args.cross_every, args.warmup_s, args.duration_s
    ));
    say(&match &cpus {
        Some(c) => format!(
            "pinned: routers on CPU {} (router i on the i-th in turn), clients, workers and directory on CPU {}",
            cpu_list(&c.routers),
            cpu_list(&c.load)
        ),
        None => "not pinned".to_owned(),
    });
    let mut samples = Vec::new();
    for (round, &n) in args.routers.iter().enumerate() {
        let sample = measure(
            &args,
            &fleet,
            &clients,
            &leader,
            cpus.as_ref(),
            hz,
            round,
            n,
        )
        .await?;
        say(&format!(
            "  {n} router(s): {} requests in {:.1} s, {} failed; cores busy: routers {:.2} (idle {:.3}), clients + workers {:.2}, directory {:.2}; ownership: {:?}",
            sample.requests,
            sample.secs,
            sample.errors,
            sample.router_cpu_s / sample.secs,
            sample.router_idle_cores,
            sample.load_cpu_s / sample.secs,
            sample.directory_cpu_s / sample.secs,
            sample.ownership
        ));
        samples.push(sample);
    }
    for line in replicas_report::table(&samples) {
        say(&line);
    }
    for line in replicas_report::verdict(&samples) {
        say(&line);
    }
    drop(fleet);
    Ok(())
}

/// One router count: start, warm up, measure, check, stop.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the run's parts, each distinct"
)]
async fn measure(
    args: &ReplicasArgs,
    fleet: &Fleet,
    c: &Clients,
    leader: &str,
    cpus: Option<&Cpus>,
    hz: f64,
    round: usize,
    n: usize,
) -> anyhow::Result<Sample> {
    let config = router_config(
        &fleet.dir,
        &args.policy,
        &fleet.cluster.urls,
        &fleet.worker_urls,
    )?;
    let (routers, urls) = start_routers(n, &config, cpus, c).await?;
    let mut plan = Plan {
        routers: urls.clone(),
        clients: args.clients,
        steps: args.steps,
        cross_every: args.cross_every,
        run: format!("warm{round}"),
        model: MODEL.to_owned(),
        max_tokens: 8,
        system_bytes: args.system_bytes,
    };
    // What the routers use with nothing to serve (one CPU tick is 10 ms: 2 s tells).
    let idle0 = cpu_now(&routers, fleet, hz);
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_cores =
        (cpu_now(&routers, fleet, hz).routers - idle0.routers) / IDLE_WINDOW.as_secs_f64();
    let warm = replicas_load::drive(&c.load, &plan, Duration::from_secs(args.warmup_s)).await;
    if warm.requests() == 0 {
        bail!(
            "no step served during the warm-up with {n} router(s): {}",
            warm.first_error.unwrap_or_default()
        );
    }
    plan.run = format!("n{n}r{round}");
    let (log0, commands0) = directory_counts(c, fleet, leader).await?;
    let claims0 = claims(c, &urls).await?;
    let cpu0 = cpu_now(&routers, fleet, hz);
    let seen = replicas_load::drive(&c.load, &plan, Duration::from_secs(args.duration_s)).await;
    let cpu1 = cpu_now(&routers, fleet, hz);
    let (log1, commands1) = directory_counts(c, fleet, leader).await?;
    let claims1 = claims(c, &urls).await?;
    if let Some(e) = &seen.first_error {
        say(&format!("  {n} router(s), first failed step: {e}"));
    }
    // Let the routers' batched records land before the directory is read.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let owners = owners(c, leader).await?;
    drop(routers);
    for (id, steps) in ownership_check::splits(&seen.sessions).take(3) {
        let steps: Vec<String> = steps
            .iter()
            .map(|s| {
                format!(
                    "{}@{}",
                    s.worker,
                    s.epoch.map_or("-".to_owned(), |e| e.to_string())
                )
            })
            .collect();
        say(&format!(
            "  {n} router(s), split session {id}: steps worker@epoch {} ; directory {:?}",
            steps.join(" "),
            owners.get(id)
        ));
    }
    Ok(sample(
        n,
        idle_cores,
        &seen,
        &cpu0,
        &cpu1,
        (
            log1.saturating_sub(log0),
            commands1.saturating_sub(commands0),
        ),
        [
            claims1[0].saturating_sub(claims0[0]),
            claims1[1].saturating_sub(claims0[1]),
            claims1[2].saturating_sub(claims0[2]),
        ],
        ownership_check::check(&seen.sessions, &owners),
    ))
}

#[expect(
    clippy::too_many_arguments,
    reason = "one call site; the window's figures"
)]
fn sample(
    n: usize,
    router_idle_cores: f64,
    seen: &Seen,
    cpu0: &CpuNow,
    cpu1: &CpuNow,
    (log_entries, commands): (u64, u64),
    claims: [u64; 3],
    ownership: ownership_check::Verdict,
) -> Sample {
    let nodes: Vec<f64> = cpu1
        .nodes
        .iter()
        .zip(&cpu0.nodes)
        .map(|(a, b)| a - b)
        .collect();
    Sample {
        routers: n,
        requests: seen.requests(),
        errors: seen.errors,
        secs: seen.elapsed.as_secs_f64(),
        p50_ms: crate::percentile(&seen.latencies_ms, 50.0),
        p99_ms: crate::percentile(&seen.latencies_ms, 99.0),
        router_cpu_s: cpu1.routers - cpu0.routers,
        router_idle_cores,
        directory_cpu_s: nodes.iter().sum(),
        directory_busiest_cpu_s: nodes.iter().copied().fold(0.0, f64::max),
        load_cpu_s: cpu1.rest - cpu0.rest,
        log_entries,
        commands,
        claims,
        cross_sessions: seen.cross_sessions,
        ownership,
    }
}
