//! Backups of the directory: `ownerserve ctl directory backup` of a running 3-node cluster
//! (through a follower: the read goes to the leader), `ctl directory restore` into the
//! data folders of a new cluster on other ports, which then starts from them with the
//! sessions, owners and epochs of the backup, and takes new writes at newer epochs.
#![allow(clippy::unwrap_used, reason = "test: a failure should panic")]

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::linearizable::{directory_state, http, leader_index, write};
use crate::common::{ownerserve_exe, DirectoryNodes, ADMIN_TOKEN, READ_TOKEN};

/// Runs `ownerserve ctl <args>`; its standard output, or a panic with its error.
fn ctl(args: &[&str]) -> String {
    let out = std::process::Command::new(ownerserve_exe())
        .arg("ctl")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "ctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn claim(session: &str, lease: u64) -> Value {
    json!({"SetDecodeOwner": {"session": session, "lease": lease, "prefix": null,
        "tail_tokens": 10, "predicted_tool_gap_ms": null, "expect_epoch": null}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_restored_into_a_new_cluster_has_its_sessions_owners_and_epochs() {
    let old = DirectoryNodes::start(3, "backup-from", &[]);
    let (c, urls) = (http(), old.urls());
    let mut seq = 0;
    let mut next = || {
        seq += 1;
        seq
    };
    let mut leases = Vec::new();
    for worker in 0..2 {
        let out = write(
            &c,
            &urls,
            1,
            next(),
            json!({"GrantLease": {"worker": worker, "ttl_ms": 60_000}}),
        )
        .await
        .unwrap();
        leases.push(out["LeaseGranted"]["lease"].as_u64().unwrap());
    }
    let mut acked: BTreeMap<String, (u32, u64)> = BTreeMap::new();
    for s in 0..20u32 {
        let session = format!("backed-up-{s}");
        let out = write(
            &c,
            &urls,
            1,
            next(),
            claim(&session, leases[s as usize % 2]),
        )
        .await
        .unwrap();
        let epoch = out["Owned"]["epoch"].as_u64().unwrap();
        acked.insert(session, (s % 2, epoch));
    }
    let parent_epoch = acked["backed-up-0"].1;
    let fork = json!({"Fork": {"parent": "backed-up-0", "child": "backed-up-0-fork",
        "lease": leases[1], "parent_epoch": parent_epoch}});
    let out = write(&c, &urls, 1, next(), fork).await.unwrap();
    acked.insert(
        "backed-up-0-fork".into(),
        (1, out["Owned"]["epoch"].as_u64().unwrap()),
    );
    // A backup needs the admin token, not the read token.
    let leader = leader_index(&c, &urls).await.unwrap();
    let refused = reqwest::Client::new()
        .get(format!("{}/admin/v1/snapshot", urls[leader]))
        .bearer_auth(READ_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    // Through a follower, which forwards the read to the leader.
    let follower = &urls[(leader + 1) % urls.len()];
    let file = std::env::temp_dir().join(format!("ownerserve-backup-{}.json", std::process::id()));
    let file = file.to_str().unwrap().to_owned();
    let said = ctl(&[
        "--url",
        follower,
        "--token",
        ADMIN_TOKEN,
        "directory",
        "backup",
        &file,
    ]);
    assert!(said.contains("21 sessions, 2 leases"), "{said}");
    // Not in the backup: a write after it.
    write(&c, &urls, 1, next(), claim("after-the-backup", leases[0]))
        .await
        .unwrap();
    drop(old);
    // A new cluster on other ports, every node restored from the backup, none initialised.
    let mut new = DirectoryNodes::planned(3, "backup-to", &[], "127.0.0.1");
    let peers = new.peers().join(",");
    for i in 1..=3 {
        let dir = new.data_dir(i);
        let said = ctl(&[
            "directory",
            "restore",
            &file,
            "--data-dir",
            dir.to_str().unwrap(),
            "--peer",
            &peers,
        ]);
        assert!(said.contains("21 sessions"), "{said}");
    }
    new.start_all();
    let d = directory_state(&c, &new.urls()).await.unwrap();
    let restored: BTreeMap<String, (u32, u64)> = d
        .sessions
        .iter()
        .map(|(id, s)| {
            let owner = s.owner.unwrap_or_else(|| panic!("{} lost its owner", id.0));
            (id.0.clone(), (owner.worker.0, s.epoch.0))
        })
        .collect();
    assert_eq!(restored, acked);
    assert_eq!(
        d.sessions[&ownerserve_ownership::ids::SessionId("backed-up-0-fork".into())]
            .parent
            .as_ref()
            .map(|p| p.0.as_str()),
        Some("backed-up-0")
    );
    // The restored leases live on (one TTL from the restore): a new session claimed under
    // one gets an epoch newer than every restored one.
    let out = write(&c, &new.urls(), 2, 1, claim("after-the-restore", leases[0]))
        .await
        .unwrap();
    let newest = acked.values().map(|(_, e)| *e).max().unwrap();
    assert!(
        out["Owned"]["epoch"].as_u64().unwrap() > newest,
        "{out} after {newest}"
    );
    // The new cluster runs this release's directory version.
    let current = ownerserve_ownership::version::Version::CURRENT.0;
    crate::common::eventually(
        Duration::from_secs(10),
        "this release's directory version",
        || {
            let (c, url) = (c.clone(), new.url(1));
            async move {
                let v: Value = match c.get(format!("{url}/directory/v1/cluster")).send().await {
                    Ok(r) => r.json().await.unwrap_or_default(),
                    Err(_) => return false,
                };
                v["version"]["runs"] == current
            }
        },
    )
    .await;
    std::fs::remove_file(&file).unwrap();
}
