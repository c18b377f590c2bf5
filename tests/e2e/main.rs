//! The end-to-end tests: real `ownerserve` processes (routers, simulated workers, directory
//! nodes, `up`, `epp`) driven over HTTP, and the tools they meet in production (the OpenAI
//! and Anthropic SDKs, Redis, Prometheus, Envoy, pyzmq). One test binary, one module per
//! area, so the router links once (each binary links all of it): the fast tier runs these.
//! The heavy fault runs (directory clusters under kill -9, chaos) are `tests/faults`.
//!
//! Run one area: `cargo test -p ownerserve-router --test e2e e2e_routing::`.
#![allow(clippy::expect_used, reason = "tests: a failure should panic")]

#[path = "../common/mod.rs"]
mod common;

mod e2e_agent_apis;
mod e2e_agent_session;
mod e2e_ctl;
mod e2e_dashboards;
mod e2e_decode_placement;
mod e2e_health;
mod e2e_host_tier;
mod e2e_kv_events;
mod e2e_openai_sdk;
mod e2e_ownership;
mod e2e_parked_returns;
mod e2e_pd_adapters;
mod e2e_prefill_calibration;
mod e2e_prefill_decodes;
mod e2e_receipts;
mod e2e_redis_fanout;
mod e2e_replay;
mod e2e_request_ids;
mod e2e_response_owners;
mod e2e_router;
mod e2e_routing;
mod e2e_session_admission;
mod e2e_sim_engine;
mod e2e_tenant_budgets;

// Kubernetes discovery and the endpoint picker (feature `kubernetes`, on by default).
#[cfg(feature = "kubernetes")]
mod deploy_manifests;
#[cfg(feature = "kubernetes")]
mod e2e_envoy_epp;
#[cfg(feature = "kubernetes")]
mod e2e_epp;
#[cfg(feature = "kubernetes")]
mod e2e_kubernetes;
