//! A router reads its replica of the directory as current only within its read lease, and
//! a move of a session waits that lease out before its first step
//! (`ownerserve_ownership::node::read_lease`). Here router A's replica follows a node cut
//! off from the leader (it still answers, and still sends heartbeats), router B moves a
//! session off its owner, and A, planning the session's next step by the router's rule,
//! finds the new owner: before the read lease, A read its stale copy as current and sent
//! the step back to the owner the session left (`bench replicas`' split sessions).
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use std::time::Duration;

use ownerserve_ownership::ids::{LeaseId, SessionId, WorkerId};
use ownerserve_ownership::node::secret::ClusterSecret;
use ownerserve_ownership::node::{DirectoryClient, Remote};
use ownerserve_ownership::{Command, Outcome};
use ownerserve_planner::ids::WorkerId as PlannedWorker;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::common::{client, eventually, DirectoryNodes, ADMIN_TOKEN, CLUSTER_SECRET};
use crate::e2e_lagging::leader;

/// Node `i` stops talking to the nodes in `blocked` (empty: heals it).
async fn block(nodes: &DirectoryNodes, i: usize, blocked: &[usize]) {
    let resp = client()
        .post(format!("{}/test/v1/partition", nodes.url(i)))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({ "blocked": blocked }))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

async fn grant(c: &Remote, worker: u32) -> LeaseId {
    let granted = c
        .write(Command::GrantLease {
            worker: WorkerId(worker),
            ttl_ms: 600_000,
        })
        .await
        .unwrap();
    match granted {
        Outcome::LeaseGranted { lease, .. } => lease,
        other => panic!("{other:?}"),
    }
}

fn claim(lease: LeaseId, expect_epoch: Option<ownerserve_ownership::ids::Epoch>) -> Command {
    Command::SetDecodeOwner {
        session: SessionId("s".into()),
        lease,
        prefix: None,
        tail_tokens: 0,
        predicted_tool_gap_ms: None,
        expect_epoch,
    }
}

#[tokio::test]
async fn a_router_whose_replica_lags_sends_no_step_to_the_owner_a_session_left() {
    let nodes = DirectoryNodes::start(3, "read-lease", &["--fault-injection"]);
    let (l, _) = leader(&nodes).await;
    let (f, t) = ((l % 3) + 1, ((l + 1) % 3) + 1);
    let secret = ClusterSecret::new(CLUSTER_SECRET).unwrap();
    let (tracker, cancel) = (TaskTracker::new(), CancellationToken::new());
    // A follows the follower `f`; B follows the leader.
    let connect = |order: [usize; 3]| {
        let urls = order.iter().map(|&i| nodes.url(i)).collect();
        Remote::connect(urls, Some(&secret), &tracker, cancel.clone())
    };
    let (a, b) = (connect([f, l, t]), connect([l, t, f]));
    let (w1, w2) = (grant(&b, 1).await, grant(&b, 2).await);
    let Outcome::Owned { epoch: e1, .. } = b.write(claim(w1, None)).await.unwrap() else {
        panic!("not claimed");
    };
    assert!(a.catch_up().await, "A's replica caught up");
    assert!(a.fresh(), "a read was just sent and applied");
    let owner = |c: &Remote| {
        let l = c.lookup(Some("s"), &[], 16);
        (l.owner, l.epoch)
    };
    assert_eq!(owner(&a), (Some(PlannedWorker(1)), Some(e1)));

    // `f` is cut off from the others: A's copy stops there.
    block(&nodes, f, &[l, t]).await;
    block(&nodes, l, &[f]).await;
    block(&nodes, t, &[f]).await;

    // B moves the session to worker 2, and waits out the read lease before its first step
    // there, as a router's move does (`claim::settle_move`).
    let Outcome::Owned { epoch: e2, .. } = b.write(claim(w2, Some(e1))).await.unwrap() else {
        panic!("not moved");
    };
    assert!(e2 > e1);
    tokio::time::sleep(b.read_lease()).await;
    assert_eq!(
        owner(&a),
        (Some(PlannedWorker(1)), Some(e1)),
        "A's copy has not seen the move: read as it is, the next step would go back to worker 1"
    );

    // A plans the session's next step as a router does (`claim::catch_up`): its lease ran
    // out, so it reads through the leader first, and follows another node when `f` does
    // not bring it there.
    assert!(!a.fresh(), "A's last read is older than its lease");
    assert!(a.catch_up().await, "A caught up through another node");
    assert_eq!(owner(&a), (Some(PlannedWorker(2)), Some(e2)));

    for i in 1..=3 {
        block(&nodes, i, &[]).await;
    }
    let (b, owner) = (&b, &owner);
    eventually(
        Duration::from_secs(10),
        "B's copy holds the move",
        move || async move { b.catch_up().await && owner(b) == (Some(PlannedWorker(2)), Some(e2)) },
    )
    .await;
    cancel.cancel();
    tracker.close();
}
