//! A local directory cluster for `bench directory`: `n` `ownerserve directory` processes on
//! 127.0.0.1 (redb logs, fsynced), their leader, writes to it over HTTP/JSON, and a node
//! killed (`kill -9`) and started again on its data, as an operator's restart would.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use ownerserve_ownership::Command;

use super::proxy::{start_tied, Reaped};

/// The secret of the benchmark's own cluster (its nodes live as long as the run), sent in
/// `ownerserve_ownership::node::secret::HEADER`.
pub const CLUSTER_SECRET: &str = "ownerserve-bench-directory";

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One node: its arguments (to start it again) and its process while it runs.
struct NodeProcess {
    args: Vec<String>,
    process: Option<Reaped>,
}

/// The cluster's processes (killed and reaped on drop) and their data folder (removed).
pub struct Cluster {
    nodes: Vec<NodeProcess>,
    pub urls: Vec<String>,
    dir: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    /// Starts `n` nodes (node 1 initialises the cluster).
    pub fn start(n: usize) -> anyhow::Result<Self> {
        let ports = (0..n).map(|_| free_port()).collect::<Result<Vec<_>, _>>()?;
        let dir =
            std::env::temp_dir().join(format!("ownerserve-bench-dir-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect();
        let mut cluster = Cluster {
            nodes: Vec::new(),
            urls: Vec::new(),
            dir,
        };
        for (i, port) in ports.iter().enumerate() {
            let data = cluster.dir.join(format!("node{}", i + 1));
            let mut args: Vec<String> = [
                "directory",
                "--id",
                &(i + 1).to_string(),
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
                data.to_str().context("temp path")?,
                "--cluster-secret",
                CLUSTER_SECRET,
            ]
            .map(str::to_owned)
            .to_vec();
            for p in &peers {
                args.extend(["--peer".to_owned(), p.clone()]);
            }
            if i == 0 {
                args.push("--init".to_owned());
            }
            let (process, url) = start_node(&args)?;
            cluster.nodes.push(NodeProcess {
                args,
                process: Some(process),
            });
            cluster.urls.push(url);
        }
        Ok(cluster)
    }

    /// Kills node `i` (0-based) with SIGKILL and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(node) = self.nodes.get_mut(i) {
            node.process = None;
        }
    }

    /// Starts node `i` again on its data; returns once it listens.
    pub async fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        let node = self.nodes.get_mut(i).context("no such node")?;
        let args = node.args.clone();
        // Reading the child's output until it listens blocks: off the runtime's threads.
        let (process, _) = tokio::task::spawn_blocking(move || start_node(&args)).await??;
        node.process = Some(process);
        Ok(())
    }

    /// Node `i`'s resident memory in bytes (0 when it is not running or `/proc` cannot tell).
    pub fn rss_bytes(&self, i: usize) -> u64 {
        self.nodes
            .get(i)
            .and_then(|n| n.process.as_ref())
            .and_then(|p| crate::proc_stats::rss_kb(p.pid()))
            .map_or(0, |kb| kb * 1024)
    }

    /// The process ids of the nodes running now.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter_map(|n| n.process.as_ref().map(Reaped::pid))
            .collect()
    }

    /// Node `i`'s data folder.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{}", i + 1))
    }
}

/// Starts a node that stops with this process, however it ends (`--exit-with-stdin`).
fn start_node(args: &[String]) -> anyhow::Result<(Reaped, String)> {
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push("--exit-with-stdin");
    start_tied(&args, &[], "listening on")
}

/// This process's resident memory, in bytes (0 where `/proc` cannot tell).
pub fn own_rss_bytes() -> u64 {
    crate::proc_stats::own_rss_kb().map_or(0, |kb| kb * 1024)
}

/// An HTTP client presenting the cluster's secret.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    let mut secret = reqwest::header::HeaderMap::new();
    secret.insert(
        "x-ownerserve-cluster-secret",
        reqwest::header::HeaderValue::from_static(CLUSTER_SECRET),
    );
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .default_headers(secret)
        .build()?)
}

/// A node's `GET /directory/v1/cluster` (its Raft state, leader, last applied index).
pub async fn status(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    Ok(http
        .get(format!("{url}/directory/v1/cluster"))
        .timeout(Duration::from_secs(2))
        .send()
        .await?
        .json::<Value>()
        .await?)
}

/// The leader's URL, once one is elected (waits up to 20 s).
pub async fn leader(http: &reqwest::Client, urls: &[String]) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        for url in urls {
            if let Ok(v) = status(http, url).await {
                if v["state"] == "Leader" {
                    return Ok(url.clone());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("no leader elected")
}

/// Commits `command` through `leader`; its outcome and log index.
pub async fn write_at(
    http: &reqwest::Client,
    leader: &str,
    command: &Value,
) -> anyhow::Result<(Value, u64)> {
    let resp = http
        .post(format!("{leader}/directory/v1/commands"))
        .json(&json!({"command": command}))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("write failed: {}", resp.status());
    }
    let v = resp.json::<Value>().await?;
    Ok((v["outcome"].clone(), v["log_index"].as_u64().unwrap_or(0)))
}

/// Commits `command` through `leader`; its outcome.
pub async fn write(http: &reqwest::Client, leader: &str, command: &Value) -> anyhow::Result<Value> {
    Ok(write_at(http, leader, command).await?.0)
}

/// Grants worker 0 an hour's lease; its id.
pub async fn grant_lease(http: &reqwest::Client, leader: &str) -> anyhow::Result<u64> {
    let granted = write(
        http,
        leader,
        &json!({"GrantLease": {"worker": 0, "ttl_ms": 3_600_000u64}}),
    )
    .await?;
    granted["LeaseGranted"]["lease"]
        .as_u64()
        .context("no lease granted")
}

/// Commits commands to a cluster through the node that took the last one, moving on to
/// the next node when it cannot (a node down, an election that left it without a leader to
/// forward to) for up to 30 s; shared by every writer of a run.
pub struct Writer {
    http: reqwest::Client,
    urls: Vec<String>,
    at: AtomicUsize,
}

impl Writer {
    /// A writer to the nodes at `urls`, trying `first` first.
    pub fn new(http: &reqwest::Client, urls: &[String], first: &str) -> Arc<Self> {
        let at = urls.iter().position(|u| u == first).unwrap_or(0);
        Arc::new(Self {
            http: http.clone(),
            urls: urls.to_vec(),
            at: AtomicUsize::new(at),
        })
    }

    /// Commits `command`; its outcome and log index.
    pub async fn commit(&self, command: &Command) -> anyhow::Result<(Value, u64)> {
        let body = serde_json::to_value(command)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let at = self.at.load(Ordering::Relaxed);
            let url = &self.urls[at % self.urls.len().max(1)];
            match write_at(&self.http, url, &body).await {
                Ok(done) => return Ok(done),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {
                    // Another writer may have moved on already; move once past this node.
                    let _ =
                        self.at
                            .compare_exchange(at, at + 1, Ordering::Relaxed, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    }
}
