//! A follower that falls behind catches up: by appends when the leader still has the
//! entries it missed (more than 2 MB of them: axum's default body limit refused such an
//! append), and from the leader's snapshot when they were purged (a snapshot chunk is
//! 3 MiB, sent as up to 12 MB of JSON, and the last RPC waits for the whole install:
//! refused by the same limit, then timed out at openraft's 200 ms). Both left the follower
//! a candidate forever (`bench directory --scale`, issue 65).

#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{client, eventually, DirectoryNodes};

/// A node's `GET /directory/v1/cluster` (`None` while it does not answer).
async fn status(url: &str) -> Option<Value> {
    let resp = client()
        .get(format!("{url}/directory/v1/cluster"))
        .send()
        .await
        .ok()?;
    resp.json::<Value>().await.ok()
}

/// A leader's node number and URL, once one is elected.
pub(crate) async fn leader(nodes: &DirectoryNodes) -> (usize, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        for i in 1..=nodes.len() {
            let url = nodes.url(i);
            if nodes.running(i) && status(&url).await.unwrap_or_default()["state"] == "Leader" {
                return (i, url);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no leader elected");
}

async fn write(http: &reqwest::Client, url: &str, command: Value) -> Value {
    let resp = http
        .post(format!("{url}/directory/v1/commands"))
        .json(&json!({ "command": command }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json::<Value>().await.unwrap()
}

/// Claims sessions `from..to` for `lease` in batches of 128 (about 18 KB of log a batch).
/// A 10-minute lease for worker 0, granted through the leader at `url`.
async fn grant_lease(http: &reqwest::Client, url: &str) -> u64 {
    write(
        http,
        url,
        json!({"GrantLease": {"worker": 0, "ttl_ms": 600_000}}),
    )
    .await["outcome"]["LeaseGranted"]["lease"]
        .as_u64()
        .unwrap()
}

async fn claim_sessions(http: &reqwest::Client, url: &str, lease: u64, from: usize, to: usize) {
    for lo in (from..to).step_by(128) {
        let commands: Vec<Value> = (lo..(lo + 128).min(to))
            .map(|i| {
                json!({"SetDecodeOwner": {"session": format!("session-{i:08}"), "lease": lease,
                    "prefix": null, "tail_tokens": 100, "predicted_tool_gap_ms": 30000,
                    "expect_epoch": null}})
            })
            .collect();
        let done = write(http, url, json!({"Batch": {"commands": commands}})).await;
        assert!(done["outcome"]["Batch"].is_object(), "{done}");
    }
}

async fn applied(url: &str) -> u64 {
    status(url).await.unwrap_or_default()["last_applied"]
        .as_u64()
        .unwrap_or(0)
}

/// Starts node `f` again and waits until it has applied what the leader had.
async fn caught_up(nodes: &mut DirectoryNodes, f: usize, leader_url: &str) {
    let target = applied(leader_url).await;
    nodes.restart(f);
    let url = nodes.url(f);
    eventually(Duration::from_secs(60), "the follower caught up", || {
        let url = url.clone();
        async move { applied(&url).await >= target }
    })
    .await;
}

/// The log index of the snapshot in `dir` (its file's `meta` comes first).
fn snapshot_index(dir: &std::path::Path) -> u64 {
    let text = std::fs::read_to_string(dir.join("snapshot.json")).unwrap_or_default();
    let head = &text[..text.len().min(4096)];
    let at = head
        .find("\"index\":")
        .map_or(head.len(), |i| i + "\"index\":".len());
    head[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_follower_catches_up_by_appends_of_more_than_two_megabytes() {
    let mut nodes = DirectoryNodes::start(3, "lagging-appends", &[]);
    let http = client();
    let (l, url) = leader(&nodes).await;
    let lease = grant_lease(&http, &url).await;
    let f = l % 3 + 1;
    nodes.kill(f);
    // 250 batches: about 4.5 MB of entries, still in the leader's log.
    claim_sessions(&http, &url, lease, 0, 250 * 128).await;
    caught_up(&mut nodes, f, &url).await;
}

#[tokio::test]
async fn a_follower_behind_the_leaders_log_catches_up_from_its_snapshot() {
    let mut nodes = DirectoryNodes::start(3, "lagging-snapshot", &[]);
    let http = client();
    let (l, url) = leader(&nodes).await;
    let lease = grant_lease(&http, &url).await;
    // 20,000 sessions: a 5 MB state, two snapshot chunks.
    claim_sessions(&http, &url, lease, 0, 20_000).await;
    let f = l % 3 + 1;
    nodes.kill(f);
    let stopped_at = applied(&url).await;
    // Empty batches until the leader snapshots (every 5,000 entries) and purges (it keeps
    // 1,000 behind a snapshot) past where the follower stopped.
    let leader_dir = nodes.data_dir(l);
    let mut writers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (http, url) = (http.clone(), url.clone());
        writers.spawn(async move {
            for _ in 0..500 {
                write(&http, &url, json!({"Batch": {"commands": []}})).await;
            }
        });
    }
    while writers.join_next().await.is_some() {}
    eventually(Duration::from_secs(60), "a snapshot past the gap", || {
        let dir = leader_dir.clone();
        async move { snapshot_index(&dir) > stopped_at + 1_000 }
    })
    .await;
    caught_up(&mut nodes, f, &url).await;
    assert!(
        snapshot_index(&nodes.data_dir(f)) > stopped_at + 1_000,
        "the follower was sent the leader's snapshot"
    );
}
