use ownerserve_ownership::ids::{SessionId, Tier, WorkerId as DirWorkerId};
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_planner::tokenized::Tokenized;

use super::commands::commands_for;
use super::flush::{write_records, MAX_WAITING};
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

/// A directory that fails its first batch write (the leader killed mid-commit), then is
/// the real one underneath.
struct FailsFirstBatch {
    inner: Arc<dyn DirectoryClient>,
    failed: std::sync::atomic::AtomicBool,
}

impl DirectoryClient for FailsFirstBatch {
    fn fresh(&self) -> bool {
        self.inner.fresh()
    }

    fn catch_up(&self) -> ownerserve_ownership::node::BoxFuture<'_, bool> {
        self.inner.catch_up()
    }

    fn read_local(&self, f: &mut dyn FnMut(&ownerserve_ownership::Directory)) {
        self.inner.read_local(f);
    }

    fn write(
        &self,
        command: Command,
    ) -> ownerserve_ownership::node::BoxFuture<
        '_,
        Result<Outcome, ownerserve_ownership::node::DirectoryError>,
    > {
        let first_batch = matches!(command, Command::Batch { .. })
            && !self.failed.swap(true, std::sync::atomic::Ordering::SeqCst);
        if first_batch {
            return Box::pin(async {
                Err(ownerserve_ownership::node::DirectoryError::NotLeader {
                    leader_id: None,
                    leader_addr: None,
                })
            });
        }
        self.inner.write(command)
    }

    fn lookup(
        &self,
        session: Option<&str>,
        hashes: &[u64],
        block: u64,
    ) -> ownerserve_ownership::node::Lookup {
        self.inner.lookup(session, hashes, block)
    }
}

/// A batch the directory did not answer is written on a later flush, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_directory_did_not_answer_is_written_on_a_later_flush() {
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    let (inner, data_dir) = embedded_directory("unanswered", &tracker, &cancel).await;
    let client: Arc<dyn DirectoryClient> = Arc::new(FailsFirstBatch {
        inner: inner.clone(),
        failed: std::sync::atomic::AtomicBool::new(false),
    });
    let registry = one_healthy_worker();
    let worker = registry.all()[0].id;
    let dropped = prometheus::IntCounter::new("dropped", "dropped").unwrap();
    let settings = SyncSettings {
        lease_ttl: Duration::from_secs(3),
        flush_every: Duration::from_millis(5),
        block_size: 16,
        dropped: dropped.clone(),
    };
    let sync = OwnershipSync::spawn(client, registry, settings, &tracker, cancel.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while sync.lease_of(worker).is_none() {
        assert!(tokio::time::Instant::now() < deadline, "no first lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut step = routed(64, Some("unanswered"), Effects::default());
    step.worker = worker;
    sync.record(step);
    while session_owner(&*inner, "unanswered").is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the record of the unanswered batch was lost"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dropped.get(), 0);
    cancel.cancel();
    tracker.close();
    tracker.wait().await;
    std::fs::remove_dir_all(&data_dir).ok();
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
    let sync = OwnershipSync::spawn(client.clone(), registry, settings, &tracker, cancel.clone());
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
    let out = write_records(&*client, vec![step], &leases, 16).await;
    assert!(out.lapsed.is_empty() && out.failed.is_empty() && out.refused == 0);
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
