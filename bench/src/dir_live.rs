//! `bench directory --scale`'s cluster side, at one session count: filling the cluster to
//! it (batched claims: the write rate there), claims one at a time (the baseline), a new
//! router's replica catching up (snapshot, then the tail written meanwhile), and a node
//! killed with SIGKILL and started again, timed until it has caught up with the leader.
//! The replica and the restart run while a paced writer keeps the cluster busy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_ownership::ids::{LeaseId, SessionId};
use ownerserve_ownership::node::secret::ClusterSecret;
use ownerserve_ownership::node::Replica;
use ownerserve_ownership::Command;

use super::dir_cluster::{leader, status, Cluster, Writer, CLUSTER_SECRET};
use super::dir_snapshot::new_session;

/// Claims per `Batch` command.
pub const BATCH: usize = 128;
/// Entries the tail writer commits while the killed node is down.
pub const MISSED_ENTRIES: u64 = 400;
/// The longest anything here is waited for.
const PATIENCE: Duration = Duration::from_secs(180);

/// Sorted commit latencies (ms) and the claims per second they made.
#[derive(Debug, Clone)]
pub struct Writes {
    pub rate: f64,
    pub latencies_ms: Vec<f64>,
}

/// Claims new sessions `from..to` in batches of [`BATCH`], `in_flight` at a time.
pub async fn fill(
    to_cluster: &Arc<Writer>,
    lease: LeaseId,
    (from, to): (usize, usize),
    in_flight: usize,
) -> anyhow::Result<Writes> {
    let batches = (to.saturating_sub(from)).div_ceil(BATCH);
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..in_flight.max(1) {
        let writer = to_cluster.clone();
        writers.spawn(async move {
            let mut latencies = Vec::new();
            for b in (w..batches).step_by(in_flight.max(1)) {
                let lo = from + b * BATCH;
                let commands = (lo..(lo + BATCH).min(to))
                    .map(|i| new_session(i, lease))
                    .collect();
                let t = Instant::now();
                let (outcome, _) = writer.commit(&Command::Batch { commands }).await?;
                latencies.push(t.elapsed().as_secs_f64() * 1e3);
                let refused = outcome["Batch"]["outcomes"]
                    .as_array()
                    .context("not a batch's outcome")?
                    .iter()
                    .find(|o| o.get("Owned").is_none());
                if let Some(refused) = refused {
                    bail!("a claim was refused: {refused}");
                }
            }
            anyhow::Ok(latencies)
        });
    }
    let mut latencies_ms = Vec::new();
    while let Some(done) = writers.join_next().await {
        latencies_ms.extend(done??);
    }
    latencies_ms.sort_by(f64::total_cmp);
    Ok(Writes {
        rate: (to - from) as f64 / started.elapsed().as_secs_f64(),
        latencies_ms,
    })
}

/// Claims new sessions from `from` on, one at a time, for `secs`; the writes and the next
/// unused session number.
pub async fn one_at_a_time(
    to_cluster: &Writer,
    lease: LeaseId,
    from: usize,
    secs: u64,
) -> anyhow::Result<(Writes, usize)> {
    let started = Instant::now();
    let mut latencies_ms = Vec::new();
    let mut i = from;
    while started.elapsed() < Duration::from_secs(secs) {
        let t = Instant::now();
        to_cluster.commit(&new_session(i, lease)).await?;
        latencies_ms.push(t.elapsed().as_secs_f64() * 1e3);
        i += 1;
    }
    latencies_ms.sort_by(f64::total_cmp);
    let rate = latencies_ms.len() as f64 / started.elapsed().as_secs_f64();
    Ok((Writes { rate, latencies_ms }, i))
}

/// A writer claiming the existing sessions `0..sessions` again (no new ones) at a steady
/// `claims_per_s`, in batches, until stopped: the cluster keeps committing while a replica
/// or a node catches up.
pub struct Tail {
    acked: Arc<AtomicU64>,
    stop: CancellationToken,
    tracker: TaskTracker,
}

impl Tail {
    /// Starts the writer.
    pub fn start(
        to_cluster: &Arc<Writer>,
        lease: LeaseId,
        sessions: usize,
        claims_per_s: u64,
    ) -> Self {
        let (acked, stop, tracker) = (
            Arc::new(AtomicU64::new(0)),
            CancellationToken::new(),
            TaskTracker::new(),
        );
        let period = Duration::from_secs_f64(BATCH as f64 / claims_per_s.max(1) as f64);
        let (writer, done, cancelled) = (to_cluster.clone(), acked.clone(), stop.clone());
        tracker.spawn(async move {
            let mut every = tokio::time::interval(period);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut next = 0usize;
            loop {
                tokio::select! {
                    () = cancelled.cancelled() => return,
                    _ = every.tick() => {}
                }
                let commands = (0..BATCH)
                    .map(|k| Command::SetDecodeOwner {
                        session: SessionId(format!("session-{:08}", (next + k) % sessions.max(1))),
                        lease,
                        prefix: None,
                        tail_tokens: 200,
                        predicted_tool_gap_ms: Some(30_000),
                        expect_epoch: None,
                    })
                    .collect();
                next += BATCH;
                if let Ok((_, index)) = writer.commit(&Command::Batch { commands }).await {
                    done.fetch_max(index, Ordering::AcqRel);
                }
            }
        });
        tracker.close();
        Self {
            acked,
            stop,
            tracker,
        }
    }

    /// The highest log index the writer has had acknowledged.
    pub fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Waits until the writer has had `entries` more entries acknowledged.
    async fn wait_entries(&self, entries: u64) -> anyhow::Result<()> {
        let target = self.acked() + entries;
        let deadline = Instant::now() + PATIENCE;
        while self.acked() < target {
            if Instant::now() > deadline {
                bail!("the tail writer stalled");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Ok(())
    }

    /// Stops the writer and waits for it.
    pub async fn stop(self) {
        self.stop.cancel();
        self.tracker.wait().await;
    }
}

/// A new replica's catch-up, in seconds from its start.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchUp {
    /// Until it applied the state it was sent (the snapshot line).
    pub synced_s: f64,
    /// Until it also applied every entry acknowledged by then (the tail).
    pub caught_up_s: f64,
    /// Entries of that tail.
    pub tail_entries: u64,
    /// Times it had to connect again (a node's snapshot line too slow to start).
    pub reconnects: u64,
}

/// Starts a router's replica of the cluster at `urls` (as `Remote::connect` does) while
/// `tail` writes, and times its catch-up.
pub async fn catch_up(urls: &[String], tail: &Tail) -> anyhow::Result<CatchUp> {
    let secret = ClusterSecret::new(CLUSTER_SECRET).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let started = Instant::now();
    let replica = Replica::follow(urls.to_vec(), Some(&secret), &tracker, cancel.clone());
    let measured = async {
        let mut applied = replica.subscribe();
        tokio::time::timeout(PATIENCE, applied.wait_for(|_| replica.synced()))
            .await
            .context("the replica did not sync")??;
        let synced_s = started.elapsed().as_secs_f64();
        let (snapshot_index, target) = (replica.applied(), tail.acked());
        if !replica.wait_applied(target, PATIENCE).await {
            bail!("the replica did not catch up");
        }
        Ok(CatchUp {
            synced_s,
            caught_up_s: started.elapsed().as_secs_f64(),
            tail_entries: target.saturating_sub(snapshot_index),
            reconnects: replica.counts().1,
        })
    }
    .await;
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    measured
}

/// A follower killed and started again, in seconds from its start.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recovery {
    /// Until it listened (its snapshot loaded, its log opened).
    pub listening_s: f64,
    /// Until it had applied what the leader had.
    pub caught_up_s: f64,
    /// Its snapshot file when it started, in bytes.
    pub snapshot_bytes: u64,
    /// Its log file when it started, in bytes.
    pub log_bytes: u64,
}

/// Kills a follower (SIGKILL), lets `tail` commit `missed` entries without it, starts it
/// again and times it until it has applied what the leader had.
pub async fn recover(
    cluster: &mut Cluster,
    http: &reqwest::Client,
    tail: &Tail,
    missed: u64,
) -> anyhow::Result<Recovery> {
    let lead = leader(http, &cluster.urls).await?;
    let f = cluster
        .urls
        .iter()
        .position(|u| *u != lead)
        .context("no follower")?;
    cluster.kill(f);
    tail.wait_entries(missed).await?;
    let size =
        |name: &str| std::fs::metadata(cluster.data_dir(f).join(name)).map_or(0, |m| m.len());
    let (snapshot_bytes, log_bytes) = (size("snapshot.json"), size("log.redb"));
    let started = Instant::now();
    cluster.restart(f).await?;
    let listening_s = started.elapsed().as_secs_f64();
    caught_up(http, &cluster.urls, f).await?;
    Ok(Recovery {
        listening_s,
        caught_up_s: started.elapsed().as_secs_f64(),
        snapshot_bytes,
        log_bytes,
    })
}

/// A node's last applied index (0 when it does not say).
fn applied(v: &Value) -> u64 {
    v["last_applied"].as_u64().unwrap_or(0)
}

/// Waits until node `f` has applied what the leader (whichever node it is at each look)
/// had applied just before.
async fn caught_up(http: &reqwest::Client, urls: &[String], f: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let lead = leader(http, urls).await?;
        if let (Ok(l), Ok(v)) = (status(http, &lead).await, status(http, &urls[f]).await) {
            if applied(&v) >= applied(&l) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("node {} did not catch up with the leader", f + 1);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every node has applied what the leader had, so that one measurement's
/// disturbance does not leak into the next; an error when it does not settle.
pub async fn settle(http: &reqwest::Client, urls: &[String]) -> anyhow::Result<()> {
    for f in 0..urls.len() {
        caught_up(http, urls, f).await?;
    }
    Ok(())
}

/// The log index a node's snapshot file is at, read from the file's head (`meta`, with its
/// `last_log_id`, comes before the state); `None` without a file.
fn snapshot_index(path: &std::path::Path) -> Option<u64> {
    use std::io::Read;
    let mut head = vec![0u8; 4096];
    let n = std::fs::File::open(path).ok()?.read(&mut head).ok()?;
    let head = std::str::from_utf8(&head[..n]).ok()?;
    let after = &head[head.find("\"last_log_id\"")?..];
    let digits = &after[after.find("\"index\":")? + "\"index\":".len()..];
    let end = digits.find(|c: char| !c.is_ascii_digit())?;
    digits[..end].parse().ok()
}

/// A follower down for longer than the leader keeps its log: killed (SIGKILL), then single
/// claims (64 in flight, of existing sessions) until the leader has snapshotted and purged
/// past where the follower stopped, so that, started again, it is sent the leader's
/// snapshot (`InstallSnapshot`). Timed until it has applied what the leader had.
pub async fn recover_from_snapshot(
    cluster: &mut Cluster,
    http: &reqwest::Client,
    to_cluster: &Arc<Writer>,
    lease: LeaseId,
    sessions: usize,
) -> anyhow::Result<Recovery> {
    let lead = leader(http, &cluster.urls).await?;
    let l = cluster
        .urls
        .iter()
        .position(|u| *u == lead)
        .context("no leader")?;
    let f = (l + 1) % cluster.urls.len();
    cluster.kill(f);
    let stopped_at = applied(&status(http, &lead).await?);
    // openraft keeps 1,000 entries behind a snapshot (`max_in_snapshot_log_to_keep`).
    let past = stopped_at + 1_500;
    let leader_snapshot = cluster.data_dir(l).join("snapshot.json");
    let stop = CancellationToken::new();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..64usize {
        let (writer, stop) = (to_cluster.clone(), stop.clone());
        writers.spawn(async move {
            let mut i = w;
            while !stop.is_cancelled() {
                let _ = writer
                    .commit(&new_session(i % sessions.max(1), lease))
                    .await;
                i += 64;
            }
        });
    }
    let deadline = Instant::now() + PATIENCE;
    while snapshot_index(&leader_snapshot).is_none_or(|i| i < past) {
        if Instant::now() > deadline {
            stop.cancel();
            bail!("the leader did not snapshot past index {past}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    while writers.join_next().await.is_some() {}
    let started = Instant::now();
    cluster.restart(f).await?;
    let listening_s = started.elapsed().as_secs_f64();
    caught_up(http, &cluster.urls, f).await?;
    let caught_up_s = started.elapsed().as_secs_f64();
    let snapshot = cluster.data_dir(f).join("snapshot.json");
    if snapshot_index(&snapshot).is_none_or(|i| i < past) {
        bail!("the restarted node caught up without the leader's snapshot");
    }
    Ok(Recovery {
        listening_s,
        caught_up_s,
        snapshot_bytes: std::fs::metadata(&snapshot).map_or(0, |m| m.len()),
        log_bytes: std::fs::metadata(cluster.data_dir(f).join("log.redb")).map_or(0, |m| m.len()),
    })
}
