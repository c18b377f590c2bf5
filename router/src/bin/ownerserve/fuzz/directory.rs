//! `directory`: a Raft append (or a list of command envelopes) decoded and applied to the
//! directory state machine, whose invariants must hold after every entry.

use ownerserve_bench::fuzz::{Target, Verdict};
use ownerserve_ownership::command::{ArtifactSpec, Command, Envelope};
use ownerserve_ownership::ids::{ClientId, Epoch, LeaseId, PrefixKey, SessionId, Tier};
use ownerserve_ownership::raft::TypeConfig;
use ownerserve_ownership::state::Directory;
use ownerserve_planner::ids::WorkerId;

use super::{tokens, JSON_TOKENS};

fn envelopes() -> Vec<Envelope> {
    let env = |now_ms, client: Option<(u64, u64)>, command| Envelope {
        now_ms,
        client: client.map(|(c, s)| (ClientId(c), s)),
        command,
    };
    let spec = ArtifactSpec {
        parent: None,
        blocks: (0, 4),
        kv_type: "gqa-bf16".into(),
        size_bytes: 1 << 20,
        checkpoints: Vec::new(),
    };
    let session = |s: &str| SessionId(s.into());
    vec![
        env(
            1_000,
            None,
            Command::GrantLease {
                worker: WorkerId(0),
                ttl_ms: 10_000,
            },
        ),
        env(
            1_001,
            None,
            Command::GrantLease {
                worker: WorkerId(1),
                ttl_ms: 10_000,
            },
        ),
        env(
            1_002,
            Some((1, 1)),
            Command::Claim {
                key: PrefixKey(42),
                lease: LeaseId(1),
                spec: spec.clone(),
                expect_epoch: None,
            },
        ),
        env(
            1_003,
            None,
            Command::Extend {
                key: PrefixKey(43),
                spec: ArtifactSpec {
                    parent: Some(PrefixKey(42)),
                    blocks: (4, 8),
                    ..spec
                },
                parent_epoch: Epoch(1),
            },
        ),
        env(
            1_004,
            None,
            Command::SetDecodeOwner {
                session: session("s"),
                lease: LeaseId(1),
                prefix: Some(PrefixKey(42)),
                tail_tokens: 10,
                predicted_tool_gap_ms: Some(500),
                expect_epoch: None,
            },
        ),
        env(
            1_005,
            None,
            Command::Fork {
                parent: session("s"),
                child: session("t"),
                lease: LeaseId(2),
                parent_epoch: Epoch(1),
            },
        ),
        env(
            1_006,
            None,
            Command::ReplicateReadOnly {
                key: PrefixKey(42),
                worker: WorkerId(1),
                tier: Tier::Cpu,
            },
        ),
        env(
            1_007,
            None,
            Command::Migrate {
                key: PrefixKey(42),
                from_epoch: Epoch(1),
                to_lease: LeaseId(2),
            },
        ),
        env(
            1_008,
            None,
            Command::PinSession {
                session: session("s"),
                epoch: Epoch(1),
                pinned: true,
            },
        ),
        env(5_000, None, Command::KeepAlive { lease: LeaseId(1) }),
        env(
            9_000,
            None,
            Command::DemoteSession {
                session: session("t"),
                epoch: Epoch(1),
                idle_ms: Some(2_000),
            },
        ),
        env(12_000, None, Command::Tick),
        env(
            12_001,
            None,
            Command::Batch {
                commands: vec![
                    Command::EndSession {
                        session: session("s"),
                        epoch: Epoch(1),
                    },
                    Command::Release {
                        key: PrefixKey(43),
                        epoch: Epoch(1),
                    },
                ],
            },
        ),
        env(
            12_001,
            None,
            Command::ForgetArtifact {
                key: PrefixKey(43),
                epoch: Epoch(1),
                idle_ms: 1_000,
            },
        ),
        env(
            12_002,
            Some((1, 2)),
            Command::RevokeLease { lease: LeaseId(2) },
        ),
        env(
            12_003,
            None,
            Command::RecordResponse {
                id: "resp_1".into(),
                lease: LeaseId(1),
                ttl_ms: 3_000,
            },
        ),
        env(
            12_004,
            None,
            Command::LabelSession {
                session: session("t"),
                root: Some(session("s")),
                parent: Some(session("s")),
            },
        ),
    ]
}

/// The directory's state after `entries`, its invariants checked after each.
fn apply_checked(entries: impl IntoIterator<Item = Envelope>) {
    let mut d = Directory::new(5_000);
    for (i, env) in entries.into_iter().enumerate() {
        let _ = d.apply(i as u64 + 1, &env);
        let broken = ownerserve_ownership::invariants::check(&d);
        assert!(
            broken.is_empty(),
            "after {:?}: {broken:?}",
            env.command.name()
        );
    }
}

pub(super) fn target() -> Target {
    let envs = envelopes();
    let append = serde_json::json!({
        "vote": {"leader_id": {"term": 1, "node_id": 1}, "committed": true},
        "prev_log_id": null,
        "leader_commit": null,
        "entries": envs.iter().enumerate().map(|(i, e)| serde_json::json!({
            "log_id": {"leader_id": {"term": 1, "node_id": 1}, "index": i + 1},
            "payload": {"Normal": e},
        })).collect::<Vec<_>>(),
    });
    let mut seeds = vec![
        serde_json::to_vec(&envs).unwrap_or_default(),
        serde_json::to_vec(&append).unwrap_or_default(),
    ];
    for e in &envs {
        seeds.push(serde_json::to_vec(&vec![e.clone()]).unwrap_or_default());
    }
    let mut dictionary = tokens(JSON_TOKENS);
    dictionary.extend(tokens(&[
        "\"Batch\"",
        "\"commands\"",
        "\"Tick\"",
        "\"Fork\"",
        "\"Claim\"",
        "\"Migrate\"",
        "\"ForgetArtifact\"",
        "\"idle_ms\"",
        "\"lease\"",
        "\"epoch\"",
        "\"session\"",
        "\"key\"",
        "\"Normal\"",
        "\"Membership\"",
        "\"Blank\"",
        "\"now_ms\"",
        "\"client\"",
    ]));
    Target {
        name: "directory",
        seeds,
        dictionary,
        run: Box::new(|input| {
            type Append = openraft::raft::AppendEntriesRequest<TypeConfig>;
            if let Ok(req) = serde_json::from_slice::<Append>(input) {
                apply_checked(req.entries.into_iter().filter_map(|e| match e.payload {
                    openraft::EntryPayload::Normal(env) => Some(env),
                    _ => None,
                }));
                return Verdict::Accepted;
            }
            if let Ok(envs) = serde_json::from_slice::<Vec<Envelope>>(input) {
                apply_checked(envs);
                return Verdict::Accepted;
            }
            Verdict::Refused
        }),
    }
}
