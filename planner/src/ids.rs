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

/// Declares [`EngineKind`] from one line per engine: its variant and its name (in
/// configs, `--worker ...,engine=`, discovery labels and the admin API). Everything else
/// about an engine is its protocol object (`ownerserve_shim::engines::protocol`).
macro_rules! engine_kinds {
    ($($(#[$doc:meta])* $variant:ident = $name:literal,)+) => {
        /// The engine software behind a worker; its protocol
        /// (`ownerserve_shim::engines::protocol`) decides wire formats and dispatch.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum EngineKind {
            $($(#[$doc])* #[serde(rename = $name)] $variant,)+
        }

        impl EngineKind {
            /// Every engine kind, in declaration order.
            pub const ALL: &'static [EngineKind] = &[$(EngineKind::$variant),+];

            /// Its name, as in configs and the admin API.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(EngineKind::$variant => $name,)+
                }
            }
        }
    };
}

engine_kinds! {
    Vllm = "vllm",
    Sglang = "sglang",
    /// Our simulated GPU engine (`ownerserve sim-worker`), which speaks vLLM's formats.
    Sim = "sim",
}

impl EngineKind {
    /// Every engine's name, comma-separated (what an unknown name is told to be one of).
    pub fn names() -> String {
        let names: Vec<&str> = Self::ALL.iter().map(|k| k.as_str()).collect();
        names.join(", ")
    }
}

/// A role or engine name that is not one we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} `{name}` (expected one of: {expected})")]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
    pub expected: String,
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
                expected: "prefill, decode, hybrid".to_owned(),
            }),
        }
    }
}

impl FromStr for EngineKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .copied()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| UnknownName {
                kind: "engine",
                name: s.to_owned(),
                expected: Self::names(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_engine_parses_from_its_name_in_flags_and_configs() {
        #[derive(Deserialize)]
        struct Entry {
            engine: EngineKind,
        }
        for &kind in EngineKind::ALL {
            assert_eq!(kind.as_str().parse::<EngineKind>(), Ok(kind));
            let entry: Entry =
                toml::from_str(&format!("engine = \"{}\"", kind.as_str())).expect("parses");
            assert_eq!(entry.engine, kind);
        }
        let err = "tgi".parse::<EngineKind>().expect_err("unknown");
        assert_eq!(err.expected, "vllm, sglang, sim");
    }
}
