//! `bench replicas`' processes and what is read from them: the directory's nodes and the
//! sim workers started once, the routers of each count (their configuration, readiness),
//! CPU pinning (`taskset`) and CPU seconds (`/proc/<pid>/stat`), and the counters read from
//! the directory and the routers (log index, commands, owner claims, every session's owner).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use crate::dir_cluster::{self, Cluster, CLUSTER_SECRET};
use crate::ownership_check::Owned;
use crate::proxy::{start, Reaped};

/// The routers' admin token (for their replica's state and metrics).
pub(crate) const ADMIN_TOKEN: &str = "ownerserve-bench-replicas-admin-token";
/// The model the sim workers serve.
pub(crate) const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";
/// The longest anything here is waited for.
pub(crate) const PATIENCE: Duration = Duration::from_secs(60);

/// Which CPUs the routers and the rest run on (`None`: not pinned).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Cpus {
    pub(crate) load: Vec<usize>,
    pub(crate) routers: Vec<usize>,
}

impl Cpus {
    /// The lower half for the load, the upper half for the routers.
    pub(crate) fn split(n: usize) -> Option<Self> {
        (n >= 2).then(|| Self {
            load: (0..n / 2).collect(),
            routers: (n / 2..n).collect(),
        })
    }

    /// Router `i`'s CPU.
    pub(crate) fn router(&self, i: usize) -> usize {
        self.routers[i % self.routers.len()]
    }
}

/// `cpus` as `taskset -c` takes them.
pub(crate) fn cpu_list(cpus: &[usize]) -> String {
    cpus.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Pins every thread of process `pid` (and those it starts later) to `cpus`.
pub(crate) fn pin(pid: u32, cpus: &[usize]) -> anyhow::Result<()> {
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
pub(crate) fn ticks_per_s() -> f64 {
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
pub(crate) struct Fleet {
    pub(crate) cluster: Cluster,
    pub(crate) workers: Vec<Reaped>,
    pub(crate) worker_urls: Vec<String>,
    pub(crate) dir: PathBuf,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Clients of the run: to the directory (its secret) and to the routers (the admin token).
pub(crate) struct Clients {
    pub(crate) directory: reqwest::Client,
    pub(crate) admin: reqwest::Client,
    pub(crate) load: reqwest::Client,
}

impl Clients {
    pub(crate) fn new() -> anyhow::Result<Self> {
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

/// Starts the directory's nodes and the workers, pinned to the load CPUs.
pub(crate) fn start_fleet(workers: usize, cpus: Option<&Cpus>) -> anyhow::Result<Fleet> {
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
pub(crate) fn router_config(
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
pub(crate) struct CpuNow {
    pub(crate) routers: f64,
    pub(crate) nodes: Vec<f64>,
    pub(crate) rest: f64,
}

pub(crate) fn cpu_now(routers: &[Reaped], fleet: &Fleet, hz: f64) -> CpuNow {
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
pub(crate) async fn directory_counts(
    c: &Clients,
    fleet: &Fleet,
    leader: &str,
) -> anyhow::Result<(u64, u64)> {
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
pub(crate) async fn claims(c: &Clients, urls: &[String]) -> anyhow::Result<[u64; 3]> {
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
pub(crate) async fn start_routers(
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
pub(crate) async fn wait_ready(c: &Clients, router: &str) -> anyhow::Result<()> {
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
pub(crate) async fn owners(
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
