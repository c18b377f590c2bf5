//! Keeps the directory in step with the fleet, off the request path: a lease per worker,
//! renewed while the worker is healthy (so a dead worker's ownership expires on its own),
//! and, for every routed request, a claim of its prompt's prefix and the session's decode
//! owner for the worker that served it. Records are batched into one `Batch` entry per
//! flush, so the proxy never waits for a Raft round trip.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use ownerserve_ownership::command::MAX_BATCH;
use ownerserve_ownership::command::{checkpoints_of, ArtifactSpec};
use ownerserve_ownership::ids::{
    Epoch, LeaseId, PrefixKey, SessionId, Tier, WorkerId as DirWorkerId,
};
use ownerserve_ownership::{Command, Outcome, Rejection};
use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::ids::WorkerId;

use crate::registry::Registry;
use ownerserve_ownership::node::DirectoryClient;

/// Most records the sync holds besides its channel: waiting for a lease, or for the flush
/// in flight to finish (beyond, dropped and counted; each record holds a prompt's tokens).
const MAX_WAITING: usize = 1024;
/// Most records queued for the sync task. While the directory is down the task waits on
/// it and the queue fills; past this, records are dropped and counted, so an outage costs
/// ownership records, never the router's memory (each record holds a prompt's tokens).
pub const MAX_QUEUED: usize = 4096;

/// One routed request to record.
pub struct Routed {
    pub worker: WorkerId,
    pub session: Option<String>,
    /// The session's root session and parent agent, as its harness named them.
    pub root: Option<String>,
    pub parent: Option<String>,
    /// The prompt as the identity stage tokenized and hashed it.
    pub prompt: Arc<HashedPrompt>,
    pub effects: Effects,
}

/// What a plan changes in the directory besides recording the serving worker.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Effects {
    /// The plan moves the session: set its owner only if its epoch is still this one.
    pub expect_epoch: Option<Epoch>,
    /// The worker fetched this artifact: register its read-only copy.
    pub replicate: Option<PrefixKey>,
    /// The request forks its session into this child, fenced by the parent's epoch.
    pub fork: Option<(String, Epoch)>,
    /// The session's predicted tool-call gap.
    pub predicted_gap_ms: Option<u64>,
}

/// Timings of the sync, and where it counts what it drops.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    pub lease_ttl: Duration,
    pub flush_every: Duration,
    pub block_size: usize,
    /// Records dropped for lack of room (`ownerserve_ownership_records_dropped_total`).
    pub dropped: prometheus::IntCounter,
}

/// Each worker's current directory lease.
type Leases = Arc<Mutex<HashMap<WorkerId, LeaseId>>>;

/// Handle the proxy records routed requests through (never blocks).
#[derive(Clone)]
pub struct OwnershipSync {
    tx: mpsc::Sender<Routed>,
    leases: Leases,
    client: Arc<dyn DirectoryClient>,
    /// Records dropped because the queue was full (`ownerserve_ownership_records_dropped_total`).
    dropped: prometheus::IntCounter,
}

impl OwnershipSync {
    /// Queues a record for the directory, or drops and counts it when the sync is
    /// [`MAX_QUEUED`] records behind.
    pub fn record(&self, routed: Routed) {
        if self.tx.try_send(routed).is_err() {
            self.dropped.inc();
        }
    }

    /// The worker's directory lease: the shared one (the lowest live one in the local copy
    /// of the directory, which every router renews), else the one this router renews, so a
    /// router that has not renewed yet can still claim for the worker.
    pub fn lease_of(&self, worker: WorkerId) -> Option<LeaseId> {
        let own = self
            .leases
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&worker)
            .copied();
        lease_to_write(&*self.client, worker, own)
    }

    /// The directory, for commands that must commit before the request goes on (a
    /// migration's owner flip) and for lookups.
    pub fn client(&self) -> &Arc<dyn DirectoryClient> {
        &self.client
    }

    /// Starts the sync task.
    pub fn spawn(
        client: Arc<dyn DirectoryClient>,
        registry: Arc<Registry>,
        s: SyncSettings,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let (tx, rx) = mpsc::channel(MAX_QUEUED);
        let leases = Leases::default();
        let dropped = s.dropped.clone();
        let sync = run(client.clone(), registry, s, rx, leases.clone());
        // Cancelled wherever it waits: a hung directory must not hold up shutdown.
        tracker.spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = sync => {}
            }
        });
        Self {
            tx,
            leases,
            client,
            dropped,
        }
    }
}

fn dir_worker(w: WorkerId) -> DirWorkerId {
    DirWorkerId(w.0)
}

/// The commands recording one routed request, given the serving worker's lease.
fn commands_for(r: &Routed, lease: LeaseId, block_size: usize) -> Vec<Command> {
    let (tokens, hashes) = (&r.prompt.tokenized.tokens, &r.prompt.hashes);
    let prefix = hashes.last().map(|&h| PrefixKey(h));
    let mut out = Vec::new();
    if let Some(key) = r.effects.replicate {
        out.push(Command::ReplicateReadOnly {
            key,
            worker: dir_worker(r.worker),
            tier: Tier::Gpu,
        });
    }
    if let Some(key) = prefix {
        out.push(Command::Claim {
            key,
            lease,
            spec: ArtifactSpec {
                parent: None,
                blocks: (0, hashes.len() as u32),
                kv_type: "kv".into(),
                size_bytes: 0,
                checkpoints: checkpoints_of(hashes),
            },
            expect_epoch: None,
        });
    }
    match (&r.session, &r.effects.fork) {
        (Some(parent), Some((child, parent_epoch))) => out.push(Command::Fork {
            parent: SessionId(parent.clone()),
            child: SessionId(child.clone()),
            lease,
            parent_epoch: *parent_epoch,
        }),
        (Some(session), _) => out.push(Command::SetDecodeOwner {
            session: SessionId(session.clone()),
            lease,
            prefix,
            tail_tokens: (tokens.len() % block_size.max(1)) as u32,
            predicted_tool_gap_ms: r.effects.predicted_gap_ms,
            expect_epoch: r.effects.expect_epoch,
        }),
        (None, _) => {}
    }
    if let Some(label) = label(r) {
        out.push(label);
    }
    out
}

/// The labels of a session step whose harness named a root other than the session, or
/// a parent agent (a sub-agent): for the operator's view of the directory.
fn label(r: &Routed) -> Option<Command> {
    let session = r.session.as_deref().filter(|_| r.effects.fork.is_none())?;
    let other_root = r.root.as_deref().filter(|root| *root != session);
    if other_root.is_none() && r.parent.is_none() {
        return None;
    }
    Some(Command::LabelSession {
        session: SessionId(session.to_owned()),
        root: other_root.map(|s| SessionId(s.to_owned())),
        parent: r.parent.as_deref().map(|s| SessionId(s.to_owned())),
    })
}

/// A session's owner claim for `lease`'s worker, committed before a step is dispatched:
/// CAS on `expect_epoch` (`None`: on the absence of a live owner). The step's record,
/// batched later, fills in its prefix and tail.
pub fn owner_claim(session: &str, lease: LeaseId, expect_epoch: Option<Epoch>) -> Command {
    Command::SetDecodeOwner {
        session: SessionId(session.to_owned()),
        lease,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch,
    }
}

/// The live lease of `worker` with the lowest id in the local copy of the directory: every
/// router of a cluster converges on it, so a worker has one lease however many routers
/// renew it (a lease one router granted in a race with another simply expires).
fn shared_lease(client: &dyn DirectoryClient, worker: DirWorkerId) -> Option<LeaseId> {
    let mut found = None;
    client.read_local(&mut |d| {
        found = d
            .leases
            .iter()
            .find(|(id, l)| l.worker == worker && d.lease_live(**id))
            .map(|(id, _)| *id);
    });
    found
}

/// The lease a command for `worker` goes under: the shared one first (routers that
/// granted at once converge on it, and a session claimed or recorded under the other one
/// would lose its owner when that one lapses, since no router renews it), else the one
/// this router renews (`own`), so a router that has not renewed yet can still write.
fn lease_to_write(
    client: &dyn DirectoryClient,
    worker: WorkerId,
    own: Option<LeaseId>,
) -> Option<LeaseId> {
    shared_lease(client, dir_worker(worker)).or(own)
}

/// Renews the worker's shared lease (or the one this router knows), or grants one.
async fn keep_or_grant(
    client: &dyn DirectoryClient,
    known: Option<LeaseId>,
    worker: WorkerId,
    ttl_ms: u64,
) -> Option<LeaseId> {
    let shared = shared_lease(client, dir_worker(worker));
    for lease in shared
        .into_iter()
        .chain(known.filter(|k| Some(*k) != shared))
    {
        let kept = client.write(Command::KeepAlive { lease }).await;
        if matches!(kept, Ok(Outcome::LeaseRenewed { .. })) {
            return Some(lease);
        }
        // The lease ended before this renewal (its sessions lost their owner): worth an
        // operator's attention, unlike a renewal that merely timed out.
        if let Ok(Outcome::Rejected(why)) = &kept {
            tracing::warn!(worker = %worker, lease = lease.0, ?why, "directory lease ended before its renewal");
        }
    }
    // Another router may have granted one since the local copy was read: catch up and
    // look again before granting a second.
    if client.catch_up().await {
        if let Some(lease) = shared_lease(client, dir_worker(worker)) {
            let kept = client.write(Command::KeepAlive { lease }).await;
            if matches!(kept, Ok(Outcome::LeaseRenewed { .. })) {
                return Some(lease);
            }
        }
    }
    let granted = client
        .write(Command::GrantLease {
            worker: dir_worker(worker),
            ttl_ms,
        })
        .await;
    match granted {
        Ok(Outcome::LeaseGranted { lease, .. }) => Some(lease),
        _ => None,
    }
}

async fn run(
    client: Arc<dyn DirectoryClient>,
    registry: Arc<Registry>,
    s: SyncSettings,
    mut rx: mpsc::Receiver<Routed>,
    shared: Leases,
) {
    let ttl_ms = s.lease_ttl.as_millis() as u64;
    let mut leases: HashMap<WorkerId, LeaseId> = HashMap::new();
    let every = (s.lease_ttl / 3).max(Duration::from_millis(50));
    let mut renew = tokio::time::interval(every);
    let mut flush = tokio::time::interval(s.flush_every.max(Duration::from_millis(5)));
    // Not a burst of catch-up ticks after a long flush.
    flush.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut pending: Vec<Routed> = Vec::new();
    // One flush in flight, off this loop: a directory slow to commit (a starved or
    // fsync-bound leader: 1-30 s measured beside three CPU vLLM engines on 2 cores) must
    // not hold up the renewals until the leases lapse. Dropped with the loop at shutdown.
    let mut writing: JoinSet<Vec<Lapsed>> = JoinSet::new();
    loop {
        tokio::select! {
            // While `pending` is full the channel fills instead, and `record` counts drops.
            r = rx.recv(), if pending.len() < MAX_WAITING => match r {
                Some(r) => pending.push(r),
                None => return,
            },
            _ = renew.tick() => {
                // Renew healthy workers' leases (grant one to a healthy worker without), all
                // at once and each within a renewal period, so one slow answer (an election)
                // cannot let the others lapse.
                let mut renewals = tokio::task::JoinSet::new();
                for w in registry.all().iter().filter(|w| w.is_healthy()) {
                    let (client, known, id) = (client.clone(), leases.get(&w.id).copied(), w.id);
                    let name = w.spec.name.clone();
                    renewals.spawn(async move {
                        let kept = keep_or_grant(&*client, known, id, ttl_ms);
                        (id, name, tokio::time::timeout(every, kept).await.ok().flatten())
                    });
                }
                while let Some(Ok((id, name, lease))) = renewals.join_next().await {
                    match lease {
                        Some(lease) => {
                            leases.insert(id, lease);
                            shared.lock().unwrap_or_else(|e| e.into_inner()).insert(id, lease);
                        }
                        None => tracing::warn!(worker = %name, "no directory lease"),
                    }
                }
            }
            Some(done) = writing.join_next() => {
                let lapsed = done.unwrap_or_default();
                let mut retry = Vec::new();
                for Lapsed { worker, lease, records } in lapsed {
                    // The directory ended the lease (it was not renewed in time): the next
                    // renewal grants a new one, and these records wait for it.
                    if leases.get(&worker) == Some(&lease) {
                        leases.remove(&worker);
                    }
                    retry.extend(records);
                }
                // Older than what arrived meanwhile: they go first, so a session's records
                // still land in the order its steps were served.
                retry.append(&mut pending);
                pending = retry;
            }
            _ = flush.tick(), if writing.is_empty() => {
                // Records of a worker without a lease (the directory may still be electing a
                // leader, or the lease lapsed) wait for one, up to a bound.
                let (ready, waiting): (Vec<Routed>, Vec<Routed>) =
                    pending.drain(..).partition(|r| leases.contains_key(&r.worker));
                pending = waiting;
                if pending.len() > MAX_WAITING {
                    let dropped = pending.len() - MAX_WAITING;
                    pending.drain(..dropped);
                    s.dropped.inc_by(dropped as u64);
                    tracing::warn!(dropped, "ownership records dropped: no directory lease");
                }
                if !ready.is_empty() {
                    let (client, leases) = (client.clone(), leases.clone());
                    writing.spawn(async move {
                        write_records(&*client, ready, &leases, s.block_size).await
                    });
                }
            }
        }
    }
}

/// Records the directory refused because their worker's lease had ended.
struct Lapsed {
    worker: WorkerId,
    lease: LeaseId,
    records: Vec<Routed>,
}

/// Writes the records' commands in batches of whole records, so that a refusal maps back
/// to the records it touched; returns the records refused for a lease the directory no
/// longer knows or let expire (the rest are written, or refused for good, e.g. fenced).
async fn write_records(
    client: &dyn DirectoryClient,
    ready: Vec<Routed>,
    leases: &HashMap<WorkerId, LeaseId>,
    block_size: usize,
) -> Vec<Lapsed> {
    // Each batch with its records, their leases and how many of its commands each made.
    type Of = Vec<(Routed, LeaseId, usize)>;
    let mut batches: Vec<(Vec<Command>, Of)> = Vec::new();
    for r in ready {
        let Some(lease) = lease_to_write(client, r.worker, leases.get(&r.worker).copied()) else {
            continue;
        };
        let commands = commands_for(&r, lease, block_size);
        let n = commands.len();
        match batches.last_mut() {
            Some((batch, of)) if batch.len() + n <= MAX_BATCH => {
                batch.extend(commands);
                of.push((r, lease, n));
            }
            _ => batches.push((commands, vec![(r, lease, n)])),
        }
    }
    let mut lapsed: Vec<Lapsed> = Vec::new();
    for (batch, of) in batches {
        let outcomes = match client.write(Command::Batch { commands: batch }).await {
            Ok(Outcome::Batch { outcomes }) => outcomes,
            Ok(other) => {
                tracing::warn!(outcome = ?other, "ownership records refused");
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "ownership records not committed");
                continue;
            }
        };
        let mut outcomes = outcomes.into_iter();
        for (r, lease, n) in of {
            let ended = outcomes.by_ref().take(n).any(|o| {
                matches!(
                    o,
                    Outcome::Rejected(Rejection::UnknownLease(_) | Rejection::LeaseExpired(_))
                )
            });
            if !ended {
                continue;
            }
            match lapsed.iter_mut().find(|l| l.lease == lease) {
                Some(l) => l.records.push(r),
                None => lapsed.push(Lapsed {
                    worker: r.worker,
                    lease,
                    records: vec![r],
                }),
            }
        }
    }
    lapsed
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
    use ownerserve_planner::tokenized::Tokenized;

    use super::*;

    fn routed(tokens: usize, session: Option<&str>, effects: Effects) -> Routed {
        let tokens: Vec<u32> = (0..tokens as u32).collect();
        let hashes = prompt_hashes(&tokens, 16, XXH3_SEED);
        Routed {
            worker: WorkerId(3),
            session: session.map(str::to_owned),
            root: None,
            parent: None,
            prompt: Arc::new(HashedPrompt {
                tokenized: Tokenized::from_tokens(tokens),
                hashes,
            }),
            effects,
        }
    }

    /// A directory that never answers (an outage: every write hangs).
    struct Unreachable;

    impl DirectoryClient for Unreachable {
        fn fresh(&self) -> bool {
            true
        }

        fn catch_up(&self) -> ownerserve_ownership::node::BoxFuture<'_, bool> {
            Box::pin(async { true })
        }

        fn read_local(&self, _: &mut dyn FnMut(&ownerserve_ownership::Directory)) {}

        fn write(
            &self,
            _: Command,
        ) -> ownerserve_ownership::node::BoxFuture<
            '_,
            Result<Outcome, ownerserve_ownership::node::DirectoryError>,
        > {
            Box::pin(std::future::pending())
        }

        fn lookup(&self, _: Option<&str>, _: &[u64], _: u64) -> ownerserve_ownership::node::Lookup {
            ownerserve_ownership::node::Lookup::default()
        }
    }

    /// A registry of one healthy sim worker.
    fn one_healthy_worker() -> Arc<Registry> {
        use crate::config::WorkerSpec;
        use ownerserve_planner::ids::{EngineKind, Role};
        let registry = Arc::new(Registry::new(vec![WorkerSpec::new(
            "w",
            "http://127.0.0.1:1",
            Role::Hybrid,
            EngineKind::Sim,
        )]));
        registry.all()[0].mark_healthy(vec!["m".into()]);
        registry
    }

    #[tokio::test]
    async fn a_directory_outage_drops_and_counts_records_instead_of_growing_memory() {
        let registry = one_healthy_worker();
        let dropped = prometheus::IntCounter::new("dropped", "dropped").unwrap();
        let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
        let settings = SyncSettings {
            lease_ttl: Duration::from_secs(3),
            flush_every: Duration::from_millis(5),
            block_size: 16,
            dropped: dropped.clone(),
        };
        let sync = OwnershipSync::spawn(
            Arc::new(Unreachable),
            registry,
            settings,
            &tracker,
            cancel.clone(),
        );
        // The task takes its first lease round, which hangs on the directory.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = MAX_QUEUED + MAX_WAITING + 5000;
        for _ in 0..sent {
            sync.record(routed(64, Some("s"), Effects::default()));
            tokio::task::yield_now().await;
        }
        // Let the renewal round time out (a third of the lease) and the records drain.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        for _ in 0..sent {
            sync.record(routed(64, Some("s"), Effects::default()));
            tokio::task::yield_now().await;
        }
        // Before, all of them stayed queued, each with its prompt, for as long as the outage;
        // now at most a full channel and the records waiting for a lease are kept.
        let kept = 2 * sent as u64 - dropped.get();
        let bound = (MAX_QUEUED + MAX_WAITING) as u64;
        assert!(
            kept >= MAX_QUEUED as u64 && kept <= bound,
            "kept {kept} of {}",
            2 * sent
        );
        cancel.cancel();
        tracker.close();
        tracker.wait().await;
    }

    /// A one-node directory in this process, in a fresh data folder named by `tag`.
    async fn embedded_directory(
        tag: &str,
        tracker: &TaskTracker,
        cancel: &CancellationToken,
    ) -> (Arc<dyn DirectoryClient>, std::path::PathBuf) {
        use ownerserve_ownership::node::metrics::DirectoryMetrics;
        use ownerserve_ownership::node::{Embedded, Node, NodeSettings};
        let data_dir =
            std::env::temp_dir().join(format!("ownerserve-sync-{tag}-{}", std::process::id()));
        let node = Node::start(
            NodeSettings {
                id: 1,
                data_dir: data_dir.clone(),
                nodes: [(1, openraft::BasicNode::new("127.0.0.1:0"))].into(),
                init: true,
                grace_ms: 0,
                tick_ms: 50,
                metrics: DirectoryMetrics::register(&prometheus::Registry::new()).unwrap(),
                cluster_secret: None,
            },
            tracker,
            cancel,
        )
        .await
        .unwrap();
        (Arc::new(Embedded(node)), data_dir)
    }

    /// The session's owner in the local copy of the directory.
    fn session_owner(
        client: &dyn DirectoryClient,
        session: &str,
    ) -> Option<ownerserve_ownership::ids::Owner> {
        let mut owner = None;
        client.read_local(&mut |d| {
            owner = d
                .sessions
                .get(&SessionId(session.into()))
                .and_then(|s| s.owner);
        });
        owner
    }

    /// A lease the directory ended before a flush (not renewed in time on a starved
    /// machine): the records refused for it wait for the next lease instead of being lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn records_refused_for_an_ended_lease_are_written_under_the_next_one() {
        let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
        let (client, data_dir) = embedded_directory("lapse", &tracker, &cancel).await;
        let registry = one_healthy_worker();
        let worker = registry.all()[0].id;
        let settings = SyncSettings {
            lease_ttl: Duration::from_secs(3),
            flush_every: Duration::from_millis(5),
            block_size: 16,
            dropped: prometheus::IntCounter::new("dropped", "dropped").unwrap(),
        };
        let sync =
            OwnershipSync::spawn(client.clone(), registry, settings, &tracker, cancel.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let first = loop {
            if let Some(l) = sync.lease_of(worker) {
                break l;
            }
            assert!(tokio::time::Instant::now() < deadline, "no first lease");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        // The lease ends under the sync's feet; the next flush still carries it.
        let ended = client.write(Command::RevokeLease { lease: first }).await;
        assert!(matches!(ended, Ok(Outcome::LeaseEnded { .. })), "{ended:?}");
        let mut step = routed(64, Some("after-lapse"), Effects::default());
        step.worker = worker;
        sync.record(step);
        let owner = loop {
            if let Some(o) = session_owner(&*client, "after-lapse") {
                break o;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the step's record was lost with the ended lease"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_ne!(owner.lease, first, "owned under the new lease");
        cancel.cancel();
        tracker.close();
        tracker.wait().await;
        std::fs::remove_dir_all(&data_dir).ok();
    }

    /// Two live leases of one worker (two routers granted at once): a record goes under
    /// the shared one (the lowest), which every router renews, not under the other, which
    /// lapses and would take the session's owner with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_goes_under_the_shared_lease_of_its_worker() {
        let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
        let (client, data_dir) = embedded_directory("shared", &tracker, &cancel).await;
        let grant = || {
            let client = client.clone();
            async move {
                let command = Command::GrantLease {
                    worker: DirWorkerId(3),
                    ttl_ms: 60_000,
                };
                match client.write(command).await {
                    Ok(Outcome::LeaseGranted { lease, .. }) => lease,
                    other => panic!("{other:?}"),
                }
            }
        };
        let (shared, other) = (grant().await, grant().await);
        assert!(shared < other);
        let step = routed(64, Some("two-leases"), Effects::default());
        let leases = HashMap::from([(step.worker, other)]);
        let lapsed = write_records(&*client, vec![step], &leases, 16).await;
        assert!(lapsed.is_empty());
        let owner = session_owner(&*client, "two-leases");
        assert_eq!(owner.map(|o| o.lease), Some(shared));
        cancel.cancel();
        tracker.close();
        tracker.wait().await;
        std::fs::remove_dir_all(&data_dir).ok();
    }

    #[test]
    fn a_session_step_claims_its_prefix_and_sets_its_decode_owner() {
        let r = routed(
            40,
            Some("s1"),
            Effects {
                predicted_gap_ms: Some(900),
                ..Effects::default()
            },
        );
        let key = PrefixKey(r.prompt.hashes[1]);
        let commands = commands_for(&r, LeaseId(5), 16);
        let [Command::Claim {
            key: claimed,
            lease,
            spec,
            expect_epoch: None,
        }, Command::SetDecodeOwner {
            session,
            lease: owner_lease,
            prefix,
            tail_tokens,
            predicted_tool_gap_ms,
            expect_epoch: None,
        }] = commands.as_slice()
        else {
            panic!("{commands:?}");
        };
        assert_eq!((*claimed, *lease, spec.blocks), (key, LeaseId(5), (0, 2)));
        assert_eq!(
            (session.0.as_str(), *owner_lease, *prefix),
            ("s1", LeaseId(5), Some(key))
        );
        assert_eq!((*tail_tokens, *predicted_tool_gap_ms), (8, Some(900)));
    }

    #[test]
    fn a_fetch_registers_the_copy_a_fork_forks_and_a_short_stateless_prompt_records_nothing() {
        let effects = Effects {
            replicate: Some(PrefixKey(77)),
            fork: Some(("s1/kid".into(), Epoch(4))),
            ..Effects::default()
        };
        let commands = commands_for(&routed(32, Some("s1"), effects), LeaseId(1), 16);
        assert!(matches!(
            commands[0],
            Command::ReplicateReadOnly {
                key: PrefixKey(77),
                worker: DirWorkerId(3),
                tier: Tier::Gpu
            }
        ));
        assert!(matches!(commands[1], Command::Claim { .. }));
        let Command::Fork {
            parent,
            child,
            parent_epoch,
            ..
        } = &commands[2]
        else {
            panic!("{commands:?}");
        };
        assert_eq!(
            (parent.0.as_str(), child.0.as_str(), *parent_epoch),
            ("s1", "s1/kid", Epoch(4))
        );
        assert!(commands_for(&routed(8, None, Effects::default()), LeaseId(1), 16).is_empty());
    }

    #[test]
    fn a_sub_agents_step_labels_its_session_with_its_root_and_parent() {
        let mut r = routed(40, Some("kid"), Effects::default());
        assert_eq!(
            commands_for(&r, LeaseId(1), 16).len(),
            2,
            "a root agent: no label"
        );
        r.root = Some("root".into());
        r.parent = Some("mid".into());
        let commands = commands_for(&r, LeaseId(1), 16);
        assert_eq!(
            commands.last(),
            Some(&Command::LabelSession {
                session: SessionId("kid".into()),
                root: Some(SessionId("root".into())),
                parent: Some(SessionId("mid".into())),
            })
        );
    }
}
