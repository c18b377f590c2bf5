//! Identities shared by every crate: workers, their roles and the engines behind them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Index of a worker in the router's registry; stable for the router's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

/// What a worker is for in a P/D fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs prefills whose KV is shipped to a decode worker.
    Prefill,
    /// Owns decoding sessions.
    Decode,
    /// Does both for its own sessions: the planner may colocate prefill and decode here,
    /// and a prefill worker may prefill for it, but it never prefills for another worker
    /// (`plan::candidates::generate`).
    Hybrid,
}

impl Role {
    /// Whether a plain (non-disaggregated) request can be served end to end here.
    pub fn serves_full_requests(self) -> bool {
        matches!(self, Role::Decode | Role::Hybrid)
    }

    /// Lower-case name, as in configs and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Hybrid => "hybrid",
        }
    }
}

/// The engine software behind a worker; decides wire formats and dispatch protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    Vllm,
    Sglang,
    /// Our simulated GPU engine (`ownerserve sim-worker`), which speaks vLLM's formats.
    Sim,
}

impl EngineKind {
    /// Lower-case name, as in configs and the admin API.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
            EngineKind::Sim => "sim",
        }
    }

    /// Whether its workers can pull a sealed prefix from a peer and serve one
    /// (`WorkerView::pulls_kv`): the simulated engine's `/kv/fetch`. vLLM's NIXL connector
    /// and SGLang's disaggregation move KV only from a prefill leg to its decode leg.
    pub fn pulls_kv(self) -> bool {
        self == EngineKind::Sim
    }

    /// Whether an instance started in the prefill role still serves whole requests
    /// (`WorkerView::prefill_decodes`): vLLM's NIXL connector acts only on requests that
    /// carry `kv_transfer_params`, and the simulated engine has no role; SGLang's
    /// `--disaggregation-mode prefill` server only ever hands its KV to a decode server.
    pub fn decodes_in_prefill_role(self) -> bool {
        self != EngineKind::Sglang
    }

    /// Whether a decode instance gets a remote prefill's decode leg at the same time as
    /// the prefill leg (`WorkerView::decode_leg_at_dispatch`): SGLang's bootstrap pair is
    /// sent to both servers at once, and the decode server holds the request in its queue
    /// while the prefill runs. vLLM's NIXL two-step sends the decode leg only once the
    /// prefill leg has answered, and the simulated engine's flow does the same.
    pub fn decode_leg_at_dispatch(self) -> bool {
        self == EngineKind::Sglang
    }
}

/// A role or engine name that is not one we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{name}` (expected one of: {expected})")]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
    pub expected: &'static str,
}

impl FromStr for Role {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "hybrid" => Ok(Role::Hybrid),
            _ => Err(UnknownName {
                kind: "role",
                name: s.to_owned(),
                expected: "prefill, decode, hybrid",
            }),
        }
    }
}

impl FromStr for EngineKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "vllm" => Ok(EngineKind::Vllm),
            "sglang" => Ok(EngineKind::Sglang),
            "sim" => Ok(EngineKind::Sim),
            _ => Err(UnknownName {
                kind: "engine",
                name: s.to_owned(),
                expected: "vllm, sglang, sim",
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sglang_prefill_servers_never_serve_whole_requests() {
        assert!(EngineKind::Vllm.decodes_in_prefill_role());
        assert!(EngineKind::Sim.decodes_in_prefill_role());
        assert!(!EngineKind::Sglang.decodes_in_prefill_role());
    }
}
