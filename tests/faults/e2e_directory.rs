//! The replicated ownership directory with real `ownerserve directory` processes on
//! 127.0.0.1: leader crash under a stream of claims, crash of every node and restart, and a
//! paused lease holder fenced after its TTL.

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, free_port, DirectoryNodes, Proc};
use serde_json::{json, Value};

struct Cluster {
    nodes: DirectoryNodes,
    http: reqwest::Client,
    client_id: u64,
    seq: u64,
}

impl Cluster {
    fn start(n: usize, tag: &str) -> Cluster {
        Cluster {
            nodes: DirectoryNodes::start(n, tag, &[]),
            http: client(),
            client_id: 7,
            seq: 0,
        }
    }

    fn url(&self, i: usize) -> String {
        self.nodes.url(i)
    }

    fn kill(&mut self, i: usize) {
        self.nodes.kill(i);
    }

    fn restart(&mut self, i: usize) {
        self.nodes.restart(i);
    }

    /// The current leader's number, once the live nodes agree on one.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            for i in 1..=self.nodes.len() {
                if !self.nodes.running(i) {
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
                    if self.nodes.running(l) {
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
         -H '{}: {}' -d '{body}' {}/directory/v1/commands; sleep 0.2; done",
        ownerserve_ownership::node::secret::HEADER,
        common::CLUSTER_SECRET,
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

#[tokio::test]
async fn the_operator_api_checks_scopes_and_manages_leases_sessions_and_members() {
    let mut c = Cluster::start(3, "admin");
    let a = grant(&mut c, 0, 600_000).await;
    let b = grant(&mut c, 1, 600_000).await;
    c.write(claim(5, a)).await;
    let root = c
        .write(
            json!({"SetDecodeOwner": {"session": "root", "lease": a, "prefix": 5, "tail_tokens": 10,
                       "predicted_tool_gap_ms": null, "expect_epoch": null}}),
        )
        .await;
    let epoch = root["Owned"]["epoch"].as_u64().unwrap();
    c.write(
        json!({"Fork": {"parent": "root", "child": "branch", "lease": b, "parent_epoch": epoch}}),
    )
    .await;

    let leader = c.url(c.leader().await);
    let http = client();
    let get = |path: &str, token: Option<&str>| {
        let mut r = http.get(format!("{leader}{path}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r
    };
    // Reads: no token → 401; read token → fine.
    assert_eq!(
        get("/admin/v1/leases", None).send().await.unwrap().status(),
        401
    );
    let leases: Value = get("/admin/v1/leases", Some(common::READ_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let row = leases["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["id"] == a)
        .unwrap()
        .clone();
    assert!(row["remaining_ms"].as_u64().unwrap() > 500_000);
    assert!(
        row["keys"].as_array().unwrap().len() >= 2,
        "prefix and session attached: {row}"
    );
    let sessions: Value = get("/admin/v1/sessions", Some(common::READ_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let root_row = sessions["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "root")
        .unwrap()
        .clone();
    assert_eq!(root_row["forks"], json!(["branch"]));
    let spec: Value = get("/admin/v1/openapi.json", Some(common::READ_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(spec["paths"]["/admin/v1/leases/{id}"]["delete"].is_object());

    // Writes: no token → 401, read token → 403, admin token → done.
    let revoke = |token: Option<&str>| {
        let mut r = http.delete(format!("{leader}/admin/v1/leases/{a}"));
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r
    };
    assert_eq!(revoke(None).send().await.unwrap().status(), 401);
    assert_eq!(
        revoke(Some(common::READ_TOKEN))
            .send()
            .await
            .unwrap()
            .status(),
        403
    );
    // Pinned, the session refuses to move; unpinned, it moves.
    let pin = |pinned: bool| {
        http.post(format!("{leader}/admin/v1/sessions/root/pin"))
            .bearer_auth(common::ADMIN_TOKEN)
            .json(&json!({"pinned": pinned}))
            .send()
    };
    assert_eq!(pin(true).await.unwrap().status(), 200);
    let refused: Value = http
        .post(format!("{leader}/admin/v1/sessions/root/transfer"))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&json!({"lease": b}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        refused["outcome"]["Rejected"]["Pinned"].is_string(),
        "{refused}"
    );
    assert_eq!(pin(false).await.unwrap().status(), 200);
    let transfer = http
        .post(format!("{leader}/admin/v1/sessions/root/transfer"))
        .bearer_auth(common::ADMIN_TOKEN)
        .json(&json!({"lease": b}))
        .send()
        .await
        .unwrap();
    assert_eq!(transfer.status(), 200);
    let moved: Value = transfer.json().await.unwrap();
    assert!(
        moved["outcome"]["Owned"]["epoch"].as_u64().unwrap() > epoch,
        "{moved}"
    );
    let revoked: Value = revoke(Some(common::ADMIN_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(revoked["outcome"]["LeaseEnded"].is_object(), "{revoked}");
    let owners: Value = get("/admin/v1/owners", Some(common::ADMIN_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let p5 = owners["owners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["key"] == 5)
        .unwrap()
        .clone();
    assert!(
        p5["owner"]["lease"] == b || p5["needs_recompute"] == true,
        "{p5}"
    );

    // Membership: a fourth node joins as a learner, then as a voter.
    let port = free_port();
    let data = c.nodes.data_root().join("node4");
    let listen = format!("127.0.0.1:{port}");
    let _node4 = Proc::spawn(
        &[
            "directory",
            "--id",
            "4",
            "--listen",
            &listen,
            "--data-dir",
            data.to_str().unwrap(),
            "--cluster-secret",
            common::CLUSTER_SECRET,
        ],
        &[],
        "listening on",
    );
    let post = |path: &str, body: Value| {
        http.post(format!("{leader}{path}"))
            .bearer_auth(common::ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    assert_eq!(
        post(
            "/admin/v1/cluster/learners",
            json!({"id": 4, "addr": listen})
        )
        .await
        .unwrap()
        .status(),
        200
    );
    assert_eq!(
        post(
            "/admin/v1/cluster/membership",
            json!({"voters": [1, 2, 3, 4]})
        )
        .await
        .unwrap()
        .status(),
        200
    );
    let status: Value = get("/admin/v1/cluster", Some(common::READ_TOKEN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["voters"], json!([1, 2, 3, 4]));
}

#[tokio::test]
async fn a_router_records_ownership_in_a_remote_cluster() {
    let c = Cluster::start(3, "remote");
    c.leader().await;
    let worker = Proc::sim_worker(&["--instant"]);
    let urls: Vec<String> = (1..=3).map(|i| format!("\"{}\"", c.url(i))).collect();
    let cfg = common::temp_config(
        "remote.toml",
        &format!(
            "[router]\ndirectory = \"remote\"\ndirectory_urls = [{}]\ndirectory_secret = \"{}\"\n\n\
             [[workers]]\nname = \"w\"\nurl = \"{}\"\nrole = \"decode\"\n",
            urls.join(", "),
            common::CLUSTER_SECRET,
            worker.url
        ),
    );
    let router = Proc::router(&[], &["--config", &cfg]);
    let resp = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .header("x-session-id", "remote-session")
        .json(&common::chat_body(
            "hello remote directory, this is a long enough prompt to fill a block or two",
            2,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let state = c.state().await;
        let s = &state["sessions"]["remote-session"];
        if s["owner"]["worker"] == 0 {
            assert_eq!(
                state["leases"].as_object().unwrap().len(),
                1,
                "the worker's lease"
            );
            break;
        }
        assert!(Instant::now() < deadline, "session never recorded: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A write sent to a follower is forwarded to the leader and answered.
async fn a_follower_grants_a_lease(c: &Cluster) {
    let leader = c.leader().await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let resp = client()
        .post(format!("{}/directory/v1/commands", c.url(follower)))
        .json(&json!({"command": {"GrantLease": {"worker": 3, "ttl_ms": 60_000}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert!(v["outcome"]["LeaseGranted"]["lease"].is_u64(), "{v}");
}

#[tokio::test]
async fn a_follower_forwards_writes_to_the_leader() {
    let c = Cluster::start(3, "forward");
    a_follower_grants_a_lease(&c).await;
}

/// Peers named by DNS (`--peer 2=localhost:PORT`, as a StatefulSet's pods name theirs:
/// `ownerserve-directory-1.ownerserve-directory:7000`): the nodes reach each other by name,
/// elect a leader and a follower forwards a write to it.
#[tokio::test]
async fn peers_named_by_dns_form_a_cluster() {
    let c = Cluster {
        nodes: DirectoryNodes::start_naming_peers(3, "dns-peers", &[], "localhost"),
        http: client(),
        client_id: 7,
        seq: 0,
    };
    a_follower_grants_a_lease(&c).await;
}

/// The Raft term node `i` reports (through the cluster secret).
async fn term(c: &Cluster, i: usize) -> u64 {
    let v: Value = c
        .http
        .get(format!("{}/directory/v1/cluster", c.url(i)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["term"].as_u64().unwrap()
}

#[tokio::test]
async fn forged_votes_appends_and_commands_without_the_cluster_secret_are_refused() {
    let mut c = Cluster::start(3, "forged");
    let leader = c.leader().await;
    let lease = grant(&mut c, 1, 60_000).await;
    let before_state = c.state().await;
    let terms: Vec<u64> = all_terms(&c).await;
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    // The attacks of the report: a vote with a huge term (it stopped all writes for 15 s),
    // an append of a forged entry (a follower applied it), a command and a state read.
    let forged_vote = json!({"vote": {"leader_id": {"term": 1_000_000u64, "node_id": 9}, "committed": false}, "last_log_id": null});
    let forged_append = json!({
        "vote": {"leader_id": {"term": terms[0] + 1, "node_id": 9}, "committed": true},
        "prev_log_id": null,
        "leader_commit": {"leader_id": {"term": terms[0] + 1, "node_id": 9}, "index": 1_000u64},
        "entries": [{"log_id": {"leader_id": {"term": terms[0] + 1, "node_id": 9}, "index": 1u64},
                     "payload": {"Normal": {"at_ms": 0, "client": null,
                                            "command": {"PinSession": {"session": "forged"}}}}}]
    });
    let anonymous = reqwest::Client::new();
    let wrong = reqwest::Client::builder()
        .default_headers({
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(
                ownerserve_ownership::node::secret::HEADER,
                reqwest::header::HeaderValue::from_static("not-the-cluster-secret"),
            );
            h
        })
        .build()
        .unwrap();
    for http in [&anonymous, &wrong] {
        for i in [leader, follower] {
            let url = c.url(i);
            let answers = [
                http.post(format!("{url}/raft/vote"))
                    .json(&forged_vote)
                    .send()
                    .await,
                http.post(format!("{url}/raft/append"))
                    .json(&forged_append)
                    .send()
                    .await,
                http.post(format!("{url}/raft/snapshot"))
                    .json(&json!({}))
                    .send()
                    .await,
                http.post(format!("{url}/directory/v1/commands"))
                    .json(&json!({"command": {"RevokeLease": {"lease": lease}}}))
                    .send()
                    .await,
                http.get(format!("{url}/directory/v1/state")).send().await,
                http.get(format!("{url}/directory/v1/cluster")).send().await,
            ];
            for a in answers {
                let a = a.unwrap();
                let path = a.url().path().to_owned();
                assert_eq!(a.status(), 401, "{path} on node {i}");
                let body: Value = a.json().await.unwrap();
                assert!(body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("cluster secret"));
            }
        }
    }
    // Nothing was applied: same leader, same terms, the lease still there, and writes go on.
    assert_eq!(c.leader().await, leader);
    assert_eq!(all_terms(&c).await, terms);
    let after = c.state().await;
    assert!(after["leases"][lease.to_string()].is_object(), "{after}");
    assert_eq!(after["leases"], before_state["leases"]);
    assert!(!after.to_string().contains("forged"), "{after}");
    let started = Instant::now();
    grant(&mut c, 2, 60_000).await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

async fn all_terms(c: &Cluster) -> Vec<u64> {
    let mut out = Vec::new();
    for i in 1..=3 {
        out.push(term(c, i).await);
    }
    out
}

#[tokio::test]
async fn a_follower_forwards_admin_reads_to_the_leader() {
    let mut c = Cluster::start(3, "follower-reads");
    let leader = c.leader().await;
    let lease = grant(&mut c, 1, 60_000).await;
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let http = reqwest::Client::new();
    let get = |i: usize, path: &str| {
        http.get(format!("{}{path}", c.url(i)))
            .bearer_auth(common::READ_TOKEN)
            .send()
    };
    // Before: a 421 naming the leader, for the client to retry there.
    let from_follower = get(follower, "/admin/v1/leases").await.unwrap();
    assert_eq!(from_follower.status(), 200);
    let body: Value = from_follower.json().await.unwrap();
    assert!(
        body["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["id"] == lease),
        "{body}"
    );
    let one = get(follower, &format!("/admin/v1/leases/{lease}"))
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    // The caller's token goes along: no token, still a 401 (at the follower).
    let anonymous = http
        .get(format!("{}/admin/v1/leases", c.url(follower)))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn up_ha_runs_the_directory_as_a_secret_guarded_three_node_cluster() {
    let up = Proc::up(&["--ha", "--instant", "true"]);
    // The directory lines come after the router's.
    let mut printed = Vec::new();
    while !printed
        .iter()
        .any(|l: &String| l.contains("x-ownerserve-cluster-secret"))
    {
        printed.push(up.stdout.recv_timeout(Duration::from_secs(10)).unwrap());
    }
    let curl = printed
        .iter()
        .find(|l| l.contains("x-ownerserve-cluster-secret"))
        .unwrap();
    let secret = curl
        .split("x-ownerserve-cluster-secret: ")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap()
        .to_owned();
    let node = curl.split_whitespace().last().unwrap().to_owned();
    assert!(node.ends_with("/directory/v1/cluster"), "{curl}");
    // Without the secret a node refuses; with it, it shows a 3-member cluster with a leader.
    let anonymous = reqwest::Client::new().get(&node).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let http = reqwest::Client::new();
    let cluster: Value = http
        .get(&node)
        .header(ownerserve_ownership::node::secret::HEADER, &secret)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(cluster["members"], json!([1, 2, 3]), "{cluster}");
    assert!(cluster["leader"].is_u64(), "{cluster}");
    // A session step through the router is recorded in the cluster.
    let resp = http
        .post(format!("{}/v1/chat/completions", up.url))
        .header("x-session-id", "ha-session")
        .json(&common::chat_body("hello", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let state_url = node.replace("/cluster", "/state");
    common::eventually(
        Duration::from_secs(10),
        "the session in the cluster",
        || {
            let (http, url, secret) = (http.clone(), state_url.clone(), secret.clone());
            async move {
                let r = http
                    .get(url)
                    .header(ownerserve_ownership::node::secret::HEADER, secret)
                    .send()
                    .await;
                match r {
                    Ok(r) => r.json::<Value>().await.is_ok_and(|v| {
                        v["directory"]["sessions"]["ha-session"]["owner"].is_object()
                    }),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
    // The second router serves too, and shows the same session from its own replica.
    let second = printed
        .iter()
        .find_map(|l| l.strip_prefix("second router listening on "))
        .and_then(|r| r.split_whitespace().next())
        .expect("the second router's line")
        .to_owned();
    assert_ne!(second, up.url);
    let resp = http
        .post(format!("{second}/v1/chat/completions"))
        .header("x-session-id", "ha-session")
        .json(&common::chat_body("hello again", 4))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // A linearizable read waits at most 5 s for the replica to reach the leader's index;
    // on a starved machine (the whole suite on 2 cores) that can pass, and the read is
    // asked again: what is checked is what it answers, not how fast.
    let mut seen = Value::Null;
    for _ in 0..4 {
        seen = http
            .get(format!(
                "{second}/admin/v1/sessions/ha-session?linearizable=true"
            ))
            .bearer_auth(common::ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if seen.get("error").is_none() {
            break;
        }
    }
    assert!(seen["owner"].is_object(), "{seen}");
    assert!(seen["read_at_index"].as_u64().unwrap() > 0, "{seen}");
    // `ctl cluster`, as printed: the nodes, and both routers' replicas.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ownerserve"))
        .args(["ctl", "--url", &up.url, "cluster", "--router", &second])
        .env("OWNERSERVE_ADMIN_TOKEN", common::ADMIN_TOKEN)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains("Leader") && table.contains(&second) && table.contains(&up.url),
        "{table}"
    );
}
