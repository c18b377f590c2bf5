//! The contract every engine protocol meets, checked over [`EngineKind::ALL`]: a new
//! engine's file passes these before anything else in the router uses it.

use std::collections::HashSet;

use ownerserve_planner::ids::EngineKind;
use serde_json::{json, Value};

use super::{protocol, sglang, vllm, CapacityGauge, EngineProtocol, Pairing, StepBudgetSource};
use crate::load_metrics::{kv_capacity_tokens, parse_load};
use crate::openai::request::{parse, Endpoint};
use crate::sim::kv_transfer::{KvTransferParams, KvTransferParamsOut};

fn every() -> impl Iterator<Item = (EngineKind, &'static dyn EngineProtocol)> {
    EngineKind::ALL.iter().map(|&k| (k, protocol(k)))
}

/// An HTTP path: absolute, no query, no whitespace.
fn is_path(p: &str) -> bool {
    p.starts_with('/') && p.len() > 1 && !p.contains(['?', '#', ' ', '\t', '\n'])
}

/// A client's chat request, as a dispatched step carries it.
fn client_body() -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        "stream": true,
    })
}

fn parses_as_chat(body: &Value) -> Option<&'static str> {
    let bytes = body.to_string();
    let req = parse(bytes.as_bytes(), Endpoint::ChatCompletions)
        .unwrap_or_else(|e| panic!("an engine leg does not parse as chat: {e:?}\n{body}"));
    req.engine_control
}

#[test]
fn each_kind_maps_to_its_own_protocol_and_names_it() {
    let mut names = HashSet::new();
    for (kind, p) in every() {
        assert_eq!(p.kind(), kind, "protocol({kind:?}) is another engine's");
        let name = kind.as_str();
        assert!(
            !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{name:?}: names are lower-case words (configs, labels, flags)"
        );
        assert_eq!(name.parse::<EngineKind>(), Ok(kind));
        assert!(names.insert(name), "two engines named {name}");
    }
}

#[test]
fn every_path_is_absolute() {
    for (kind, p) in every() {
        let paths = [
            Some(p.probe_path()),
            Some(p.self_report_path()),
            p.kv_copy_path(),
            p.drop_path(),
        ];
        for path in paths.into_iter().flatten() {
            assert!(is_path(path), "{kind:?}: `{path}` is not an absolute path");
        }
    }
}

#[test]
fn metric_names_parse_from_the_engines_own_exposition() {
    for (kind, p) in every() {
        let names = p.metric_names();
        let text = p.samples().metrics;
        let capacity = match names.capacity {
            CapacityGauge::Tokens(n) | CapacityGauge::BlockLabels { name: n, .. } => n,
        };
        let all = [names.running, names.waiting, names.kv_usage, capacity];
        for name in all.into_iter().chain(names.kv_usage_legacy) {
            assert!(
                !name.is_empty() && !name.contains(char::is_whitespace),
                "{kind:?}: bad metric name {name:?}"
            );
        }
        for name in all {
            let served = text.lines().filter(|l| !l.starts_with('#')).any(|l| {
                l.strip_prefix(name)
                    .is_some_and(|r| r.starts_with(['{', ' ']))
            });
            assert!(served, "{kind:?}: its /metrics has no sample of {name}");
        }
        assert!(parse_load(&text).is_ok(), "{kind:?}: no load read");
        assert!(
            kv_capacity_tokens(&text).is_some_and(|t| t > 0),
            "{kind:?}: no KV capacity read"
        );
        if let CapacityGauge::BlockLabels { .. } = names.capacity {
            assert!(names.block_size(&text).is_some(), "{kind:?}: no block size");
        }
    }
}

#[test]
fn engines_share_all_their_metric_names_or_none() {
    // The load parser attributes a sample to the first engine that names it: two engines
    // may speak the same format (the sim engine speaks vLLM's), never half of one.
    let set = |p: &dyn EngineProtocol| {
        let n = p.metric_names();
        let mut s: HashSet<&str> = [n.running, n.waiting, n.kv_usage].into();
        s.extend(n.kv_usage_legacy);
        s
    };
    for (a, pa) in every() {
        for (b, pb) in every() {
            let (sa, sb) = (set(pa), set(pb));
            assert!(
                sa == sb || sa.is_disjoint(&sb),
                "{a:?} and {b:?} share some metric names but not all"
            );
            if sa == sb {
                assert_eq!(pa.metric_names(), pb.metric_names(), "{a:?} vs {b:?}");
            }
        }
    }
}

#[test]
fn the_self_report_reads_a_block_size_and_a_step_budget_where_it_says() {
    for (kind, p) in every() {
        let report = p.read_self_report(&p.samples().self_report);
        assert!(
            report.block_size.is_some_and(|b| b > 0),
            "{kind:?}: no block size in its self-report"
        );
        match p.step_budget() {
            StepBudgetSource::SelfReport => assert!(
                report.step_tokens.is_some_and(|t| t > 0),
                "{kind:?}: its step budget comes from a self-report that has none"
            ),
            StepBudgetSource::GpuDefault => assert_eq!(report.step_tokens, None, "{kind:?}"),
        }
        // An unreadable answer reports nothing rather than failing.
        assert_eq!(p.read_self_report(b"\xff not it"), Default::default());
    }
}

#[test]
fn a_prefill_leg_is_a_request_its_engine_accepts_and_falls_back_to_the_client_s() {
    let body = client_body();
    assert_eq!(parses_as_chat(&body), None);
    for (kind, p) in every() {
        match p.pairing() {
            Pairing::NixlTwoStep => {
                let leg = vllm::prefill_request(&body);
                assert!(
                    parses_as_chat(&leg).is_some(),
                    "{kind:?}: no engine control"
                );
                assert_eq!(
                    (leg["max_tokens"].clone(), leg["stream"].clone()),
                    (json!(1), json!(false))
                );
                let params: KvTransferParams =
                    serde_json::from_value(leg["kv_transfer_params"].clone()).expect("params");
                let legs = params
                    .legs()
                    .expect("a prefill leg's params ask for no pull");
                assert!(legs.serve_remote_decode && legs.load.is_none(), "{kind:?}");
                // The decode leg carries what a prefill answers, and pulls from it.
                let answer = KvTransferParamsOut {
                    do_remote_prefill: true,
                    do_remote_decode: false,
                    remote_block_ids: vec![1, 2],
                    remote_engine_id: "p".into(),
                    remote_request_id: "r".into(),
                    remote_host: "10.0.0.1".into(),
                    remote_port: 9000,
                    tp_size: 1,
                    dcp_size: 1,
                    pp_size: 1,
                    remote_num_tokens: 32,
                    remote_blocks_expiry_time: None,
                    transfer_mode: "pull".into(),
                };
                let response = json!({ "kv_transfer_params": answer });
                let returned = vllm::returned_params(&response).expect("returned");
                let decode = vllm::decode_request(&body, returned);
                assert_eq!(decode["stream"], true, "{kind:?}: the decode leg streams");
                let params: KvTransferParams =
                    serde_json::from_value(decode["kv_transfer_params"].clone()).expect("params");
                let load = params.legs().expect("legs").load.expect("a pull");
                assert_eq!((load.host.as_str(), load.port), ("10.0.0.1", 9000));
            }
            Pairing::Bootstrap => {
                let b = sglang::Bootstrap {
                    host: "10.0.0.1".into(),
                    port: Some(8998),
                };
                let leg = sglang::with_bootstrap(&body, &b, &[sglang::room(u64::MAX)]);
                assert!(
                    parses_as_chat(&leg).is_some(),
                    "{kind:?}: no engine control"
                );
                assert_eq!(leg["stream"], true, "{kind:?}: one body serves both legs");
                let whole = sglang::without_bootstrap(&leg);
                assert_eq!(
                    whole, body,
                    "{kind:?}: the fallback is the client's request"
                );
                assert_eq!(parses_as_chat(&whole), None);
            }
        }
        assert_eq!(
            p.decode_leg_at_dispatch(),
            p.pairing().legs_sent_together(),
            "{kind:?}"
        );
    }
}

#[test]
fn an_engine_that_pulls_kv_speaks_the_pull_and_can_hand_off() {
    for (kind, p) in every().filter(|(_, p)| p.pulls_kv()) {
        assert!(
            p.drop_path().is_some(),
            "{kind:?}: a migration's source must drop"
        );
        assert_eq!(
            p.pairing(),
            Pairing::NixlTwoStep,
            "{kind:?}: fetches are NIXL params"
        );
        let source = vllm::PullSource {
            engine_id: "a".into(),
            host: "10.0.0.2".into(),
            port: 8000,
            tokens: 64,
        };
        let fetch = vllm::fetch_request(&client_body(), &source);
        assert!(parses_as_chat(&fetch).is_some());
        let params: KvTransferParams =
            serde_json::from_value(fetch["kv_transfer_params"].clone()).expect("params");
        let load = params.legs().expect("legs").load.expect("a pull");
        assert_eq!((load.port, load.num_tokens), (8000, Some(64)), "{kind:?}");
    }
    assert!(
        every().any(|(_, p)| p.pulls_kv()),
        "the sim engine pulls KV"
    );
}

#[test]
fn only_sglang_prefill_servers_never_serve_whole_requests() {
    assert!(protocol(EngineKind::Vllm).prefill_role_decodes());
    assert!(protocol(EngineKind::Sim).prefill_role_decodes());
    assert!(!protocol(EngineKind::Sglang).prefill_role_decodes());
}
