//! OwnerServe's own KV primitives, which the simulated engine serves: a receiver copies a
//! session's sealed blocks from a source (a migration's copy), and an engine drops named
//! blocks (a migration's hand-off, a demoted session's tail). The router sends these
//! typed bodies to these paths; [`crate::sim`]'s routes decode the same types.
//!
//! [`Sim`] is its protocol: vLLM's formats (probe, `/metrics`, self-report, NIXL two-step)
//! plus these primitives, which make it pull KV and drop a demoted session's tail.

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::lifecycle::{Levers, Retention};

use super::protocol::{EngineProtocol, EngineReport, MetricNames, Pairing, StepBudgetSource};
use super::vllm;

pub use crate::sim::kv_transfer::{DropRequest, DropResponse, FetchRequest, FetchResponse};

/// `POST`: copy `block_hashes` from a source engine into this one ([`FetchRequest`]).
pub const FETCH_PATH: &str = "/ownerserve/v1/kv/fetch";
/// `POST`: evict blocks, and with a session and epoch fence it ([`DropRequest`]).
pub const DROP_PATH: &str = "/ownerserve/v1/kv/drop";
/// `GET`: the session claims this engine's fence accepted, in order
/// (`{"accepted": [{"session", "epoch", "for", "at_unix_ms"}], "forgotten": N}`), for
/// audits against the directory's log.
pub const FENCE_ACCEPTED_PATH: &str = "/ownerserve/v1/fence/accepted";

/// The simulated engine's protocol.
pub struct Sim;

impl EngineProtocol for Sim {
    fn kind(&self) -> EngineKind {
        EngineKind::Sim
    }
    fn probe_path(&self) -> &'static str {
        "/health"
    }
    fn metric_names(&self) -> &'static MetricNames {
        &vllm::METRIC_NAMES
    }
    fn self_report_path(&self) -> &'static str {
        "/metrics"
    }
    fn read_self_report(&self, body: &[u8]) -> EngineReport {
        vllm::report_of_metrics(body)
    }
    fn step_budget(&self) -> StepBudgetSource {
        StepBudgetSource::GpuDefault
    }
    fn pairing(&self) -> Pairing {
        Pairing::NixlTwoStep
    }
    fn kv_copy_path(&self) -> Option<&'static str> {
        Some(FETCH_PATH)
    }
    fn drop_path(&self) -> Option<&'static str> {
        Some(DROP_PATH)
    }
    #[cfg(test)]
    fn samples(&self) -> super::protocol::Samples {
        let metrics = crate::sim::metrics::EngineMetrics::new(100, 16).render("m");
        super::protocol::Samples {
            self_report: metrics.as_bytes().to_vec(),
            metrics,
        }
    }
    fn prefill_role_decodes(&self) -> bool {
        true
    }

    /// The sim engine schedules and evicts as vLLM does (priority with `--scheduling-policy
    /// priority`, LRU, no pins): a kept session is kept warm by touches. Its host tier
    /// holds what HBM evicts and a touch restores it.
    fn levers(&self) -> Levers {
        Levers {
            priority: true,
            retention: Retention::Touch,
            host_tier: true,
        }
    }

    /// vLLM's header.
    fn priority_header(&self, rank: i8) -> Option<(&'static str, i32)> {
        Some(("x-vllm-priority", i32::from(rank)))
    }
}
