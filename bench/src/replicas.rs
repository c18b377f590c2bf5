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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::dir_cluster::{self, Cluster, CLUSTER_SECRET};
use crate::ownership_check::{self, Owned};
use crate::proxy::{start, Reaped};
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
    /// Pin routers to the upper half of the CPUs and the rest to the lower half.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pin: bool,
}

/// The routers' admin token (for their replica's state and metrics).
const ADMIN_TOKEN: &str = "ownerserve-bench-replicas-admin-token";
/// The model the sim workers serve.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The longest anything here is waited for.
const PATIENCE: Duration = Duration::from_secs(60);

/// Which CPUs the routers and the rest run on (`None`: not pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cpus {
    load: Vec<usize>,
    routers: Vec<usize>,
}

impl Cpus {
    /// The lower half for the load, the upper half for the routers.
    fn split(n: usize) -> Option<Self> {
        (n >= 2).then(|| Self {
            load: (0..n / 2).collect(),
            routers: (n / 2..n).collect(),
        })
    }

    /// Router `i`'s CPU.
    fn router(&self, i: usize) -> usize {
        self.routers[i % self.routers.len()]
    }
}

fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Pins every thread of process `pid` (and those it starts later) to `cpus`.
fn pin(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
    let ok = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu_list(cpus), &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("cannot run taskset (apt-get install -y util-linux)")?
        .success();
    if !ok {
        bail!("taskset could not pin process {pid}");
    }
    Ok(())
}

/// User plus system CPU ticks from a `/proc/<pid>/stat` line (fields 14 and 15, counted
/// after the command name, which may hold spaces and parentheses).
fn stat_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// Clock ticks per second of `/proc` CPU times.
fn ticks_per_s() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// CPU seconds process `pid` used so far (0 when `/proc` cannot tell).
fn cpu_s(pid: u32, hz: f64) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| stat_ticks(&s))
        .map_or(0.0, |t| t as f64 / hz)
}

/// The sum of every sample of `name` (any labels) in a Prometheus text scrape.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The sum of `name`'s samples whose labels include `label`.
fn metric_with(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The fixed part of the run: the directory, the workers, this process's pid.
struct Fleet {
    cluster: Cluster,
    workers: Vec<Reaped>,
    worker_urls: Vec<String>,
    dir: PathBuf,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Clients of the run: to the directory (its secret) and to the routers (the admin token).
struct Clients {
    directory: reqwest::Client,
    admin: reqwest::Client,
    load: reqwest::Client,
}

impl Clients {
    fn new() -> anyhow::Result<Self> {
        let mut auth = reqwest::header::HeaderMap::new();
        auth.insert(
            reqwest::header::AUTHORIZATION,
            reqwest::header::HeaderValue::from_str(&format!("Bearer {ADMIN_TOKEN}"))?,
        );
        Ok(Self {
            directory: dir_cluster::http_client()?,
            admin: reqwest::Client::builder()
                .default_headers(auth)
                .timeout(Duration::from_secs(5))
                .build()?,
            load: reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .timeout(Duration::from_secs(30))
                .build()?,
        })
    }
}

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
            "  {n} router(s): {} requests in {:.1} s, {} failed; ownership: {:?}",
            sample.requests, sample.secs, sample.errors, sample.ownership
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

/// Starts the directory's nodes and the workers, pinned to the load CPUs.
fn start_fleet(workers: usize, cpus: Option<&Cpus>) -> anyhow::Result<Fleet> {
    let cluster = Cluster::start(3)?;
    let mut started = Vec::new();
    let mut urls = Vec::new();
    for _ in 0..workers {
        let (w, url) = start(&["sim-worker", "--port", "0", "--instant"], "listening on")?;
        started.push(w);
        urls.push(url);
    }
    if let Some(c) = cpus {
        for pid in cluster
            .pids()
            .into_iter()
            .chain(started.iter().map(Reaped::pid))
        {
            pin(pid, &c.load)?;
        }
    }
    let dir =
        std::env::temp_dir().join(format!("ownerserve-bench-replicas-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(Fleet {
        cluster,
        workers: started,
        worker_urls: urls,
        dir,
    })
}

/// The routers' configuration file.
fn router_config(
    dir: &Path,
    policy: &str,
    directory: &[String],
    workers: &[String],
) -> anyhow::Result<PathBuf> {
    let urls: Vec<String> = directory.iter().map(|u| format!("\"{u}\"")).collect();
    let mut toml = format!(
        "[router]\nhost = \"127.0.0.1\"\nport = 0\npolicy = \"{policy}\"\nadmin_token = \"{ADMIN_TOKEN}\"\n\
         busy_poll_us = 0\ndirectory = \"remote\"\ndirectory_urls = [{}]\ndirectory_secret = \"{CLUSTER_SECRET}\"\n\n",
        urls.join(", ")
    );
    for (i, url) in workers.iter().enumerate() {
        toml.push_str(&format!(
            "[[workers]]\nname = \"w{i}\"\nurl = \"{url}\"\nrole = \"hybrid\"\nengine = \"sim\"\n\n"
        ));
    }
    let path = dir.join("router.toml");
    std::fs::write(&path, toml)?;
    Ok(path)
}

/// CPU seconds of the routers, the directory's nodes (each) and the rest, now.
#[derive(Debug, Clone)]
struct CpuNow {
    routers: f64,
    nodes: Vec<f64>,
    rest: f64,
}

fn cpu_now(routers: &[Reaped], fleet: &Fleet, hz: f64) -> CpuNow {
    CpuNow {
        routers: routers.iter().map(|r| cpu_s(r.pid(), hz)).sum(),
        nodes: fleet
            .cluster
            .pids()
            .into_iter()
            .map(|p| cpu_s(p, hz))
            .collect(),
        rest: cpu_s(std::process::id(), hz)
            + fleet
                .workers
                .iter()
                .map(|w| cpu_s(w.pid(), hz))
                .sum::<f64>(),
    }
}

/// The directory's applied log index and the commands proposed through all its nodes.
async fn directory_counts(c: &Clients, fleet: &Fleet, leader: &str) -> anyhow::Result<(u64, u64)> {
    let applied = dir_cluster::status(&c.directory, leader).await?["last_applied"]
        .as_u64()
        .unwrap_or(0);
    let mut commands = 0.0;
    for url in &fleet.cluster.urls {
        let text = c
            .directory
            .get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        commands += metric_sum(&text, "ownerserve_directory_commands_total");
    }
    Ok((applied, commands as u64))
}

/// The routers' owner claims: won, lost, failed.
async fn claims(c: &Clients, urls: &[String]) -> anyhow::Result<[u64; 3]> {
    let mut out = [0u64; 3];
    for url in urls {
        let text = c
            .admin
            .get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        for (i, result) in ["won", "lost", "failed"].iter().enumerate() {
            out[i] += metric_with(
                &text,
                "ownerserve_ownership_claims_total",
                &format!("result=\"{result}\""),
            ) as u64;
        }
    }
    Ok(out)
}

/// Starts `n` routers on `config`, pinned, and waits until each follows the directory and
/// answers a chat request.
async fn start_routers(
    n: usize,
    config: &Path,
    cpus: Option<&Cpus>,
    c: &Clients,
) -> anyhow::Result<(Vec<Reaped>, Vec<String>)> {
    let config = config.display().to_string();
    let mut routers = Vec::new();
    let mut urls = Vec::new();
    for i in 0..n {
        let config = config.clone();
        let (r, url) = tokio::task::spawn_blocking(move || {
            start(&["router", "--config", &config], "listening on")
        })
        .await??;
        if let Some(cpus) = cpus {
            pin(r.pid(), &[cpus.router(i)])?;
        }
        routers.push(r);
        urls.push(url);
    }
    for url in &urls {
        wait_ready(c, url).await?;
    }
    Ok((routers, urls))
}

/// Waits until `router`'s replica is synced and connected and a chat request is served.
async fn wait_ready(c: &Clients, router: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    let body = serde_json::json!({"model": MODEL, "max_tokens": 1,
        "messages": [{"role": "user", "content": "ready?"}]});
    loop {
        let synced = match c
            .admin
            .get(format!("{router}/admin/v1/cluster"))
            .send()
            .await
        {
            Ok(r) => {
                let v: Value = r.json().await.unwrap_or_default();
                v["replica"]["synced"] == Value::Bool(true)
                    && v["replica"]["connected"] == Value::Bool(true)
            }
            Err(_) => false,
        };
        let served = synced
            && c.load
                .post(format!("{router}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
        if served {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("router {router} was not ready within {PATIENCE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every session's owner in the directory, by session id (worker names as configured).
async fn owners(
    c: &Clients,
    leader: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, Owned>> {
    let v: Value = c
        .directory
        .get(format!("{leader}/directory/v1/state"))
        .send()
        .await?
        .json()
        .await?;
    let state: ownerserve_ownership::Directory =
        serde_json::from_value(v["directory"].clone()).context("the directory's state")?;
    Ok(state
        .sessions
        .into_iter()
        .map(|(id, s)| {
            let owned = Owned {
                worker: s.owner.map(|o| format!("w{}", o.worker.0)),
                epoch: s.epoch.0,
            };
            (id.0, owned)
        })
        .collect())
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
    };
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
    Ok(sample(
        n,
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

fn sample(
    n: usize,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_the_command_name() {
        let stat = "4242 (own (er) serve) S 1 4242 4242 0 -1 4194560 5000 0 0 0 731 269 0 0 20 0 3 0 100 0 0";
        assert_eq!(stat_ticks(stat), Some(1000));
        assert_eq!(stat_ticks("garbage"), None);
    }

    #[test]
    fn two_cpus_give_the_routers_one_and_the_rest_the_other() {
        let c = Cpus::split(2).unwrap();
        assert_eq!((c.load.clone(), c.routers.clone()), (vec![0], vec![1]));
        assert_eq!((c.router(0), c.router(3)), (1, 1));
        let eight = Cpus::split(8).unwrap();
        assert_eq!(
            (eight.router(0), eight.router(3), eight.router(4)),
            (4, 7, 4)
        );
        assert_eq!(Cpus::split(1), None);
    }

    #[test]
    fn metrics_are_summed_over_their_labels() {
        let text =
            "# HELP x\nownerserve_directory_commands_total{command=\"claim\",result=\"ok\"} 5\n\
                    ownerserve_directory_commands_total{command=\"batch\",result=\"ok\"} 2\n\
                    ownerserve_directory_commands_total_other 100\n\
                    ownerserve_ownership_claims_total{result=\"won\"} 7\n\
                    ownerserve_ownership_claims_total{result=\"lost\"} 1\n";
        assert_eq!(metric_sum(text, "ownerserve_directory_commands_total"), 7.0);
        assert_eq!(
            metric_with(text, "ownerserve_ownership_claims_total", "result=\"lost\""),
            1.0
        );
    }
}
