//! `ownerserve bench directory`'s router side: what a router of a remote cluster pays,
//! through the very client it uses (`ownerserve_ownership::node::Remote`, whose lookups read
//! its live replica): a lookup from the replica (no round trip), a new session's owner
//! claim committed before dispatch, and how far the replica runs behind the leader while
//! the cluster takes ≥ 10,000 writes/s.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_ownership::ids::{LeaseId, SessionId};
use ownerserve_ownership::node::secret::ClusterSecret;
use ownerserve_ownership::node::{DirectoryClient, Remote};
use ownerserve_ownership::{Command, Outcome};

use super::percentile;
use ownerserve_eval::console::say;

/// Sessions claimed before the lookups (the replica then holds at least these).
const SESSIONS: usize = 2_000;
/// Lookups timed.
const LOOKUPS: usize = 200_000;
/// Block hashes per looked-up prompt (a 32K-token prompt in 16-token blocks has 2,048).
const HASHES: usize = 2_048;

/// A new session's owner claim, as the router commits it before dispatch.
fn claim(session: String, lease: LeaseId) -> Command {
    Command::SetDecodeOwner {
        session: SessionId(session),
        lease,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch: None,
    }
}

/// A router's client of the cluster, following it from the start of the benchmark (so its
/// replica keeps up through the write loads, as a live router's does).
pub struct RouterSide {
    remote: Arc<Remote>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl RouterSide {
    /// Connects to the cluster at `urls` with its `secret`; the replica starts following.
    pub fn connect(urls: Vec<String>, secret: &str) -> anyhow::Result<Self> {
        let secret = ClusterSecret::new(secret).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
        let remote = Arc::new(Remote::connect(
            urls,
            Some(&secret),
            &tracker,
            cancel.clone(),
        ));
        Ok(Self {
            remote,
            tracker,
            cancel,
        })
    }

    /// Runs the router-side measurements and prints their table rows.
    pub async fn run(self, lease: u64, secs: u64) -> anyhow::Result<()> {
        let measured = measure(&self.remote, LeaseId(lease), secs).await;
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        measured
    }
}

async fn measure(remote: &Arc<Remote>, lease: LeaseId, secs: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !remote.replica().synced() {
        if Instant::now() > deadline {
            bail!("the replica did not sync within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // New-session claims, one in flight (each is a step waiting on it).
    let mut claims = Vec::new();
    for i in 0..SESSIONS {
        let t = Instant::now();
        match remote
            .write(claim(format!("bench-session-{i}"), lease))
            .await?
        {
            Outcome::Owned { .. } => claims.push(t.elapsed().as_secs_f64() * 1e3),
            other => bail!("claim refused: {other:?}"),
        }
    }
    claims.sort_by(f64::total_cmp);
    say(&format!(
        "| router: new session's owner claim committed before dispatch, 1 in flight | {:.0} | {:.2} | {:.2} | |",
        claims.len() as f64 / (claims.iter().sum::<f64>() / 1e3),
        percentile(&claims, 50.0),
        percentile(&claims, 99.0)
    ));
    lookups(remote, lease).await?;
    lag(remote, lease, secs).await
}

/// Sessions of the live-like directory the second round of lookups reads.
const LIVE_SESSIONS: usize = 200;
/// Steps per live-like session, each claiming its whole prompt as an artifact (as the
/// router's records do).
const LIVE_STEPS: usize = 10;
/// Blocks of the system prompt every live-like session starts with.
const SYSTEM_BLOCKS: usize = 64;

/// A prefix artifact claim of `hashes` (its key the last block's hash, ending there).
fn claim_prefix(hashes: &[u64], lease: LeaseId) -> Command {
    Command::Claim {
        key: ownerserve_ownership::ids::PrefixKey(hashes[hashes.len() - 1]),
        lease,
        spec: ownerserve_ownership::command::ArtifactSpec {
            parent: None,
            blocks: (0, hashes.len() as u32),
            kv_type: "kv".into(),
            size_bytes: 0,
            checkpoints: ownerserve_ownership::command::checkpoints_of(hashes),
        },
        expect_epoch: None,
    }
}

/// Times lookups from the replica, twice. First in a sparse directory (the claimed
/// sessions and one owned 2,048-block prefix): a session's step (its owned prefix found
/// at the last block) and a brand-new prompt nobody owns. Then in a directory shaped like
/// a live one, where every step of [`LIVE_SESSIONS`] sessions claimed its whole prompt (a
/// shared system prompt, then each session's own growth), so artifacts end at nearly
/// every length: a brand-new prompt, and a new session sharing only the system prompt.
async fn lookups(remote: &Remote, lease: LeaseId) -> anyhow::Result<()> {
    let hashes: Vec<u64> = (0..HASHES as u64)
        .map(|h| h.wrapping_mul(0x9e37_79b9))
        .collect();
    let claimed = remote.write(claim_prefix(&hashes, lease)).await?;
    if !matches!(claimed, Outcome::Owned { .. }) {
        bail!("prefix claim refused: {claimed:?}");
    }
    let last = format!("bench-session-{}", SESSIONS - 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while remote.lookup(Some(&last), &hashes, 16).artifact.is_none() {
        if Instant::now() > deadline {
            bail!("the replica never showed the claims");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fresh: Vec<u64> = hashes.iter().map(|h| h ^ 0x5555).collect();
    time_lookups(
        remote,
        &[
            (
                "sparse directory, a session's step (owned prefix at its last block)",
                &hashes,
            ),
            ("sparse directory, a new prompt nobody owns", &fresh),
        ],
    );
    // The live-like directory: session `s`'s chain is the system prompt's blocks, then
    // its own; step `k` claims the chain up to a length spread over the whole range.
    let system: Vec<u64> = (0..SYSTEM_BLOCKS as u64).map(|b| 0x5157_0000 + b).collect();
    let chain = |s: usize, len: usize| -> Vec<u64> {
        let mut c = system.clone();
        c.extend((SYSTEM_BLOCKS..len).map(|b| ((s as u64 + 1) << 32) | b as u64));
        c
    };
    let mut claims = Vec::new();
    for s in 0..LIVE_SESSIONS {
        for k in 0..LIVE_STEPS {
            let len = SYSTEM_BLOCKS
                + 1
                + (s * LIVE_STEPS + k) * (HASHES - SYSTEM_BLOCKS - 1)
                    / (LIVE_SESSIONS * LIVE_STEPS);
            claims.push(claim_prefix(&chain(s, len), lease));
        }
    }
    let mut last_index = 0;
    for batch in claims.chunks(128) {
        let (_, index) = remote
            .commit(Command::Batch {
                commands: batch.to_vec(),
            })
            .await?;
        last_index = index;
    }
    remote
        .replica()
        .wait_applied(last_index, Duration::from_secs(10))
        .await;
    let sharing_system = chain(LIVE_SESSIONS + 1, HASHES);
    time_lookups(
        remote,
        &[
            ("live-like directory, a new prompt nobody owns", &fresh),
            (
                "live-like directory, a new session sharing only the system prompt",
                &sharing_system,
            ),
        ],
    );
    Ok(())
}

/// Times [`LOOKUPS`] lookups of each case's prompt, cycling through the claimed sessions,
/// and prints a row each.
fn time_lookups(remote: &Remote, cases: &[(&str, &Vec<u64>)]) {
    for (case, prompt) in cases {
        let mut ns = Vec::with_capacity(LOOKUPS);
        for i in 0..LOOKUPS {
            let session = format!("bench-session-{}", i % SESSIONS);
            let t = Instant::now();
            let l = remote.lookup(Some(&session), prompt, 16);
            ns.push(t.elapsed().as_nanos() as f64);
            std::hint::black_box(l);
        }
        ns.sort_by(f64::total_cmp);
        say(&format!(
            "| router: lookup from its replica, {case}, {}-block prompt | {:.0} | {:.4} | {:.4} | p99 ≤ 0.002 ms |",
            prompt.len(),
            1e9 / (ns.iter().sum::<f64>() / ns.len() as f64),
            percentile(&ns, 50.0) / 1e6,
            percentile(&ns, 99.0) / 1e6
        ));
    }
}

/// Drives batched claims at the leader for `secs` while recording when the replica applies
/// each acknowledged index: the replica's lag is its apply time minus the writer's ack.
async fn lag(remote: &Arc<Remote>, lease: LeaseId, secs: u64) -> anyhow::Result<()> {
    let replica = remote.replica().clone();
    let mut applied = replica.subscribe();
    let stop = CancellationToken::new();
    let mut watching = tokio::task::JoinSet::new();
    {
        let stop = stop.clone();
        watching.spawn(async move {
            let mut seen: Vec<(u64, Instant)> = Vec::new();
            loop {
                tokio::select! {
                    () = stop.cancelled() => {
                        seen.push((*applied.borrow(), Instant::now()));
                        return seen;
                    }
                    changed = applied.changed() => {
                        if changed.is_err() { return seen; }
                        seen.push((*applied.borrow_and_update(), Instant::now()));
                    }
                }
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut writers = tokio::task::JoinSet::new();
    // Four writers of 128-claim batches: well past 10,000 writes/s on loopback.
    for w in 0..4u64 {
        let remote = remote.clone();
        writers.spawn(async move {
            let mut acks: Vec<(u64, Instant)> = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let commands = (0..128)
                    .map(|i| claim(format!("lag-{w}-{n}-{i}"), lease))
                    .collect();
                if let Ok((_, index)) = remote.commit(Command::Batch { commands }).await {
                    acks.push((index, Instant::now()));
                }
                n += 1;
            }
            acks
        });
    }
    let mut acks = Vec::new();
    while let Some(a) = writers.join_next().await {
        acks.extend(a?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    // Let the replica finish what was acknowledged, then stop watching.
    let last = acks
        .iter()
        .map(|a| a.0)
        .max()
        .context("no write acknowledged")?;
    replica.wait_applied(last, Duration::from_secs(10)).await;
    stop.cancel();
    let seen = watching.join_next().await.context("the watcher ended")??;
    let mut lags = Vec::with_capacity(acks.len());
    for (index, acked) in &acks {
        let at = seen.partition_point(|(i, _)| i < index);
        let Some((_, applied_at)) = seen.get(at) else {
            bail!("the replica never applied index {index}");
        };
        lags.push(applied_at.saturating_duration_since(*acked).as_secs_f64() * 1e3);
    }
    lags.sort_by(f64::total_cmp);
    say(&format!(
        "| router: replica behind the leader's acknowledgement, under {:.0} writes/s | | {:.2} | {:.2} | |",
        (acks.len() * 128) as f64 / elapsed,
        percentile(&lags, 50.0),
        percentile(&lags, 99.0)
    ));
    Ok(())
}
