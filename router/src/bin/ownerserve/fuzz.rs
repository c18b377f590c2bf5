//! `ownerserve fuzz`: every parser that takes outside bytes, driven by
//! `ownerserve_bench::fuzz` (the mutation engine) with valid seeds and a dictionary per
//! target. Each target checks properties, not only the absence of panics:
//! - `openai`: a client body through the OpenAI parser of both endpoints;
//! - `kv-events`: an engine's ZMQ message (msgpack `EventBatch`) decoded and normalised;
//! - `sse-relay`: a worker's response body (scripted frames, maybe ending in an error)
//!   through the router's relay: the client gets exactly the worker's bytes, plus one
//!   error event and `[DONE]` on an SSE stream that broke;
//! - `worker-http`: a worker's HTTP/1.1 response, arriving in pieces, through the router's
//!   own reader (`upstream::http1::Received`): no body holds more bytes than came in, and
//!   every input ends framed or refused;
//! - `directory`: a Raft append (or a list of command envelopes) decoded and applied to the
//!   directory state machine, whose invariants must hold after every entry;
//! - `config`: a router TOML file (and `up`'s) parsed and validated.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::bail;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;

use ownerserve_bench::fuzz::{hex, run, Target, Verdict};
use ownerserve_eval::console::say;
use ownerserve_ownership::command::{ArtifactSpec, Command, Envelope};
use ownerserve_ownership::ids::{ClientId, Epoch, LeaseId, PrefixKey, SessionId, Tier};
use ownerserve_ownership::raft::TypeConfig;
use ownerserve_ownership::state::Directory;
use ownerserve_planner::ids::{EngineKind, Role, WorkerId};
use ownerserve_planner::policy::PrefillCharge;
use ownerserve_router::config::{worker_specs, RouterConfig, RouterFile, UpFile, WorkerSpec};
use ownerserve_router::error::ApiError;
use ownerserve_router::proxy::relay::{relay, Patience};
use ownerserve_router::registry::Registry;
use ownerserve_router::upstream::http1::{Piece, Received};
use ownerserve_shim::kv_events::normalize::normalize;
use ownerserve_shim::kv_events::wire::{decode_batch, decode_message};
use ownerserve_shim::openai::{self, Endpoint};

/// Flags of `ownerserve fuzz`.
#[derive(Debug, clap::Args)]
pub struct FuzzArgs {
    /// Targets to run (comma-separated): openai, kv-events, sse-relay, worker-http, directory, config.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "openai,kv-events,sse-relay,worker-http,directory,config"
    )]
    targets: Vec<String>,
    /// Inputs per target.
    #[arg(long, default_value_t = 1_000_000)]
    inputs: u64,
    /// Seed of the mutation engine (the same seed replays the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// Runs each target; fails if any panicked.
pub fn fuzz(args: &FuzzArgs) -> anyhow::Result<()> {
    let mut failed = Vec::new();
    say(&format!(
        "fuzz: {} inputs per target, seed {}",
        args.inputs, args.seed
    ));
    say("| target | executions | accepted | executions/s | panics |");
    say("|---|---:|---:|---:|---:|");
    for name in &args.targets {
        let mut target = target(name)?;
        let started = std::time::Instant::now();
        let report = run(&mut target, args.inputs, args.seed);
        say(&format!(
            "| {name} | {} | {} | {:.0} | {} |",
            report.executions,
            report.accepted,
            report.executions as f64 / started.elapsed().as_secs_f64(),
            report.panic_count
        ));
        for (msg, input) in &report.panics {
            say(&format!(
                "  panic in {name}: {msg}\n  input (hex): {}",
                hex(input)
            ));
        }
        if report.panic_count > 0 {
            failed.push(name.clone());
        }
    }
    if !failed.is_empty() {
        bail!("panics in {}", failed.join(", "));
    }
    Ok(())
}

/// Every target, in the order a run takes them.
const TARGETS: [&str; 6] = [
    "openai",
    "kv-events",
    "sse-relay",
    "worker-http",
    "directory",
    "config",
];

/// The target called `name`.
pub fn target(name: &str) -> anyhow::Result<Target> {
    Ok(match name {
        "openai" => openai_target(),
        "kv-events" => kv_events_target(),
        "sse-relay" => sse_relay_target()?,
        "worker-http" => worker_http_target(),
        "directory" => directory_target(),
        "config" => config_target(),
        other => {
            bail!("no fuzz target `{other}` ({})", TARGETS.join(", "))
        }
    })
}

fn tokens(words: &[&str]) -> Vec<Vec<u8>> {
    words.iter().map(|w| w.as_bytes().to_vec()).collect()
}

/// JSON tokens that reach the corners of a JSON parser and of what reads its values.
const JSON_TOKENS: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e400",
    "-0",
    "1.5",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "\"\"",
    "[]",
    "{}",
    "\"\\ud800\"",
    "\"\\u0000\"",
    "[[[[[[[[",
    "{\"a\":",
    ",",
    ":",
    "\"",
    "\\",
];

fn openai_target() -> Target {
    let seeds = [
        r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#,
        r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"data:x"}}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"stream":true,"n":2,"temperature":0.5,"user":"u","metadata":{"session_id":"s"}}"#,
        r#"{"model":"m","prompt":"once upon","max_tokens":16,"n":1,"stream":false}"#,
        r#"{"model":"m","prompt":[1,2,3,4],"max_tokens":1}"#,
        r#"{"model":"m","prompt":["a","b"],"n":3,"max_tokens":2,"kv_transfer_params":{"do_remote_prefill":true}}"#,
        r#"{"model":"m","prompt":[[1,2],[3]],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}"#,
        r#"{"model":"m","max_tokens":8,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]}]}],"tools":[{"name":"f","input_schema":{}}],"metadata":{"user_id":"{\"session_id\":\"s\"}"}}"#,
        r#"{"model":"m","instructions":"i","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"r"}],"tools":[{"type":"function","name":"f"}],"store":true,"previous_response_id":"resp_1","max_output_tokens":4}"#,
    ];
    let mut dictionary = tokens(JSON_TOKENS);
    dictionary.extend(tokens(&[
        "\"model\"",
        "\"messages\"",
        "\"prompt\"",
        "\"n\"",
        "\"max_tokens\"",
        "\"stream\"",
        "\"role\"",
        "\"content\"",
        "\"tools\"",
        "\"kv_transfer_params\"",
        "\"bootstrap_host\"",
        "\"metadata\"",
        "\"user\"",
        "\"tool_calls\"",
        "\"max_completion_tokens\"",
        "\"system\"",
        "\"input\"",
        "\"instructions\"",
        "\"tool_use\"",
        "\"tool_result\"",
        "\"function_call\"",
        "\"previous_response_id\"",
    ]));
    Target {
        name: "openai",
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        dictionary,
        run: Box::new(|input| {
            let mut verdict = Verdict::Refused;
            for endpoint in [
                Endpoint::ChatCompletions,
                Endpoint::Completions,
                Endpoint::Messages,
                Endpoint::Responses,
            ] {
                if let Ok(parsed) = openai::parse(input, endpoint) {
                    // What ingress reads of an accepted request.
                    let _ = (parsed.choices(), parsed.engine_control, &parsed.model);
                    verdict = Verdict::Accepted;
                }
            }
            verdict
        }),
    }
}

macro_rules! kv_fixture {
    ($name:literal) => {
        include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../workers-shim/tests/fixtures/kv_events/",
            $name,
            ".msgpack"
        ))
        .to_vec()
    };
}

fn kv_events_target() -> Target {
    let seeds = vec![
        kv_fixture!("vllm_array_stored"),
        kv_fixture!("vllm_array_removed_cleared"),
        kv_fixture!("vllm_array_stored_child_lora"),
        kv_fixture!("vllm_array_v09_stored"),
        kv_fixture!("vllm_array_v09_removed"),
        kv_fixture!("vllm_map_stored"),
        kv_fixture!("vllm_map_removed_cleared"),
        kv_fixture!("vllm_map_bytes_hashes"),
        kv_fixture!("vllm_map_stored_cpu_sliding"),
        kv_fixture!("vllm_map_stored_image_a"),
        kv_fixture!("vllm_outer_map_stored"),
        kv_fixture!("sglang_array_stored"),
        kv_fixture!("sglang_array_stored_salted"),
        kv_fixture!("sglang_array_removed_cleared"),
        kv_fixture!("sglang_map_stored"),
        kv_fixture!("sglang_map_removed_cleared"),
    ];
    // msgpack type bytes and lengths that stress a decoder.
    let dictionary = vec![
        vec![0xdd, 0xff, 0xff, 0xff, 0xff],
        vec![0xdf, 0x7f, 0xff, 0xff, 0xff],
        vec![0xdb, 0xff, 0xff, 0xff, 0xff],
        vec![0xc6, 0xff, 0xff, 0xff, 0xff],
        vec![0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        vec![0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],
        vec![0x9f],
        vec![0x8f],
        vec![0xc0],
        vec![0xc1],
        b"\xacBlockStored".to_vec(),
        b"\xadBlockRemoved".to_vec(),
        b"\xb0AllBlocksCleared".to_vec(),
        b"\xaablock_size".to_vec(),
    ];
    Target {
        name: "kv-events",
        seeds,
        dictionary,
        run: Box::new(|input| {
            let Ok(batch) = decode_batch(input) else {
                return Verdict::Refused;
            };
            // The whole message as the subscriber gets it, too.
            let seq = 7u64.to_be_bytes();
            let msg = decode_message(&[&b"kv-events"[..], &seq[..], input])
                .expect("a batch that decodes alone decodes in its message");
            assert_eq!(msg.seq, 7);
            for ev in batch.events {
                for block_size in [16, 32] {
                    let _ = normalize(ev.clone(), block_size);
                }
            }
            Verdict::Accepted
        }),
    }
}

/// A worker body of scripted frames: data, then maybe an error.
struct Scripted(VecDeque<Result<Bytes, std::io::Error>>);

impl http_body::Body for Scripted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|r| r.map(Frame::data)))
    }
}

/// Reads a relay script: byte 0's bit 0 = an SSE response, bit 1 = the worker fails after
/// its frames; then frames, each a length byte and that many bytes.
fn script(input: &[u8]) -> (bool, bool, Vec<Bytes>) {
    let flags = input.first().copied().unwrap_or(0);
    let mut frames = Vec::new();
    let mut rest = input.get(1..).unwrap_or_default();
    while let Some((&n, tail)) = rest.split_first() {
        let n = usize::from(n).min(tail.len());
        frames.push(Bytes::copy_from_slice(&tail[..n]));
        rest = &tail[n..];
    }
    (flags & 1 == 1, flags & 2 == 2, frames)
}

fn sse_relay_target() -> anyhow::Result<Target> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let registry = Registry::new(vec![WorkerSpec::new(
        "w0",
        "http://127.0.0.1:9",
        Role::Hybrid,
        EngineKind::Vllm,
    )]);
    let worker = registry
        .get(WorkerId(0))
        .ok_or_else(|| anyhow::anyhow!("no worker"))?;
    let patience = Patience {
        first: Duration::from_secs(60),
        idle: Duration::from_secs(60),
        failure_threshold: 1_000_000,
    };
    let broken = ApiError::UpstreamUnreachable {
        worker: "w0".into(),
    }
    .sse_event();
    let sse_seed = |fail: bool| {
        let mut s = vec![u8::from(fail) << 1 | 1];
        for chunk in [
            &b"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"[..],
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n",
            b"data: [DONE]\n\n",
        ] {
            s.push(chunk.len() as u8);
            s.extend_from_slice(chunk);
        }
        s
    };
    Ok(Target {
        name: "sse-relay",
        seeds: vec![
            sse_seed(false),
            sse_seed(true),
            vec![0, 2, b'{', b'}'],
            vec![2, 1, b'{'],
        ],
        dictionary: tokens(&[
            "data: ",
            "\n\n",
            "\r\n",
            "[DONE]",
            ": keep-alive\n",
            "event: error\n",
            "\u{0}",
        ]),
        run: Box::new(move |input| {
            let (sse, fail, frames) = script(input);
            let sent: Vec<u8> = frames.iter().flat_map(|f| f.iter().copied()).collect();
            let mut body: VecDeque<_> = frames.into_iter().map(Ok).collect();
            if fail {
                body.push_back(Err(std::io::Error::other("worker died")));
            }
            let mut resp = http::Response::new(Scripted(body));
            if sse {
                resp.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static("text/event-stream"),
                );
            }
            let in_flight = worker.start_request(1, PrefillCharge::computed(1), 1);
            let got = runtime.block_on(async {
                let relayed = relay(
                    resp,
                    &worker,
                    in_flight,
                    None,
                    None,
                    patience,
                    Endpoint::ChatCompletions,
                );
                relayed.into_body().collect().await
            });
            match (fail, sse, got) {
                (false, _, Ok(c)) => assert_eq!(c.to_bytes(), sent, "bytes relayed as sent"),
                (true, true, Ok(c)) => {
                    let mut want = sent;
                    want.extend_from_slice(&broken);
                    assert_eq!(
                        c.to_bytes(),
                        want,
                        "a broken SSE stream ends with one error event"
                    );
                }
                (true, false, Err(_)) => {}
                (fail, sse, got) => {
                    panic!("fail {fail}, sse {sse}: {:?}", got.map(|c| c.to_bytes()))
                }
            }
            assert_eq!(worker.in_flight(), 0, "the relay released the worker");
            Verdict::Accepted
        }),
    })
}

/// A worker's response as read from its socket: the input's first byte sets the size of
/// the pieces the rest arrives in (1–31 bytes), the rest is the bytes. Accepted when the
/// head parses and the body ends by its framing (or at the input's end, for a body that
/// runs until close).
fn worker_http_target() -> Target {
    let seeds: [&[u8]; 5] = [
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\nf\r\ndata: {\"a\":1}\n\n\r\ne;x=1\r\ndata: [DONE]\n\n\r\n0\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\n\r\nuntil the worker closes",
        b"HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n",
    ];
    let dictionary = tokens(&[
        "\r\n",
        "HTTP/1.1 ",
        "HTTP/1.0 ",
        "content-length: ",
        "transfer-encoding: chunked",
        "transfer-encoding: gzip, chunked",
        "connection: close",
        "0\r\n\r\n",
        "ffffffffffffffff",
        ";ext=1",
        "100 Continue\r\n\r\n",
        "101 Switching Protocols",
    ]);
    Target {
        name: "worker-http",
        seeds: seeds.iter().map(|s| [&[7u8][..], s].concat()).collect(),
        dictionary,
        run: Box::new(|input| {
            let Some((split, bytes)) = input.split_first() else {
                return Verdict::Refused;
            };
            let mut pieces = bytes.chunks(usize::from(split % 31) + 1);
            let mut received = Received::default();
            let mut framing = None;
            let mut body = 0usize;
            loop {
                let progressed = match framing.as_mut() {
                    None => match received.head(&axum::http::Method::POST) {
                        Err(_) => return Verdict::Refused,
                        Ok(Some((_, f))) => {
                            framing = Some(f);
                            true
                        }
                        Ok(None) => false,
                    },
                    Some(f) => match received.piece(f) {
                        Err(_) => return Verdict::Refused,
                        Ok(Piece::Data(d)) => {
                            assert!(!d.is_empty(), "an empty piece of body");
                            body += d.len();
                            assert!(body <= bytes.len(), "more body than bytes read");
                            true
                        }
                        Ok(Piece::End) => return Verdict::Accepted,
                        Ok(Piece::NeedMore) => false,
                    },
                };
                if !progressed {
                    let Some(piece) = pieces.next() else {
                        // The worker closed: only a body that runs until close ends well.
                        return match framing {
                            Some(f) if f.runs_until_close() => Verdict::Accepted,
                            _ => Verdict::Refused,
                        };
                    };
                    received.push(piece);
                }
            }
        }),
    }
}

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

fn directory_target() -> Target {
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

fn config_target() -> Target {
    let seeds = [
        include_str!("../../../../configs/router.example.toml"),
        include_str!("../../../../configs/up.toml"),
        "[router]\npolicy = \"kv_aware\"\nport = 0\n[[workers]]\nurl = \"http://127.0.0.1:8000\"\nrole = \"decode\"\n",
    ];
    let mut dictionary = tokens(&[
        "[router]",
        "[[workers]]",
        "[sim]",
        "[[fleet]]",
        " = ",
        "\"\"",
        "0",
        "-1",
        "1e400",
        "nan",
        "inf",
        "18446744073709551616",
        "true",
        "[]",
        "{}",
        "\"\\u0000\"",
        "policy",
        "max_connections",
        "rate_limit_per_s",
        "kv_block_size",
        "url",
        "role",
        "engine",
        "directory",
        "\"remote\"",
        "\n",
    ]);
    dictionary.extend(tokens(JSON_TOKENS));
    Target {
        name: "config",
        seeds: seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        dictionary,
        run: Box::new(|input| {
            let Ok(text) = std::str::from_utf8(input) else {
                return Verdict::Refused;
            };
            let mut verdict = Verdict::Refused;
            if let Ok(file) = toml::from_str::<RouterFile>(text) {
                if let Ok(specs) = worker_specs(&file.workers) {
                    let _ = RouterConfig::validate(&file.router, specs);
                }
                verdict = Verdict::Accepted;
            }
            if let Ok(file) = toml::from_str::<UpFile>(text) {
                let _ = file.sim.build();
                verdict = Verdict::Accepted;
            }
            verdict
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The short run CI makes: every target, 20,000 inputs each, no panic.
    #[test]
    fn every_target_survives_a_short_run() {
        for name in TARGETS {
            let mut t = target(name).unwrap();
            let r = run(&mut t, 20_000, 1);
            assert_eq!(
                r.panic_count,
                0,
                "{name}: {:?}",
                r.panics.first().map(|(m, i)| (m, hex(i)))
            );
            assert!(
                r.accepted > 0,
                "{name}: no input was accepted, the seeds are wrong"
            );
        }
    }

    #[test]
    fn every_seed_is_accepted() {
        for name in TARGETS {
            let mut t = target(name).unwrap();
            let seeds = t.seeds.clone();
            for (i, s) in seeds.iter().enumerate() {
                assert_eq!((t.run)(s), Verdict::Accepted, "{name} seed {i}");
            }
        }
    }
}
