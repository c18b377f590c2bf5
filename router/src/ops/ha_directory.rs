//! `ownerserve up --ha`: the ownership directory as a real 3-node Raft cluster of
//! `ownerserve directory` child processes on loopback, instead of one node embedded in
//! `up`. The nodes share a fresh random cluster secret (handed over in the environment, so
//! it shows in no process list), every Raft and directory request must present it, and
//! the routers reach them as a `remote` directory. The children die with `up`, however it
//! ends: each watches the pipe on its stdin.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::task::TaskTracker;

/// The running cluster: its nodes (killed on drop), URLs, secret and data folder.
pub struct HaDirectory {
    _nodes: Vec<Child>,
    pub urls: Vec<String>,
    pub secret: String,
    pub data_dir: PathBuf,
}

/// Nodes of the cluster: three tolerate one failure.
const NODES: usize = 3;

impl HaDirectory {
    /// Starts the nodes (node 1 initialises the cluster) with `admin_token` for their
    /// operator API, and waits until each listens.
    pub async fn start(admin_token: &str, tracker: &TaskTracker) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find the ownerserve binary")?;
        let secret = ownerserve_edge::auth::random_token()?;
        let data_dir = crate::ops::scratch_dir::scratch_dir("up-ha");
        let ports = free_ports(NODES)?;
        let peers: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}=127.0.0.1:{p}", i + 1))
            .collect();
        let mut nodes = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let mut cmd = Command::new(&exe);
            cmd.arg("directory")
                .args(["--id", &(i + 1).to_string()])
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .arg("--data-dir")
                .arg(data_dir.join(format!("node{}", i + 1)))
                .args(["--peers", &peers.join(",")])
                // Its stdin is a pipe from this process: when `up` dies, even by SIGKILL,
                // the node sees it close and stops (no orphaned cluster).
                .arg("--exit-with-stdin")
                .stdin(Stdio::piped())
                .env("OWNERSERVE_CLUSTER_SECRET", &secret)
                .env("OWNERSERVE_ADMIN_TOKEN", admin_token)
                // Peers down during start-up are not news; errors still show.
                .env("OWNERSERVE_LOG", "error,openraft=off")
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true);
            if i == 0 {
                cmd.arg("--init");
            }
            let mut child = cmd.spawn().context("cannot start a directory node")?;
            wait_listening(&mut child, i + 1, tracker).await?;
            nodes.push(child);
        }
        let ha = Self {
            _nodes: nodes,
            urls: ports
                .iter()
                .map(|p| format!("http://127.0.0.1:{p}"))
                .collect(),
            secret,
            data_dir,
        };
        ha.wait_for_leader().await?;
        Ok(ha)
    }

    /// Waits (10 s at most) until node 1 names a leader, so the router's first writes
    /// find one.
    async fn wait_for_leader(&self) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let url = format!("{}/directory/v1/cluster", self.urls[0]);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            let asked = http
                .get(&url)
                .header(ownerserve_ownership::node::secret::HEADER, &self.secret)
                .send()
                .await;
            if let Ok(r) = asked {
                let v: serde_json::Value = r.json().await.unwrap_or_default();
                if v["leader"].is_u64() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the directory cluster elected no leader within 10 s")
    }
}

impl Drop for HaDirectory {
    fn drop(&mut self) {
        // The children are killed by their own drop; their data goes with this run.
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// Waits (10 s at most) for node `id` to print that it listens, then keeps draining its
/// output so it never blocks on a full pipe.
async fn wait_listening(child: &mut Child, id: usize, tracker: &TaskTracker) -> anyhow::Result<()> {
    let out = child.stdout.take().context("no stdout")?;
    let mut lines = BufReader::new(out).lines();
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("listening on") {
                return Ok::<bool, std::io::Error>(true);
            }
        }
        Ok(false)
    })
    .await;
    match found {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => bail!("directory node {id} exited before listening"),
        Ok(Err(e)) => return Err(e.into()),
        Err(_) => bail!("directory node {id} did not listen within 10 s"),
    }
    // It ends when the child's stdout closes.
    tracker.spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok(())
}

/// `n` ports free on loopback now (bound then released; the nodes bind them right after).
fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}
