//! The replicated ownership directory with real `ownerserve directory` processes on
//! 127.0.0.1: leader crash under a stream of claims, crash of every node and restart, and a
//! paused lease holder fenced after its TTL.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, Proc};
use serde_json::{json, Value};

struct Cluster {
    ports: Vec<u16>,
    dirs: Vec<PathBuf>,
    nodes: Vec<Option<Proc>>,
    http: reqwest::Client,
    client_id: u64,
    seq: u64,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    fn start(n: usize, tag: &str) -> Cluster {
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let base =
            std::env::temp_dir().join(format!("ownerserve-dir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dirs = (1..=n).map(|i| base.join(format!("node{i}"))).collect();
        let mut c = Cluster {
            ports,
            dirs,
            nodes: Vec::new(),
            http: client(),
            client_id: 7,
            seq: 0,
        };
        for i in 1..=n {
            let node = c.spawn(i);
            c.nodes.push(Some(node));
        }
        c
    }

    fn spawn(&self, i: usize) -> Proc {
        let listen = format!("127.0.0.1:{}", self.ports[i - 1]);
        let data = self.dirs[i - 1].to_str().unwrap().to_owned();
        let id = i.to_string();
        let mut args = vec![
            "directory",
            "--id",
            &id,
            "--listen",
            &listen,
            "--data-dir",
            &data,
        ];
        let peers: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(j, p)| format!("{}=127.0.0.1:{p}", j + 1))
            .collect();
        for p in &peers {
            args.push("--peer");
            args.push(p);
        }
        if i == 1 {
            args.push("--init");
        }
        Proc::spawn(&args, &[], "listening on")
    }

    fn url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.ports[i - 1])
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.nodes[i - 1].take() {
            p.kill();
        }
    }

    fn restart(&mut self, i: usize) {
        let node = self.spawn(i);
        self.nodes[i - 1] = Some(node);
    }

    /// The current leader's number, once the live nodes agree on one.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            for i in 1..=self.ports.len() {
                if self.nodes[i - 1].is_none() {
                    continue;
                }
                let Ok(r) = self
                    .http
                    .get(format!("{}/directory/v1/cluster", self.url(i)))
                    .send()
                    .await
                else {
                    continue;
                };
                let Ok(v) = r.json::<Value>().await else {
                    continue;
                };
                // A leader this node knows of, and that is still running.
                if let Some(l) = v["leader"].as_u64().map(|l| l as usize) {
                    if self
                        .nodes
                        .get(l.wrapping_sub(1))
                        .is_some_and(Option::is_some)
                    {
                        return l;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no leader elected");
    }

    /// Sends a command with a fresh idempotency key, retrying (same key) through leader
    /// changes and dropped connections; returns the committed outcome.
    async fn write(&mut self, command: Value) -> Value {
        self.seq += 1;
        let body = json!({"client": [self.client_id, self.seq], "command": command});
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let leader = self.leader().await;
            let sent = self
                .http
                .post(format!("{}/directory/v1/commands", self.url(leader)))
                .json(&body)
                .send()
                .await;
            if let Ok(resp) = sent {
                if resp.status() == 200 {
                    return resp.json::<Value>().await.unwrap()["outcome"].clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("write never committed: {body}");
    }

    /// The directory, read linearizably through the leader.
    async fn state(&self) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let leader = self.leader().await;
            if let Ok(r) = self
                .http
                .get(format!("{}/directory/v1/state", self.url(leader)))
                .send()
                .await
            {
                if r.status() == 200 {
                    return r.json::<Value>().await.unwrap()["directory"].clone();
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no linearizable read");
    }
}

fn claim(key: u64, lease: u64) -> Value {
    json!({"Claim": {"key": key, "lease": lease, "spec": {"parent": null, "blocks": [0, 16], "kv_type": "gqa-bf16", "size_bytes": 1024}, "expect_epoch": null}})
}

async fn grant(c: &mut Cluster, worker: u32, ttl_ms: u64) -> u64 {
    let out = c
        .write(json!({"GrantLease": {"worker": worker, "ttl_ms": ttl_ms}}))
        .await;
    out["LeaseGranted"]["lease"].as_u64().unwrap()
}

#[tokio::test]
async fn killing_the_leader_under_a_stream_of_claims_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, "failover");
    let lease = grant(&mut c, 0, 120_000).await;
    let mut acked = Vec::new();
    for key in 0..40u64 {
        if key == 15 {
            let leader = c.leader().await;
            c.kill(leader);
        }
        let out = c.write(claim(key, lease)).await;
        assert!(out["Owned"]["epoch"].is_u64(), "{out}");
        acked.push((key, out["Owned"]["epoch"].as_u64().unwrap()));
    }
    let state = c.state().await;
    for (key, epoch) in acked {
        let a = &state["artifacts"][key.to_string()];
        assert_eq!(a["owner"]["lease"], lease, "key {key}: {a}");
        assert_eq!(
            a["epoch"], epoch,
            "key {key}: the acknowledged epoch survived"
        );
    }
}

#[tokio::test]
async fn restarting_every_node_after_kill_9_keeps_every_acknowledged_write() {
    let mut c = Cluster::start(3, "restart");
    let lease = grant(&mut c, 0, 600_000).await;
    for key in 0..20u64 {
        c.write(claim(key, lease)).await;
    }
    let before = c.state().await;
    for i in 1..=3 {
        c.kill(i);
    }
    for i in 1..=3 {
        c.restart(i);
    }
    let after = c.state().await;
    assert_eq!(after["artifacts"], before["artifacts"]);
    assert!(after["leases"][lease.to_string()].is_object());
    assert!(after["applied"].as_u64() >= before["applied"].as_u64());
}

/// A lease holder: keeps `lease` alive through the leader every 200 ms until stopped.
fn holder(c: &Cluster, leader: usize, lease: u64) -> Child {
    let body = json!({"command": {"KeepAlive": {"lease": lease}}}).to_string();
    let script = format!(
        "while true; do curl -s -o /dev/null -XPOST -H 'content-type: application/json' \
         -d '{body}' {}/directory/v1/commands; sleep 0.2; done",
        c.url(leader)
    );
    Command::new("bash")
        .args(["-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap()
        .success());
}

#[tokio::test]
async fn a_paused_lease_holder_loses_its_key_and_its_old_epoch_is_refused() {
    let mut c = Cluster::start(3, "fencing");
    let leader = c.leader().await;
    let a = grant(&mut c, 0, 1_500).await;
    let first = c.write(claim(99, a)).await;
    let old_epoch = first["Owned"]["epoch"].as_u64().unwrap();
    let mut keeper = holder(&c, leader, a);
    // Alive well past its TTL thanks to the keep-alives.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let b = grant(&mut c, 1, 60_000).await;
    let held = c.write(claim(99, b)).await;
    assert_eq!(
        held["Held"]["owner"]["lease"], a,
        "a live holder keeps its key: {held}"
    );

    // Pause it past TTL + grace: the leader's ticks expire the lease.
    signal(&keeper, "-STOP");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let taken = c.write(claim(99, b)).await;
    let new_epoch = taken["Owned"]["epoch"].as_u64().expect("reassigned");
    assert!(new_epoch > old_epoch, "{new_epoch} > {old_epoch}");

    // It wakes up and writes with its old epoch: refused.
    signal(&keeper, "-CONT");
    let stale = c
        .write(json!({"Release": {"key": 99, "epoch": old_epoch}}))
        .await;
    assert_eq!(
        stale["Rejected"]["StaleEpoch"]["given"], old_epoch,
        "{stale}"
    );
    let renew = c.write(json!({"KeepAlive": {"lease": a}})).await;
    assert!(
        renew["Rejected"].is_object(),
        "the expired lease cannot be renewed: {renew}"
    );
    let _ = keeper.kill();
    let _ = keeper.wait();
    let state = c.state().await;
    assert_eq!(state["artifacts"]["99"]["owner"]["lease"], b);
}
