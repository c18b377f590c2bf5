//! What 0.1.0 wrote, read by this release: a directory node's snapshot and redb log made
//! by the 0.1.0 binary (`tests/fixtures/directory-v0.1.0/make.py`), loaded as a node
//! upgraded in place loads them, and checked entry by entry. If this fails, a node rolled
//! from 0.1.0 to this release would not start on its own data.
#![cfg(feature = "raft")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]

use std::io::Read;
use std::path::PathBuf;

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::EntryPayload;
use ownerserve_ownership::ids::{Epoch, LeaseId, PrefixKey, SessionId, Tier, WorkerId};
use ownerserve_ownership::raft::format::{Format, SnapshotFile};
use ownerserve_ownership::raft::log_store::LogStore;
use ownerserve_ownership::raft::state_machine::StateMachineStore;
use ownerserve_ownership::version::Version;
use ownerserve_ownership::{Command, Directory, Outcome};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/directory-v0.1.0"
);

/// A copy of the fixture as a node's data folder (opening a log labels it).
fn data_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ownerserve-v010-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        format!("{FIXTURE}/snapshot.json"),
        dir.join("snapshot.json"),
    )
    .unwrap();
    let mut log = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(format!("{FIXTURE}/log.redb.gz")).unwrap())
        .read_to_end(&mut log)
        .unwrap();
    std::fs::write(dir.join("log.redb"), log).unwrap();
    dir
}

fn session<'d>(d: &'d Directory, id: &str) -> &'d ownerserve_ownership::state::Session {
    d.sessions
        .get(&SessionId(id.into()))
        .unwrap_or_else(|| panic!("no session {id}"))
}

/// The sessions, owners, epochs, leases, prefixes, forks, pins, labels and stored
/// response `make.py` wrote before the snapshot, at the epochs 0.1.0 gave them.
fn check_snapshot_contents(d: &Directory) {
    assert_eq!(d.version, Version::FIRST, "0.1.0's state follows version 1");
    assert_eq!((d.applied, d.grace_ms), (4999, 500));
    let (w0, w1) = (LeaseId(8192), LeaseId(12288));
    assert_eq!(d.leases[&w0].worker, WorkerId(0));
    assert_eq!(d.leases[&w1].worker, WorkerId(1));
    assert_eq!(d.leases[&w0].keys.len(), 4);
    let owned = [
        ("agent-a", WorkerId(0), w0, 32768),
        ("agent-b", WorkerId(1), w1, 36864),
        ("agent-c", WorkerId(0), w0, 40960),
        ("agent-a-fork", WorkerId(1), w1, 49152),
    ];
    assert_eq!(d.sessions.len(), owned.len());
    for (id, worker, lease, epoch) in owned {
        let s = session(d, id);
        let owner = s.owner.expect("owned");
        assert_eq!(
            (owner.worker, owner.lease, owner.epoch, s.epoch),
            (worker, lease, Epoch(epoch), Epoch(epoch)),
            "{id}"
        );
    }
    assert_eq!(session(d, "agent-a").prefix, Some(PrefixKey(303)));
    assert_eq!(
        session(d, "agent-a-fork").parent,
        Some(SessionId("agent-a".into()))
    );
    assert!(session(d, "agent-b").pinned);
    assert_eq!(
        session(d, "agent-c").root,
        Some(SessionId("agent-a".into()))
    );
    let extended = d.artifacts.get(&PrefixKey(303)).expect("prefix 303");
    assert_eq!(extended.parent, Some(PrefixKey(101)));
    assert_eq!(extended.ref_count, 2);
    assert_eq!(extended.owner.map(|o| o.epoch), Some(Epoch(24576)));
    let copied = d.artifacts.get(&PrefixKey(101)).expect("prefix 101");
    assert!(copied
        .locations
        .iter()
        .any(|l| l.worker == WorkerId(1) && l.tier == Tier::Cpu));
    assert_eq!(d.stats.forks, 1);
    let response = d
        .responses
        .get("resp_fixture")
        .expect("the stored response");
    assert_eq!((response.worker, response.lost), (WorkerId(1), false));
    assert!(d.tenants.is_empty() && d.lapsed.is_empty());
}

#[test]
fn the_previous_release_s_snapshot_loads_with_its_sessions_owners_and_epochs() {
    let bytes = std::fs::read(format!("{FIXTURE}/snapshot.json")).unwrap();
    let file = SnapshotFile::parse(&bytes).unwrap();
    assert_eq!(file.format, Format::UNLABELLED);
    assert_eq!(file.meta.last_log_id.map(|l| l.index), Some(4999));
    let state = file.state().unwrap();
    check_snapshot_contents(&state.directory);
    assert_eq!(state.membership.voter_ids().collect::<Vec<_>>(), [1]);
    // Written again, it is labelled with this release's format and reads back the same.
    let rewritten = SnapshotFile::of(file.meta.clone(), &state).unwrap();
    let again = SnapshotFile::parse(&rewritten.to_bytes().unwrap()).unwrap();
    assert_eq!(again.format, Format::CURRENT);
    assert_eq!(again.state().unwrap().directory, state.directory);
}

#[tokio::test]
async fn a_node_upgraded_in_place_loads_the_snapshot_and_replays_the_log_after_it() {
    let dir = data_dir("node");
    let machine = StateMachineStore::open(Some(&dir), 500).unwrap();
    let mut snapshot = machine.read(|s| s.directory.clone());
    check_snapshot_contents(&snapshot);
    let mut log = LogStore::open(&dir.join("log.redb")).unwrap();
    let state = log.get_log_state().await.unwrap();
    let last = state.last_log_id.expect("a last entry").index;
    // openraft keeps up to 1000 entries before the snapshot: every one still decodes.
    let first = state.last_purged_log_id.map_or(1, |l| l.index + 1);
    let kept = log.try_get_log_entries(first..=last).await.unwrap();
    assert_eq!(kept.len() as u64, last - first + 1);
    assert!(kept.len() > 1000, "{} entries kept", kept.len());
    // The entries after the snapshot, applied as the node does on start: none refused;
    // agent-c ends, agent-d starts on worker 1 at its entry's epoch.
    let mut started = None;
    for entry in kept.iter().filter(|e| e.log_id.index > 4999) {
        let EntryPayload::Normal(env) = &entry.payload else {
            continue;
        };
        let outcome = snapshot.apply(entry.log_id.index, env);
        assert!(
            !matches!(outcome, Outcome::Rejected(_)),
            "entry {}: {:?} gave {outcome:?}",
            entry.log_id.index,
            env.command
        );
        if matches!(&env.command, Command::SetDecodeOwner { session, .. } if session.0 == "agent-d")
        {
            started = Some(entry.log_id.index);
        }
    }
    assert!(!snapshot.sessions.contains_key(&SessionId("agent-c".into())));
    let d = session(&snapshot, "agent-d").owner.expect("agent-d owned");
    let at = started.expect("agent-d's entry in the log");
    assert_eq!((d.worker, d.epoch), (WorkerId(1), Epoch::of(at, 0)));
    assert_eq!(
        session(&snapshot, "agent-a").owner.map(|o| o.epoch),
        Some(Epoch(32768))
    );
    // Opened once, the log is labelled with this release's format; it opens again.
    assert_eq!(log.format().unwrap(), Some(Format::CURRENT));
    drop(log);
    let mut reopened = LogStore::open(&dir.join("log.redb")).unwrap();
    assert_eq!(
        reopened
            .get_log_state()
            .await
            .unwrap()
            .last_log_id
            .map(|l| l.index),
        Some(last)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
