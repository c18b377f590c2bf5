//! The dispatch legs against a fake engine: what each engine protocol sends, and that
//! every failed leg falls back to the decode worker recomputing.

use std::sync::Mutex;

use axum::http::StatusCode;
use serde_json::json;

use ownerserve_planner::ids::{EngineKind, Role};

use super::*;
use crate::config::WorkerSpec;
use crate::upstream::{BoxFuture, SmallAnswer};

/// One call the fake engine received.
#[derive(Debug, Clone)]
struct Call {
    url: String,
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    body: Value,
}

/// Answers every call with `answer` and records it.
struct FakeEngine {
    answer: Result<(u16, Value), ()>,
    calls: Mutex<Vec<Call>>,
}

impl FakeEngine {
    fn answering(status: u16, body: Value) -> Arc<Self> {
        Arc::new(Self {
            answer: Ok((status, body)),
            calls: Mutex::default(),
        })
    }

    fn refusing_connections() -> Arc<Self> {
        Arc::new(Self {
            answer: Err(()),
            calls: Mutex::default(),
        })
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

impl EngineCalls for FakeEngine {
    fn post<'a>(
        &'a self,
        base_url: &'a str,
        path: &'a str,
        headers: &'a [(HeaderName, HeaderValue)],
        body: Bytes,
    ) -> BoxFuture<'a, Result<SmallAnswer, ForwardError>> {
        self.calls.lock().unwrap().push(Call {
            url: base_url.to_owned(),
            path: path.to_owned(),
            headers: headers.to_vec(),
            body: serde_json::from_slice(&body).unwrap(),
        });
        let answer = match &self.answer {
            Ok((status, v)) => Ok((
                StatusCode::from_u16(*status).unwrap(),
                Bytes::from(v.to_string()),
            )),
            Err(()) => Err(ForwardError::Connect),
        };
        Box::pin(async move { answer })
    }
}

/// A prefill and a decode worker of `engine`s (ids 0 and 1).
fn fleet(prefill: EngineKind, decode: EngineKind) -> Registry {
    Registry::new(vec![
        WorkerSpec::new("p", "http://10.0.0.1:8001", Role::Prefill, prefill),
        WorkerSpec::new("d", "http://10.0.0.2:8002", Role::Decode, decode),
    ])
}

const CLIENT_BODY: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":50}"#;

struct Case {
    registry: Registry,
    engine: Arc<FakeEngine>,
    tasks: TaskTracker,
    body: Bytes,
    lookup: Lookup,
    hashes: Vec<u64>,
    priority: i8,
}

impl Case {
    fn new(registry: Registry, engine: Arc<FakeEngine>) -> Self {
        Self {
            registry,
            engine,
            tasks: TaskTracker::new(),
            body: Bytes::from_static(CLIENT_BODY.as_bytes()),
            lookup: Lookup::default(),
            hashes: vec![11, 12, 13, 14],
            priority: 0,
        }
    }

    async fn prepare(&self, dispatch: Dispatch) -> Prepared {
        let engines: Arc<dyn EngineCalls> = self.engine.clone();
        let dispatcher = Dispatcher {
            engines: &engines,
            registry: &self.registry,
            directory: None,
            tasks: &self.tasks,
        };
        let step = Step {
            path: "/v1/chat/completions",
            body: &self.body,
            session: Some("s1"),
            fork_fence: None,
            lookup: &self.lookup,
            hashes: &self.hashes,
            block: 16,
            prompt_tokens: self.hashes.len() as u64 * 16 + 5,
            request_id: HeaderValue::from_static("req-1"),
            authorization: Some(HeaderValue::from_static("Bearer client")),
            priority: self.priority,
        };
        let decision = Decision {
            worker: WorkerId(1),
            dispatch,
            plan: None,
        };
        let decode = self.registry.get(WorkerId(1)).unwrap().clone();
        dispatcher.prepare(&step, &decision, &decode).await
    }
}

fn header<'a>(headers: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.to_str().ok())
}

#[tokio::test]
async fn nixl_prefills_one_token_then_hands_the_returned_params_to_the_decode_leg() {
    let params =
        json!({"do_remote_prefill": true, "remote_block_ids": [[1, 2]], "remote_engine_id": "p"});
    let case = Case::new(
        fleet(EngineKind::Vllm, EngineKind::Vllm),
        FakeEngine::answering(200, json!({"choices": [], "kv_transfer_params": params})),
    );
    let prepared = case
        .prepare(Dispatch::Disaggregated {
            prefill: WorkerId(0),
        })
        .await;
    let calls = case.engine.calls();
    assert_eq!(calls.len(), 1);
    let leg = &calls[0];
    assert_eq!(
        (leg.url.as_str(), leg.path.as_str()),
        ("http://10.0.0.1:8001", "/v1/chat/completions")
    );
    assert_eq!(leg.body["max_tokens"], 1);
    assert_eq!(leg.body["stream"], false);
    assert_eq!(leg.body["kv_transfer_params"]["do_remote_decode"], true);
    assert_eq!(header(&leg.headers, "x-request-id"), Some("req-1"));
    assert_eq!(header(&leg.headers, "authorization"), Some("Bearer client"));
    assert!(!prepared.fell_back);
    let decode: Value = serde_json::from_slice(&prepared.body).unwrap();
    assert_eq!(decode["kv_transfer_params"], params);
    assert_eq!(decode["stream"], true);
    assert_eq!(decode["max_tokens"], 50);
}

#[tokio::test]
async fn every_step_carries_its_class_rank_in_each_engines_own_priority_header() {
    use crate::proxy::admission::Class;
    let params = json!({"do_remote_prefill": true, "remote_engine_id": "p"});
    let returning = Class::Interactive.engine_rank(true);
    let batch = Class::Batch.engine_rank(false);
    for (kind, name, values) in [
        (EngineKind::Vllm, "x-vllm-priority", ["0", "-1", "2"]),
        (EngineKind::Sim, "x-vllm-priority", ["0", "-1", "2"]),
        (EngineKind::Sglang, "x-override-priority", ["0", "1", "-2"]),
    ] {
        let answer = json!({"choices": [], "kv_transfer_params": params});
        let mut case = Case::new(
            fleet(kind, kind),
            FakeEngine::answering(200, answer.clone()),
        );
        // A new interactive prompt is marked too: the client's body `priority` never
        // reaches the engine's queue.
        for (rank, value) in [0, returning, batch].into_iter().zip(values) {
            case.priority = rank;
            let step = case.prepare(Dispatch::Single).await;
            assert_eq!(header(&step.headers, name), Some(value), "{kind:?} {rank}");
        }
        if kind != EngineKind::Sglang {
            let case = Case {
                priority: returning,
                ..Case::new(fleet(kind, kind), FakeEngine::answering(200, answer))
            };
            case.prepare(Dispatch::Disaggregated {
                prefill: WorkerId(0),
            })
            .await;
            let leg = &case.engine.calls()[0];
            assert_eq!(
                header(&leg.headers, name),
                Some(values[1]),
                "its prefill leg too"
            );
        }
    }
}

#[tokio::test]
async fn a_failed_or_refused_prefill_leg_falls_back_to_the_client_body() {
    for engine in [
        FakeEngine::answering(500, json!({"error": "boom"})),
        FakeEngine::answering(200, json!({"choices": []})),
        FakeEngine::refusing_connections(),
    ] {
        let case = Case::new(fleet(EngineKind::Vllm, EngineKind::Vllm), engine);
        let prepared = case
            .prepare(Dispatch::Disaggregated {
                prefill: WorkerId(0),
            })
            .await;
        assert!(prepared.fell_back);
        assert_eq!(prepared.body, case.body);
        assert!(prepared.prefill.is_none() && prepared.concurrent_prefill.is_none());
    }
    // A refused connection also marks the prefill worker down.
    let case = Case::new(
        fleet(EngineKind::Vllm, EngineKind::Vllm),
        FakeEngine::refusing_connections(),
    );
    case.registry
        .get(WorkerId(0))
        .unwrap()
        .mark_healthy(vec!["m".into()]);
    case.prepare(Dispatch::Disaggregated {
        prefill: WorkerId(0),
    })
    .await;
    assert!(!case.registry.get(WorkerId(0)).unwrap().is_healthy());
}

#[tokio::test]
async fn sglang_pairs_send_nothing_early_and_give_both_legs_one_bootstrap_body() {
    let case = Case::new(
        fleet(EngineKind::Sglang, EngineKind::Sglang),
        FakeEngine::answering(200, json!({})),
    );
    let prepared = case
        .prepare(Dispatch::Disaggregated {
            prefill: WorkerId(0),
        })
        .await;
    assert!(case.engine.calls().is_empty());
    let (p, p_body) = prepared.concurrent_prefill.as_ref().unwrap();
    assert_eq!(p.id, WorkerId(0));
    assert_eq!(p_body, &prepared.body);
    let body: Value = serde_json::from_slice(&prepared.body).unwrap();
    assert_eq!(body["bootstrap_host"], "10.0.0.1");
    assert!(body["bootstrap_room"].as_u64().unwrap() <= i64::MAX as u64);
    // Mixed engines have no P/D protocol: the decode worker runs it whole.
    let case = Case::new(
        fleet(EngineKind::Sglang, EngineKind::Vllm),
        FakeEngine::answering(200, json!({})),
    );
    let prepared = case
        .prepare(Dispatch::Disaggregated {
            prefill: WorkerId(0),
        })
        .await;
    assert!(prepared.fell_back && prepared.concurrent_prefill.is_none());
}

#[tokio::test]
async fn a_fetch_pulls_from_a_sim_source_and_other_engines_recompute() {
    let case = Case::new(
        fleet(EngineKind::Sim, EngineKind::Sim),
        FakeEngine::answering(200, json!({})),
    );
    let prepared = case
        .prepare(Dispatch::Fetch {
            source: WorkerId(0),
            tokens: 32,
        })
        .await;
    assert!(!prepared.fell_back);
    let body: Value = serde_json::from_slice(&prepared.body).unwrap();
    let params = &body["kv_transfer_params"];
    assert_eq!(
        (
            params["remote_host"].as_str(),
            params["remote_port"].as_u64()
        ),
        (Some("10.0.0.1"), Some(8001))
    );
    assert_eq!(params["remote_num_tokens"], 32);
    let case = Case::new(
        fleet(EngineKind::Vllm, EngineKind::Sim),
        FakeEngine::answering(200, json!({})),
    );
    let prepared = case
        .prepare(Dispatch::Fetch {
            source: WorkerId(0),
            tokens: 32,
        })
        .await;
    assert!(prepared.fell_back);
    assert_eq!(prepared.body, case.body);
}

#[tokio::test]
async fn a_migration_copies_first_and_without_a_directory_flip_recomputes() {
    let copied = json!({"blocks": 2, "bytes": 4096, "transfer_ms": 1.0, "cached_blocks": 2});
    let mut case = Case::new(
        fleet(EngineKind::Sim, EngineKind::Sim),
        FakeEngine::answering(200, copied),
    );
    case.lookup.epoch = Some(Epoch(7));
    let prepared = case
        .prepare(Dispatch::Migrate {
            source: WorkerId(0),
            tokens: 32,
        })
        .await;
    let calls = case.engine.calls();
    assert_eq!(calls.len(), 1, "the copy, and no drop without a flip");
    assert_eq!(
        (calls[0].url.as_str(), calls[0].path.as_str()),
        ("http://10.0.0.2:8002", engines::sim::FETCH_PATH)
    );
    let fetch: engines::sim::FetchRequest = serde_json::from_value(calls[0].body.clone()).unwrap();
    assert_eq!(fetch.block_hashes, [11, 12]);
    assert_eq!(
        (fetch.session.as_deref(), fetch.epoch),
        (Some("s1"), Some(7))
    );
    assert_eq!(
        (fetch.remote_host.as_str(), fetch.remote_port),
        ("10.0.0.1", 8001)
    );
    assert_eq!(prepared.migrated_bytes, Some(4096));
    assert!(prepared.fell_back);
    // Epoch 7 belongs to the source: without a flip the target runs the step unrecorded.
    assert_eq!(prepared.epoch, None);
    assert_eq!(header(&prepared.headers, "x-ownerserve-epoch"), None);
}

#[tokio::test]
async fn a_step_is_fenced_by_its_sessions_epoch_only_on_that_epochs_owner() {
    let mut case = Case::new(
        fleet(EngineKind::Sim, EngineKind::Sim),
        FakeEngine::answering(200, json!({})),
    );
    case.lookup.epoch = Some(Epoch(7));
    case.lookup.owner = Some(WorkerId(1));
    let on_owner = case.prepare(Dispatch::Single).await;
    assert_eq!(on_owner.epoch, Some(Epoch(7)));
    assert_eq!(header(&on_owner.headers, "x-ownerserve-epoch"), Some("7"));
    assert_eq!(
        header(&on_owner.headers, "x-ownerserve-session"),
        Some("s1")
    );
    // Planned off its owner, the claim not committed (a directory electing a leader): the
    // step runs unrecorded rather than under worker 0's epoch on worker 1.
    case.lookup.owner = Some(WorkerId(0));
    let elsewhere = case.prepare(Dispatch::Single).await;
    assert_eq!(elsewhere.epoch, None);
    assert_eq!(header(&elsewhere.headers, "x-ownerserve-epoch"), None);
    assert_eq!(header(&elsewhere.headers, "x-ownerserve-session"), None);
}
