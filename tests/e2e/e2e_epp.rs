//! `ownerserve epp`'s ext_proc contract, driven by a real gRPC client (envoy-types' own
//! `ExternalProcessorClient`) against real processes: the pick is the session's owner
//! (checked against the directory), the same in the header and in `envoy.lb` metadata,
//! with `clear_route_cache`, in BUFFERED and FULL_DUPLEX_STREAMED body modes; the subset
//! hint is obeyed (503 when nothing in it is eligible); a full model sheds with 429; the
//! served endpoint is what the directory records; two replicas sharing a directory agree;
//! gRPC health answers for liveness, readiness and the ext_proc service on both ports.
#![cfg(feature = "kubernetes")]
#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::epp::{healthy, remote_config, sims, spawn as epp};
use common::{chat_body, eventually, get_json, temp_config, DirectoryNodes};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Msg;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration,
};
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};
use serde_json::Value as Json;
use tokio::sync::mpsc;

fn header(k: &str, v: &str) -> HeaderValue {
    HeaderValue {
        key: k.into(),
        value: String::new(),
        raw_value: v.as_bytes().to_vec(),
    }
}

fn headers(
    session: &str,
    eos: bool,
    full_duplex: bool,
    subset: Option<Vec<&str>>,
) -> ProcessingRequest {
    let mut hs = vec![
        header(":method", "POST"),
        header(":path", "/v1/chat/completions"),
        header("content-type", "application/json"),
        header("x-session-id", session),
    ];
    if session.is_empty() {
        hs.pop();
    }
    ProcessingRequest {
        request: Some(Msg::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap { headers: hs }),
            end_of_stream: eos,
            ..HttpHeaders::default()
        })),
        protocol_config: Some(ProtocolConfiguration {
            request_body_mode: if full_duplex { 4 } else { 2 },
            ..ProtocolConfiguration::default()
        }),
        metadata_context: subset.map(|s| {
            metadata(
                "envoy.lb.subset_hint",
                "x-gateway-destination-endpoint-subset",
                list(&s),
            )
        }),
        ..ProcessingRequest::default()
    }
}

fn list(items: &[&str]) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items
                .iter()
                .map(|s| Value {
                    kind: Some(Kind::StringValue((*s).into())),
                })
                .collect(),
        })),
    }
}

fn metadata(namespace: &str, key: &str, v: Value) -> Metadata {
    Metadata {
        filter_metadata: HashMap::from([(
            namespace.to_owned(),
            Struct {
                fields: HashMap::from([(key.to_owned(), v)]),
            },
        )]),
        ..Metadata::default()
    }
}

fn body(bytes: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn served(endpoint: &str) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(Msg::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![header(":status", "200")],
            }),
            ..HttpHeaders::default()
        })),
        metadata_context: Some(metadata(
            "envoy.lb",
            "x-gateway-destination-endpoint-served",
            Value {
                kind: Some(Kind::StringValue(endpoint.into())),
            },
        )),
        ..ProcessingRequest::default()
    }
}

fn chat(session: &str) -> Vec<u8> {
    let text: String = (0..40).map(|i| format!("{session} says {i} ")).collect();
    serde_json::to_vec(&chat_body(&text, 2)).unwrap()
}

/// Sends `messages` on one stream, then closes it; every answer.
async fn exchange(grpc: &str, messages: Vec<ProcessingRequest>) -> Vec<ProcessingResponse> {
    let mut client = ExternalProcessorClient::connect(grpc.to_owned())
        .await
        .unwrap();
    let mut answers = client
        .process(futures_util::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(a) = answers.message().await.unwrap() {
        out.push(a);
    }
    out
}

/// One buffered step of `session` served where it was picked, as a gateway runs it: the
/// pick, then the response's headers naming the served endpoint. The endpoint picked.
async fn step_served(grpc: &str, session: &str) -> String {
    let (tx, mut rx) = mpsc::channel(4);
    let mut client = ExternalProcessorClient::connect(grpc.to_owned())
        .await
        .unwrap();
    let outgoing = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    tx.send(headers(session, false, false, None)).await.unwrap();
    tx.send(body(&chat(session), true)).await.unwrap();
    let mut answers = client.process(outgoing).await.unwrap().into_inner();
    answers.message().await.unwrap().expect("headers answered");
    let pick = pick_of(&answers.message().await.unwrap().expect("picked"));
    tx.send(served(&pick[0])).await.unwrap();
    answers
        .message()
        .await
        .unwrap()
        .expect("response headers answered");
    drop(tx);
    while answers.message().await.ok().flatten().is_some() {}
    pick[0].clone()
}

/// The pick of an answer: the header's value and the metadata's, which must be equal, and
/// `clear_route_cache`.
fn pick_of(a: &ProcessingResponse) -> Vec<String> {
    let common = match &a.response {
        Some(Answer::RequestHeaders(h)) => h.response.clone(),
        Some(Answer::RequestBody(b)) => b.response.clone(),
        other => panic!("no pick: {other:?}"),
    }
    .expect("a common response");
    assert!(common.clear_route_cache, "the route cache is cleared");
    let set = &common
        .header_mutation
        .expect("a header mutation")
        .set_headers;
    let h = set[0].header.as_ref().unwrap();
    assert_eq!(h.key, "x-gateway-destination-endpoint");
    let in_header = String::from_utf8(h.raw_value.clone()).unwrap();
    let lb = &a
        .dynamic_metadata
        .as_ref()
        .expect("dynamic metadata")
        .fields["envoy.lb"];
    let Some(Kind::StructValue(lb)) = &lb.kind else {
        panic!("envoy.lb")
    };
    let Some(Kind::StringValue(in_metadata)) = &lb.fields["x-gateway-destination-endpoint"].kind
    else {
        panic!("a string")
    };
    assert_eq!(&in_header, in_metadata, "header and metadata agree");
    in_header.split(',').map(str::to_owned).collect()
}

fn immediate_status(a: &ProcessingResponse) -> i32 {
    match &a.response {
        Some(Answer::ImmediateResponse(r)) => r.status.as_ref().unwrap().code,
        other => panic!("not an immediate response: {other:?}"),
    }
}

/// The directory's owner (worker id) of `session`, once recorded.
async fn owner(api: &str, session: &str) -> Option<u64> {
    let s = get_json(&format!("{api}/admin/v1/sessions")).await;
    s["sessions"]
        .as_array()?
        .iter()
        .find(|r| r["id"] == Json::String(session.into()))
        .and_then(|r| r["owner"]["worker"].as_u64())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pick_is_the_owner_in_both_body_modes_within_the_subset_and_recorded_as_served() {
    let (_sims, flags, endpoints) = sims(3, &["--instant"]);
    let cfg = temp_config(
        "epp.toml",
        "[router]\npolicy = \"ownerserve\"\ndirectory = \"embedded\"\nhealth_interval_ms = 200\n",
    );
    let e = epp(&cfg, &flags, &[]);
    let api = e.proc.url.clone();
    healthy(&api, 3).await;

    // BUFFERED: the headers go on unchanged, the pick comes on the body.
    let answers = exchange(
        &e.grpc,
        vec![headers("s1", false, false, None), body(&chat("s1"), true)],
    )
    .await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(
        matches!(&answers[0].response, Some(Answer::RequestHeaders(h)) if h.response.is_none())
    );
    let first = pick_of(&answers[1]);
    assert_eq!(first.len(), 3, "the owner, then two fallbacks: {first:?}");
    let mut distinct = first.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3);
    let url = api.clone();
    eventually(Duration::from_secs(5), "s1's owner claimed", || {
        let url = url.clone();
        async move { owner(&url, "s1").await.is_some() }
    })
    .await;
    let owner_s1 = owner(&api, "s1").await.unwrap() as usize;
    assert_eq!(
        first[0], endpoints[owner_s1],
        "the pick is the directory's owner"
    );

    // FULL_DUPLEX_STREAMED: headers and body chunks arrive at once; the pick comes on the
    // headers once the body is whole, then the body goes back as it came.
    let full = chat("s1");
    let (a, b) = full.split_at(full.len() / 2);
    let answers = exchange(
        &e.grpc,
        vec![
            headers("s1", false, true, None),
            body(a, false),
            body(b, true),
        ],
    )
    .await;
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert_eq!(
        pick_of(&answers[0])[0],
        endpoints[owner_s1],
        "the same owner"
    );
    let Some(Answer::RequestBody(passed)) = &answers[1].response else {
        panic!("the body")
    };
    let mutation = passed
        .response
        .as_ref()
        .unwrap()
        .body_mutation
        .as_ref()
        .unwrap();
    let Some(body_mutation::Mutation::StreamedResponse(streamed)) = &mutation.mutation else {
        panic!("a streamed body")
    };
    assert_eq!(streamed.body, full);
    assert!(streamed.end_of_stream);

    // The subset hint: only a non-owner is allowed, so the pick is in it.
    let other = endpoints
        .iter()
        .find(|e| **e != endpoints[owner_s1])
        .unwrap()
        .clone();
    let answers = exchange(
        &e.grpc,
        vec![
            headers("s1", false, false, Some(vec![&other])),
            body(&chat("s1"), true),
        ],
    )
    .await;
    assert_eq!(pick_of(&answers[1]), vec![other.clone()], "only the subset");
    // Nothing eligible in it: 503.
    for subset in [vec![], vec!["10.9.9.9:80"]] {
        let answers = exchange(
            &e.grpc,
            vec![
                headers("s2", false, false, Some(subset)),
                body(&chat("s2"), true),
            ],
        )
        .await;
        assert_eq!(immediate_status(&answers[1]), 503);
    }

    // Served elsewhere (a gateway retry): the directory records the endpoint that served.
    let answers = exchange(
        &e.grpc,
        vec![headers("s3", false, false, None), body(&chat("s3"), true)],
    )
    .await;
    let picked = pick_of(&answers[1]);
    let url = api.clone();
    eventually(Duration::from_secs(5), "s3's owner claimed", || {
        let url = url.clone();
        async move { owner(&url, "s3").await.is_some() }
    })
    .await;
    assert_eq!(
        endpoints[owner(&api, "s3").await.unwrap() as usize],
        picked[0]
    );
    let fallback = picked[1].clone();
    let answers = exchange(
        &e.grpc,
        vec![
            headers("s3", false, false, None),
            body(&chat("s3"), true),
            served(&fallback),
        ],
    )
    .await;
    assert_eq!(answers.len(), 3, "{answers:?}");
    let url = api.clone();
    let want = endpoints.iter().position(|e| *e == fallback).unwrap() as u64;
    eventually(
        Duration::from_secs(5),
        "s3 recorded on the endpoint that served",
        || {
            let url = url.clone();
            async move { owner(&url, "s3").await == Some(want) }
        },
    )
    .await;

    // gRPC health on both ports.
    for addr in [&e.grpc, &e.health] {
        let channel = tonic::transport::Channel::from_shared(addr.clone())
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut h = tonic_health::pb::health_client::HealthClient::new(channel);
        for service in [
            "liveness",
            "readiness",
            "envoy.service.ext_proc.v3.ExternalProcessor",
        ] {
            let r = h
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(r.status, 1, "{service} on {addr} is SERVING");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_model_sheds_with_429_while_a_request_holds_its_slot() {
    let (_sims, flags, _) = sims(1, &["--instant"]);
    let cfg = temp_config(
        "epp-shed.toml",
        "[router]\nhealth_interval_ms = 200\nmax_inflight_per_worker = 1\nmax_queued_per_model = 0\n",
    );
    let e = epp(&cfg, &flags, &[]);
    healthy(&e.proc.url, 1).await;
    // The first request is picked and its response has not ended: it holds the one slot.
    let (tx, mut rx) = mpsc::channel(4);
    let mut client = ExternalProcessorClient::connect(e.grpc.clone())
        .await
        .unwrap();
    let outgoing = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx));
    tx.send(headers("held", false, false, None)).await.unwrap();
    tx.send(body(&chat("held"), true)).await.unwrap();
    let mut held = client.process(outgoing).await.unwrap().into_inner();
    held.message().await.unwrap().expect("headers answered");
    let pick = held.message().await.unwrap().expect("picked");
    pick_of(&pick);
    let answers = exchange(
        &e.grpc,
        vec![
            headers("shed", false, false, None),
            body(&chat("shed"), true),
        ],
    )
    .await;
    assert_eq!(immediate_status(&answers[1]), 429);
    drop(tx);
    // Once the held stream ends its slot is free again.
    while held.message().await.ok().flatten().is_some() {}
    let answers = exchange(
        &e.grpc,
        vec![
            headers("after", false, false, None),
            body(&chat("after"), true),
        ],
    )
    .await;
    pick_of(&answers[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_a_directory_pick_the_same_owner() {
    let nodes = DirectoryNodes::start(1, "epp", &[]);
    let (_sims, flags, endpoints) = sims(3, &["--instant"]);
    let cfg = remote_config("epp-remote.toml", &nodes);
    let replicas = [epp(&cfg, &flags, &[]), epp(&cfg, &flags, &[])];
    for r in &replicas {
        healthy(&r.proc.url, 3).await;
    }
    for i in 0..12 {
        let session = format!("shared-{i}");
        let mut picks = Vec::new();
        for step in 0..4 {
            let r = &replicas[(i + step) % 2];
            picks.push(step_served(&r.grpc, &session).await);
        }
        assert!(picks.iter().all(|p| *p == picks[0]), "{session}: {picks:?}");
        assert!(endpoints.contains(&picks[0]));
    }
}
