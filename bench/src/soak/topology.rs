//! The soak's processes: `up --ha`'s topology (a 3-node `ownerserve directory` cluster
//! sharing a fresh secret, two routers on a `remote` directory, the fleet of the embedded
//! `configs/up.toml`), each part its own `ownerserve` process so a fault can kill one and
//! start it again on the same port and data. `up --ha` itself runs both routers and the
//! workers in one process, where a router cannot die alone.
//!
//! The routers' config is `up.toml`'s `[router]` table with the directory switched to the
//! cluster, the planner keys `up` derives from `[sim]` (`router/src/ops/up.rs`), and one
//! `[[workers]]` entry per `[[fleet]]` worker, named as `up` names them; the workers run
//! `sim-worker` with its defaults, which are `up.toml`'s `[sim]`. Ports are fixed (below
//! the kernel's ephemeral range, so no outgoing connection takes one while its process is
//! down); KV event sockets too, so a restarted worker publishes where the routers listen.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::proxy::{start_tied, Reaped};

/// The embedded default of `ownerserve up`.
const UP_TOML: &str = include_str!("../../../configs/up.toml");

/// Directory nodes: three tolerate one failure.
pub const NODES: usize = 3;
/// Routers, as `up --ha` runs.
pub const ROUTERS: usize = 2;

/// One process of the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Directory node `i` (0-based; its Raft id is `i + 1`).
    Node(usize),
    Router(usize),
    /// Worker `i` in config order (its directory worker id).
    Worker(usize),
}

/// A simulated worker of the fleet.
struct Worker {
    name: String,
    role: String,
    port: u16,
    kv_events: u16,
    kv_replay: u16,
}

/// The running topology; every process is killed when it drops.
pub struct Topology {
    pub secret: String,
    pub admin_token: String,
    node_ports: Vec<u16>,
    workers: Vec<Worker>,
    router_ports: Vec<u16>,
    router_config: PathBuf,
    dir: PathBuf,
    procs: std::collections::BTreeMap<Part, Reaped>,
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Kill (and reap) every child before its data goes.
        self.procs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Topology {
    /// Plans ports and files, then starts the nodes (waiting for a leader), the workers and
    /// the routers.
    pub async fn start(
        secret: String,
        admin_token: String,
        router_set: &[(String, toml::Value)],
    ) -> anyhow::Result<Self> {
        let dir = std::env::temp_dir().join(format!("ownerserve-soak-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {dir:?}"))?;
        let mut ports = Ports::new()?;
        let node_ports = (0..NODES).map(|_| ports.take()).collect::<Result<_, _>>()?;
        let mut workers = Vec::new();
        for (role, count) in fleet(UP_TOML)? {
            for i in 0..count {
                workers.push(Worker {
                    name: format!("{role}-{i}"),
                    role: role.clone(),
                    port: ports.take()?,
                    kv_events: ports.take()?,
                    kv_replay: ports.take()?,
                });
            }
        }
        let router_ports = (0..ROUTERS)
            .map(|_| ports.take())
            .collect::<Result<_, _>>()?;
        let mut t = Self {
            secret,
            admin_token,
            node_ports,
            workers,
            router_ports,
            router_config: dir.join("router.toml"),
            dir,
            procs: Default::default(),
        };
        let (nodes, workers, routers) = (t.node_urls(), t.worker_entries(), t.router_urls());
        let config = router_file(UP_TOML, &nodes, &workers, &routers, router_set)?;
        std::fs::write(&t.router_config, config)?;
        for i in 0..NODES {
            t.launch(Part::Node(i), i == 0).await?;
        }
        for i in 0..t.workers.len() {
            t.launch(Part::Worker(i), false).await?;
        }
        for i in 0..ROUTERS {
            t.launch(Part::Router(i), false).await?;
        }
        Ok(t)
    }

    pub fn node_urls(&self) -> Vec<String> {
        self.node_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    pub fn router_urls(&self) -> Vec<String> {
        self.router_ports
            .iter()
            .map(|p| format!("http://127.0.0.1:{p}"))
            .collect()
    }

    pub fn worker_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.workers[i].port)
    }

    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// A part's name in tables: `node-1`, `router-a`, `decode-0`.
    pub fn name(&self, p: Part) -> String {
        match p {
            Part::Node(i) => format!("node-{}", i + 1),
            Part::Router(i) => format!("router-{}", char::from(b'a' + i as u8)),
            Part::Worker(i) => self.workers[i].name.clone(),
        }
    }

    /// Every part, in table order.
    pub fn parts(&self) -> Vec<Part> {
        let nodes = (0..NODES).map(Part::Node);
        let routers = (0..ROUTERS).map(Part::Router);
        nodes
            .chain(routers)
            .chain((0..self.workers.len()).map(Part::Worker))
            .collect()
    }

    /// The process id of a running part.
    pub fn pid(&self, p: Part) -> Option<u32> {
        self.procs.get(&p).map(Reaped::pid)
    }

    /// kill -9 (and reap) a part.
    pub fn kill(&mut self, p: Part) {
        self.procs.remove(&p);
    }

    /// SIGSTOP or SIGCONT (`-STOP`, `-CONT`) a part.
    pub fn signal(&self, p: Part, signal: &str) -> anyhow::Result<()> {
        match self.procs.get(&p) {
            Some(r) => r.signal(signal),
            None => bail!("{} is not running", self.name(p)),
        }
    }

    /// Starts a part that does not run, on its port and data; returns once it listens.
    pub async fn restart(&mut self, p: Part) -> anyhow::Result<()> {
        if self.procs.contains_key(&p) {
            bail!("{} is running", self.name(p));
        }
        self.launch(p, false).await
    }

    async fn launch(&mut self, p: Part, init: bool) -> anyhow::Result<()> {
        let (args, envs, marker) = self.command(p, init);
        let what = self.name(p);
        let (child, _) = tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
            start_tied(&args, &envs, marker)
        })
        .await?
        .with_context(|| format!("cannot start {what}"))?;
        self.procs.insert(p, child);
        Ok(())
    }

    /// The arguments, environment and start-up marker of a part.
    fn command(
        &self,
        p: Part,
        init: bool,
    ) -> (Vec<String>, Vec<(&'static str, String)>, &'static str) {
        let admin = ("OWNERSERVE_ADMIN_TOKEN", self.admin_token.clone());
        match p {
            Part::Node(i) => {
                let peers: Vec<String> = self
                    .node_ports
                    .iter()
                    .enumerate()
                    .map(|(j, port)| format!("{}=127.0.0.1:{port}", j + 1))
                    .collect();
                let mut args = vec![
                    "directory".to_owned(),
                    "--id".to_owned(),
                    (i + 1).to_string(),
                    "--listen".to_owned(),
                    format!("127.0.0.1:{}", self.node_ports[i]),
                    "--data-dir".to_owned(),
                    self.dir
                        .join(format!("node{}", i + 1))
                        .display()
                        .to_string(),
                    "--peers".to_owned(),
                    peers.join(","),
                    // As under `up --ha`: the node stops when this process's pipe closes.
                    "--exit-with-stdin".to_owned(),
                ];
                if init {
                    args.push("--init".to_owned());
                }
                let secret = ("OWNERSERVE_CLUSTER_SECRET", self.secret.clone());
                (args, vec![secret, admin], "listening on")
            }
            Part::Worker(i) => {
                let w = &self.workers[i];
                let args = [
                    "sim-worker".to_owned(),
                    "--port".to_owned(),
                    w.port.to_string(),
                    "--kv-events-endpoint".to_owned(),
                    format!("tcp://127.0.0.1:{}", w.kv_events),
                    "--kv-replay-endpoint".to_owned(),
                    format!("tcp://127.0.0.1:{}", w.kv_replay),
                ];
                (args.to_vec(), vec![], "listening on")
            }
            Part::Router(i) => {
                let args = [
                    "router".to_owned(),
                    "--config".to_owned(),
                    self.router_config.display().to_string(),
                    "--port".to_owned(),
                    self.router_ports[i].to_string(),
                ];
                let secret = ("OWNERSERVE_DIRECTORY_SECRET", self.secret.clone());
                (args.to_vec(), vec![secret, admin], "router listening on")
            }
        }
    }

    fn worker_entries(&self) -> Vec<WorkerEntry> {
        self.workers
            .iter()
            .map(|w| WorkerEntry {
                name: w.name.clone(),
                role: w.role.clone(),
                url: format!("http://127.0.0.1:{}", w.port),
                kv_events: format!("tcp://127.0.0.1:{}", w.kv_events),
                kv_replay: format!("tcp://127.0.0.1:{}", w.kv_replay),
            })
            .collect()
    }
}

/// One `[[workers]]` entry of the routers' config.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerEntry {
    pub name: String,
    pub role: String,
    pub url: String,
    pub kv_events: String,
    pub kv_replay: String,
}

/// The `[[fleet]]` groups of an `up.toml`: (role, count).
pub fn fleet(up_toml: &str) -> anyhow::Result<Vec<(String, u64)>> {
    let file: toml::Table = toml::from_str(up_toml).context("up.toml")?;
    let groups = file
        .get("fleet")
        .and_then(toml::Value::as_array)
        .context("up.toml has no [[fleet]]")?;
    groups
        .iter()
        .map(|g| {
            let role = g.get("role").and_then(toml::Value::as_str);
            let count = g
                .get("count")
                .and_then(toml::Value::as_integer)
                .unwrap_or(1);
            Ok((
                role.context("a [[fleet]] group without a role")?.to_owned(),
                u64::try_from(count)?,
            ))
        })
        .collect()
}

/// The routers' config: `up.toml`'s `[router]` on the remote directory at `nodes` (the
/// secret and admin token come from the environment), priced as `up` prices its fleet,
/// in front of `workers`, each router copying the others' KV index when it (re)starts
/// (`kv.peers` = `routers`, its own URL among them refusing while it starts), with the
/// `set` keys (`--router-set`) on top.
pub fn router_file(
    up_toml: &str,
    nodes: &[String],
    workers: &[WorkerEntry],
    routers: &[String],
    set: &[(String, toml::Value)],
) -> anyhow::Result<String> {
    let file: toml::Table = toml::from_str(up_toml).context("up.toml")?;
    let mut router = match file.get("router") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    };
    let urls = toml::Value::Array(nodes.iter().map(|u| u.clone().into()).collect());
    match router.get_mut("directory") {
        Some(toml::Value::Table(d)) => {
            d.insert("mode".into(), "remote".into());
            d.insert("urls".into(), urls);
        }
        _ => {
            router.insert("directory".into(), "remote".into());
            router.insert("directory_urls".into(), urls);
        }
    }
    // What `up` sets from `[sim]` (router/src/ops/up.rs); the rest of the planner's
    // settings are the router's defaults, which `up` keeps too.
    let sim = file.get("sim").and_then(toml::Value::as_table);
    let sim_f64 = |key: &str, default: f64| {
        sim.and_then(|s| s.get(key))
            .and_then(|v| v.as_float().or_else(|| v.as_integer().map(|i| i as f64)))
            .unwrap_or(default)
    };
    let sim_int = |key: &str, default: i64| {
        sim.and_then(|s| s.get(key))
            .and_then(toml::Value::as_integer)
            .unwrap_or(default)
    };
    router.insert("planner_link_gbs".into(), sim_f64("link_gbs", 50.0).into());
    router.insert(
        "planner_link_latency_us".into(),
        sim_f64("link_latency_us", 10.0).into(),
    );
    router.insert(
        "planner_max_num_batched_tokens".into(),
        sim_int("max_num_batched_tokens", 8192).into(),
    );
    router.insert(
        "planner_long_prefill_token_threshold".into(),
        sim_int("long_prefill_token_threshold", 0).into(),
    );
    router.insert(
        "planner_time_scale".into(),
        sim_f64("time_scale", 1.0).into(),
    );
    let peers = toml::Value::Array(routers.iter().map(|u| u.clone().into()).collect());
    match router.get_mut("kv") {
        Some(toml::Value::Table(kv)) => {
            kv.insert("peers".into(), peers);
        }
        _ => {
            router.insert(
                "kv".into(),
                toml::Value::Table([("peers".into(), peers)].into_iter().collect()),
            );
        }
    }
    for (key, value) in set {
        set_key(&mut router, key, value.clone());
    }
    let entries: Vec<toml::Value> = workers
        .iter()
        .map(|w| {
            let mut t = toml::Table::new();
            t.insert("name".into(), w.name.clone().into());
            t.insert("url".into(), w.url.clone().into());
            t.insert("role".into(), w.role.clone().into());
            t.insert("engine".into(), "sim".into());
            t.insert("kv_events".into(), w.kv_events.clone().into());
            t.insert("kv_replay".into(), w.kv_replay.clone().into());
            toml::Value::Table(t)
        })
        .collect();
    let mut out = toml::Table::new();
    out.insert("router".into(), toml::Value::Table(router));
    out.insert("workers".into(), toml::Value::Array(entries));
    Ok(toml::to_string(&out)?)
}

/// Sets `key` in the `[router]` table: a dotted key (`directory.session_retention_s`)
/// in its sub-table when the file has that sub-table, else as the flat key it stands for
/// (`directory_session_retention_s`), the two spellings the router's config accepts.
fn set_key(router: &mut toml::Table, key: &str, value: toml::Value) {
    if let Some((table, rest)) = key.split_once('.') {
        if let Some(toml::Value::Table(t)) = router.get_mut(table) {
            return set_key(t, rest, value);
        }
    }
    router.insert(key.replace('.', "_"), value);
}

/// Ports below the kernel's ephemeral range, free now, none handed out twice.
struct Ports {
    next: u32,
    end: u32,
}

impl Ports {
    fn new() -> anyhow::Result<Self> {
        let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let (low, end) = (10_000u32, ephemeral.max(10_000 + 2_048));
        // Each run starts at its own place, so two soaks at once rarely probe the same ports.
        let next = low + std::process::id().wrapping_mul(7_919) % (end - low);
        Ok(Self { next, end })
    }

    fn take(&mut self) -> anyhow::Result<u16> {
        let span = self.end - 10_000;
        for _ in 0..span {
            let port = u16::try_from(self.next)?;
            self.next = 10_000 + (self.next + 1 - 10_000) % span;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
        bail!("no free port below the ephemeral range")
    }
}

/// Waits until `check` holds (every 100 ms), for `within` at most; whether it did.
pub async fn wait_until<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GET `url` and parse its JSON (`Value::Null` on any failure).
pub async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    match http.get(url).send().await {
        Ok(r) if r.status().is_success() => r.json().await.unwrap_or_default(),
        _ => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_is_up_toml_s() {
        let fleet = fleet(UP_TOML).unwrap();
        assert_eq!(
            fleet,
            [("prefill", 1), ("decode", 2), ("hybrid", 1)].map(|(r, n)| (r.to_owned(), n))
        );
    }

    #[test]
    fn the_routers_config_is_up_s_router_on_the_remote_directory() {
        let workers = [WorkerEntry {
            name: "decode-0".into(),
            role: "decode".into(),
            url: "http://127.0.0.1:1".into(),
            kv_events: "tcp://127.0.0.1:2".into(),
            kv_replay: "tcp://127.0.0.1:3".into(),
        }];
        let set = [
            ("prompt_cache_mb".to_owned(), toml::Value::Integer(0)),
            (
                "directory.session_retention_s".to_owned(),
                toml::Value::Integer(120),
            ),
        ];
        let routers = ["http://127.0.0.1:7".into(), "http://127.0.0.1:8".into()];
        let nodes = ["http://127.0.0.1:9".into()];
        let text = router_file(UP_TOML, &nodes, &workers, &routers, &set).unwrap();
        let t: toml::Table = toml::from_str(&text).unwrap();
        let r = &t["router"];
        assert_eq!(r["directory"]["mode"].as_str(), Some("remote"));
        assert_eq!(
            r["directory"]["urls"][0].as_str(),
            Some("http://127.0.0.1:9")
        );
        assert_eq!(
            r["directory"]["worker_lease_ttl_ms"].as_integer(),
            Some(10_000)
        );
        assert_eq!(r["policy"].as_str(), Some("ownerserve"));
        assert_eq!(r["planner_max_num_batched_tokens"].as_integer(), Some(8192));
        assert_eq!(
            t["workers"][0]["kv_events"].as_str(),
            Some("tcp://127.0.0.1:2")
        );
        assert_eq!(r["kv"]["peers"][1].as_str(), Some("http://127.0.0.1:8"));
        assert_eq!(r["prompt_cache_mb"].as_integer(), Some(0));
        assert_eq!(
            r["directory"]["session_retention_s"].as_integer(),
            Some(120)
        );
    }
}
