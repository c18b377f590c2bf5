//! `ownerserve bench soak --minutes N`: `up --ha`'s topology under mixed agent traffic for
//! N minutes with a fault every few minutes, watched for leaks, lost writes, broken
//! invariants and latency drift (issue 66, item 4).
//!
//! It starts the topology ([`topology`]: 3 directory nodes, 2 routers, `up.toml`'s fleet,
//! each its own process), waits until every router follows the directory and sees every
//! worker, then runs closed-loop agents ([`traffic`]), a ledger of directory writes
//! ([`directory`]), a sampler of every process ([`sample`]) and a state audit, and
//! injects the faults in rotation ([`faults`]). At the end it heals, audits once more and
//! prints the per-minute table and the verdict ([`report`]); it exits non-zero when a
//! criterion fails. Every process it started is killed when it returns, on an error or
//! on Ctrl-C / SIGTERM.

pub mod directory;
pub mod faults;
pub mod kv_agreement;
pub mod report;
pub mod sample;
pub mod topology;
pub mod traffic;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use ownerserve_eval::console::say;

use faults::{Checks, Fault};
use report::{Check, Limits, Run};
use sample::{Pids, ProcSample};
use topology::{wait_until, Part, Topology};
use traffic::{Records, Traffic};

/// Flags of `ownerserve bench soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// Minutes of traffic.
    #[arg(long, default_value_t = 60)]
    minutes: u64,
    /// Seconds between faults (default: a sixth of the run, 30–180 s, so every kind of
    /// fault comes at least once; the last one a minute plus its outage and recovery
    /// limit before the end).
    #[arg(long)]
    fault_every_s: Option<u64>,
    /// Seed of the agents' choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Concurrent agents (closed loop, each pacing itself with tool gaps).
    #[arg(long, default_value_t = 8)]
    agents: usize,
    /// Seconds a killed process stays down, and a stopped one stopped.
    #[arg(long, default_value_t = 5)]
    outage_s: u64,
    /// Seconds a fault may take to recover (from its restart or SIGCONT).
    #[arg(long, default_value_t = 30)]
    recover_within_s: u64,
    /// Seconds between samples of the processes.
    #[arg(long, default_value_t = 5)]
    sample_every_s: u64,
    /// Seconds between audits of the directory's state.
    #[arg(long, default_value_t = 15)]
    check_every_s: u64,
    /// The minute memory, descriptors and latency are compared with (default: 10, at
    /// the same share of a shorter run: minute 1 of 5).
    #[arg(long)]
    baseline_minute: Option<u64>,
    /// Which criteria fail the run: `all`, or `safety` (lost writes, invariants, recovery;
    /// memory, descriptors and drift are printed but need a longer run than the test
    /// tier's 5 minutes to mean anything).
    #[arg(long, value_enum, default_value_t = Gate::All)]
    gate: Gate,
    /// A `[router]` key for both routers on top of `up.toml`'s and [`SOAK_ROUTER`], as
    /// `KEY=TOML_VALUE` (repeatable): to see what a setting does to a figure; the
    /// acceptance run sets none.
    #[arg(long = "router-set", value_name = "KEY=VALUE")]
    router_set: Vec<String>,
}

/// What the soak sets on both routers before `--router-set`:
/// - sessions and prefix artifacts idle 120 s are removed from the directory (default
///   600 s), so the retention sweep ends and forgets many times in any run, the test
///   tier's 5 minutes included, and the audit sees it at work;
/// - an 8 MB prompt cache (default 256 MB): the cache is an LRU that keeps every prompt
///   start it saw until full, so at the default it is still filling an hour in, and the
///   memory criterion would measure its filling; at 8 MB it is full before minute 10,
///   and the criterion measures what grows past a full cache.
pub const SOAK_ROUTER: [(&str, i64); 3] = [
    ("directory.session_retention_s", 120),
    ("directory.artifact_retention_s", 120),
    ("prompt_cache_mb", 8),
];

/// Which criteria fail the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Gate {
    All,
    Safety,
}

/// `KEY=VALUE` with VALUE in TOML (`0`, `true`, `"text"`).
fn router_key(kv: &str) -> anyhow::Result<(String, toml::Value)> {
    let (key, value) = kv
        .split_once('=')
        .with_context(|| format!("--router-set {kv}: not KEY=VALUE"))?;
    let mut t: toml::Table = toml::from_str(&format!("v = {value}"))
        .with_context(|| format!("--router-set {kv}: the value is not TOML"))?;
    let value = t.remove("v").context("no value")?;
    Ok((key.trim().to_owned(), value))
}

impl SoakArgs {
    fn fault_every(&self) -> Duration {
        let s = self
            .fault_every_s
            .unwrap_or_else(|| (self.minutes * 60 / 6).clamp(30, 180));
        Duration::from_secs(s.max(1))
    }

    fn baseline(&self) -> anyhow::Result<usize> {
        let minutes = usize::try_from(self.minutes)?;
        let b = match self.baseline_minute {
            Some(m) => usize::try_from(m)?,
            None => report::baseline_minute(minutes),
        };
        Ok(b.clamp(1, minutes.max(1)))
    }
}

/// Runs the soak; every process is gone when this returns.
pub async fn run(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.minutes >= 1, "--minutes must be at least 1");
    anyhow::ensure!(args.agents >= 1, "--agents must be at least 1");
    tokio::select! {
        r = soak(args) => r,
        s = signalled() => bail!("stopped by {}: every process started was killed", s?),
    }
}

/// Ctrl-C or SIGTERM.
async fn signalled() -> anyhow::Result<&'static str> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.map(|()| "Ctrl-C").map_err(Into::into),
        _ = term.recv() => Ok("SIGTERM"),
    }
}

/// What the background tasks record, shared.
#[derive(Default)]
struct Shared {
    samples: Mutex<Vec<ProcSample>>,
    checks: Mutex<Vec<Check>>,
    ledger: Arc<Mutex<directory::Ledger>>,
    records: Arc<Mutex<Records>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[expect(
    clippy::too_many_lines,
    reason = "the soak's course, start to verdict, read top to bottom"
)]
async fn soak(args: SoakArgs) -> anyhow::Result<()> {
    let (secret, token) = (
        ownerserve_edge::auth::random_token()?,
        ownerserve_edge::auth::random_token()?,
    );
    let mut router_set: Vec<(String, toml::Value)> = SOAK_ROUTER
        .iter()
        .map(|&(k, v)| (k.to_owned(), toml::Value::Integer(v)))
        .collect();
    for kv in &args.router_set {
        router_set.push(router_key(kv)?);
    }
    // The last setting of a key wins, as in the routers' config.
    let retention_s = router_set
        .iter()
        .rev()
        .find(|(k, _)| k.replace('.', "_") == "directory_session_retention_s")
        .and_then(|(_, v)| v.as_integer())
        .map_or(0.0, |s| s as f64);
    let mut topo = Topology::start(secret.clone(), token.clone(), &router_set).await?;
    let mut bearer = reqwest::header::HeaderMap::new();
    bearer.insert(
        reqwest::header::AUTHORIZATION,
        reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?,
    );
    let admin = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .default_headers(bearer)
        .build()?;
    let routers = topo.router_urls();
    let model = crate::overload::model_of(&routers[0]).await?;
    let checks = Checks {
        admin: admin.clone(),
        cluster: directory::client(&secret)?,
        model: model.clone(),
    };
    let ready = Instant::now();
    if !wait_until(Duration::from_secs(60), || checks.all_ready(&topo)).await {
        bail!("the topology was not ready within 60 s (routers following the directory, every worker healthy and leased)");
    }
    let (every, outage, within) = (
        args.fault_every(),
        Duration::from_secs(args.outage_s),
        Duration::from_secs(args.recover_within_s),
    );
    let parts = topo.parts();
    let names: BTreeMap<Part, String> = parts.iter().map(|&p| (p, topo.name(p))).collect();
    say(&format!(
        "bench soak: {} minutes; `up --ha`'s topology as processes ({}){}, ready in {:.1} s; {} agents (seed {}); a fault every {} s (outage {} s, recovery limit {} s); samples every {} s, directory audits every {} s",
        args.minutes,
        names.values().cloned().collect::<Vec<_>>().join(", "),
        match args.router_set.is_empty() {
            true => String::new(),
            false => format!(", routers with {}", args.router_set.join(" ")),
        },
        ready.elapsed().as_secs_f64(),
        args.agents,
        args.seed,
        every.as_secs(),
        args.outage_s,
        args.recover_within_s,
        args.sample_every_s,
        args.check_every_s,
    ));
    let pids: Pids = Arc::default();
    let metrics_url = |t: &Topology, p: Part| match p {
        Part::Node(i) => Some(format!("{}/metrics", t.node_urls()[i])),
        Part::Router(i) => Some(format!("{}/metrics", t.router_urls()[i])),
        Part::Worker(_) => None,
    };
    let refresh = |t: &Topology| {
        let mut map = lock(&pids);
        map.clear();
        for &p in &parts {
            if let Some(pid) = t.pid(p) {
                map.insert(p, (pid, metrics_url(t, p)));
            }
        }
    };
    refresh(&topo);

    let since = Instant::now();
    let end = since + Duration::from_secs(args.minutes * 60);
    let shared = Arc::new(Shared::default());
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let traffic = Arc::new(Traffic {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?,
        routers: routers.clone(),
        model: model.clone(),
        records: shared.records.clone(),
        since,
    });
    for id in 0..args.agents {
        let (tr, stop) = (traffic.clone(), stop.clone());
        tasks.spawn(async move {
            traffic::agent(tr, id, args.seed, stop).await;
            Ok(())
        });
    }
    tasks.spawn(directory::run_ledger(
        checks.cluster.clone(),
        topo.node_urls(),
        Duration::from_secs(args.minutes * 60 + 1800),
        Duration::from_millis(500),
        shared.ledger.clone(),
        since,
        stop.clone(),
    ));
    tasks.spawn(sampler(
        admin.clone(),
        pids.clone(),
        shared.clone(),
        Duration::from_secs(args.sample_every_s.max(1)),
        since,
        stop.clone(),
    ));
    tasks.spawn(auditor(
        checks.cluster.clone(),
        topo.node_urls(),
        shared.clone(),
        Duration::from_secs(args.check_every_s.max(1)),
        since,
        retention_s,
        stop.clone(),
    ));

    let mut faults: Vec<Fault> = Vec::new();
    let mut restarts: BTreeMap<Part, Vec<f64>> = BTreeMap::new();
    let mut next = since + every;
    // The last fault is over a minute before the end, so the last minute (the one the
    // verdict compares) shows the processes settled, not in a fault's aftermath.
    while next + outage + within + Duration::from_secs(60) <= end {
        tokio::time::sleep_until(next.into()).await;
        if let Some(r) = tasks.try_join_next() {
            r??;
            bail!("a soak task ended early");
        }
        let leader = directory::leader_now(&checks.cluster, &topo.node_urls()).await;
        let (kind, part) = faults::plan(faults.len(), leader, topo.workers());
        let at_s = since.elapsed().as_secs_f64();
        let victim = names[&part].clone();
        let records = shared.records.clone();
        let recovered = faults::inject(&mut topo, &checks, kind, part, outage, within, |name| {
            lock(&records)
                .kills
                .entry(name.to_owned())
                .or_default()
                .push(at_s);
        })
        .await?;
        refresh(&topo);
        if kind != faults::Kind::Stop {
            restarts.entry(part).or_default().push(at_s);
        }
        say(&format!(
            "{}:{:02} fault {}: {} {victim}, back after {} s: {}",
            at_s as u64 / 60,
            at_s as u64 % 60,
            faults.len() + 1,
            kind.verb(),
            args.outage_s,
            match recovered {
                Some(s) => format!("recovered in {s:.1} s"),
                None => format!("NOT recovered within {} s", args.recover_within_s),
            }
        ));
        faults.push(Fault {
            at_s,
            kind,
            victim,
            recovered_s: recovered,
            healthy_at_s: since.elapsed().as_secs_f64(),
        });
        next = (next + every).max(Instant::now());
    }
    tokio::time::sleep_until(end.into()).await;
    stop.cancel();
    // The agents finish the request they are in (60 s at most each).
    let drained = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        Ok::<(), anyhow::Error>(())
    })
    .await;
    match drained {
        Ok(r) => r?,
        Err(_) => say("some agents were still in a request 90 s after the end; abandoned"),
    }
    // Healed: one last audit of everything acknowledged.
    if !wait_until(within, || checks.all_ready(&topo)).await {
        say("the topology was not healthy at the end; auditing anyway");
    }
    let at_s = since.elapsed().as_secs_f64();
    let leader = directory::leader_now(&checks.cluster, &topo.node_urls()).await;
    let audit = {
        let d = directory::state(&checks.cluster, &topo.node_urls()).await;
        let ledger = lock(&shared.ledger);
        let records = lock(&shared.records);
        d.map(|d| directory::audit(&d, at_s, &ledger, &records, retention_s))
    };
    lock(&shared.checks).push(Check {
        at_s,
        audit,
        leader,
    });
    let router_names: Vec<String> = (0..topology::ROUTERS)
        .map(|i| topo.name(Part::Router(i)))
        .collect();
    let kv_line = kv_agreement::line(&checks.admin, &topo.router_urls(), &router_names).await;
    drop(topo);

    let records = lock(&shared.records);
    let samples = lock(&shared.samples);
    let audits = lock(&shared.checks);
    let ledger_writes = lock(&shared.ledger).writes;
    let run = Run {
        minutes: usize::try_from(args.minutes)?,
        baseline: args.baseline()?,
        requests: &records.requests,
        samples: &samples,
        checks: &audits,
        faults: &faults,
        restarts: &restarts,
        names: &names,
        ledger_writes,
        sessions_with_epochs: records.epochs.len(),
    };
    say("");
    say(&format!(
        "bench soak: per minute (medians of the samples; TTFT of streams; faults as injected; model {model})"
    ));
    for line in run.table() {
        say(&line);
    }
    say(&kv_line);
    let limits = Limits {
        growth: 0.10,
        drift: 0.20,
        recover_s: args.recover_within_s as f64,
    };
    let (lines, pass) = run.verdict(limits, args.gate == Gate::Safety);
    say("");
    say(&format!(
        "verdict ({} requests, {} faults):",
        records.requests.len(),
        faults.len()
    ));
    for line in lines {
        say(&line);
    }
    if !pass {
        bail!("the soak failed a criterion (see the verdict above)");
    }
    Ok(())
}

/// Samples every process every `every` until `stop`, and says how each minute went.
async fn sampler(
    http: reqwest::Client,
    pids: Pids,
    shared: Arc<Shared>,
    every: Duration,
    since: Instant,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(every);
    let mut minute = 0;
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let at_s = since.elapsed().as_secs_f64();
        let got = sample::sample(&http, &pids, at_s).await;
        lock(&shared.samples).extend(got);
        let now = (at_s / 60.0) as u64;
        if now > minute {
            minute = now;
            let records = lock(&shared.records);
            let last: Vec<&traffic::Request> = records
                .requests
                .iter()
                .filter(|r| (r.at_s / 60.0) as u64 + 1 == now)
                .collect();
            let mut ttft: Vec<f64> = last.iter().filter_map(|r| r.ttft_ms).collect();
            ttft.sort_by(f64::total_cmp);
            let broken = last
                .iter()
                .filter(|r| {
                    matches!(
                        r.outcome,
                        traffic::Outcome::Status(_) | traffic::Outcome::Broken
                    )
                })
                .count();
            say(&format!(
                "minute {now}: {} requests, {broken} failed, TTFT p99 {:.0} ms",
                last.len(),
                crate::percentile(&ttft, 99.0)
            ));
        }
    }
}

/// Audits the directory's state every `every` until `stop`.
async fn auditor(
    http: reqwest::Client,
    urls: Vec<String>,
    shared: Arc<Shared>,
    every: Duration,
    since: Instant,
    retention_s: f64,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            _ = tick.tick() => {}
        }
        let at_s = since.elapsed().as_secs_f64();
        let leader = directory::leader_now(&http, &urls).await;
        let d = directory::state(&http, &urls).await;
        let audit = d.map(|d| {
            let ledger = lock(&shared.ledger);
            let records = lock(&shared.records);
            directory::audit(&d, at_s, &ledger, &records, retention_s)
        });
        lock(&shared.checks).push(Check {
            at_s,
            audit,
            leader,
        });
    }
}
