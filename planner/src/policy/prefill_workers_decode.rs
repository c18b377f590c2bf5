//! When the cost planner may decode a session on a prefill worker of a P/D fleet.
//!
//! MISSION.md's B2: the P/D split is a per-step decision, not an architecture. A P/D
//! fleet's prefill GPUs sit idle between prefills; where their engine serves whole
//! requests in the prefill role (`WorkerView::prefill_decodes`: vLLM's NIXL instances, the
//! simulated engine; never SGLang's `--disaggregation-mode prefill` servers), the planner
//! may price a decode there like a hybrid worker's. What stops it by default is a prefill
//! instance sized for prefill only: its engine reports a KV pool far smaller than the
//! decoders' (a low `gpu_memory_utilization`), and sessions parked there would evict each
//! other. [`PrefillWorkersDecode::Auto`] reads that from the pools the engines report.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use super::WorkerView;

/// Whether prefill workers may hold decodes (the router's
/// `planner_prefill_workers_decode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrefillWorkersDecode {
    /// Prefill workers only prefill: the fleet's roles are kept.
    Never,
    /// A prefill worker whose engine serves whole requests may decode when the KV pool it
    /// reports is at least half the smallest pool a decode-role worker reports: sized for
    /// decoding, not a prefill-only sliver. A pool not yet reported counts as too small.
    #[default]
    Auto,
    /// Every prefill worker whose engine serves whole requests may decode.
    Always,
}

impl PrefillWorkersDecode {
    /// Whether the planner may decode on `w` (a prefill worker; other roles decode
    /// anyway), given the smallest KV pool a decode or hybrid worker reports
    /// ([`smallest_decoder_pool`]).
    pub fn allows(self, w: &WorkerView, smallest_decoder_pool: Option<u64>) -> bool {
        if !w.prefill_decodes {
            return false;
        }
        match self {
            Self::Never => false,
            Self::Always => true,
            Self::Auto => {
                let pool = w.load.and_then(|l| l.kv_capacity_tokens);
                matches!((pool, smallest_decoder_pool), (Some(p), Some(d)) if p.saturating_mul(2) >= d)
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Never => "never",
            Self::Auto => "auto",
            Self::Always => "always",
        }
    }
}

/// The smallest KV pool, in tokens, that a healthy decode or hybrid worker reports; `None`
/// when none reports one.
pub fn smallest_decoder_pool(workers: &[WorkerView]) -> Option<u64> {
    workers
        .iter()
        .filter(|w| w.role.serves_full_requests() && w.healthy)
        .filter_map(|w| w.load.and_then(|l| l.kv_capacity_tokens))
        .min()
}

impl fmt::Display for PrefillWorkersDecode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value that is none of `never`, `auto`, `always`, `true`, `false`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not one of never, auto, always (or true = always, false = never)")]
pub struct PrefillWorkersDecodeError(String);

impl FromStr for PrefillWorkersDecode {
    type Err = PrefillWorkersDecodeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "never" | "false" => Ok(Self::Never),
            "auto" => Ok(Self::Auto),
            "always" | "true" => Ok(Self::Always),
            _ => Err(PrefillWorkersDecodeError(s.to_owned())),
        }
    }
}

/// A TOML boolean (the key's earlier form: `true` is `always`, `false` `never`) or one of
/// the words.
impl<'de> Deserialize<'de> for PrefillWorkersDecode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Flag(bool),
            Word(String),
        }
        match Written::deserialize(d)? {
            Written::Flag(true) => Ok(Self::Always),
            Written::Flag(false) => Ok(Self::Never),
            Written::Word(w) => w.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};
    use crate::policy::EngineLoad;

    fn worker(id: u32, role: Role, pool: Option<u64>) -> WorkerView {
        let mut w = WorkerView::idle(WorkerId(id), role);
        w.prefill_decodes = true;
        w.load = pool.map(|p| EngineLoad {
            kv_capacity_tokens: Some(p),
            ..EngineLoad::default()
        });
        w
    }

    #[test]
    fn auto_lets_a_prefill_worker_decode_only_with_a_pool_sized_for_decoding() {
        let fleet = [
            worker(0, Role::Prefill, Some(400_000)),
            worker(1, Role::Prefill, Some(60_000)),
            worker(2, Role::Prefill, None),
            worker(3, Role::Decode, Some(500_000)),
            worker(4, Role::Decode, Some(450_000)),
        ];
        let smallest = smallest_decoder_pool(&fleet);
        assert_eq!(smallest, Some(450_000));
        let auto = PrefillWorkersDecode::Auto;
        assert!(auto.allows(&fleet[0], smallest));
        assert!(!auto.allows(&fleet[1], smallest), "a prefill-only sliver");
        assert!(!auto.allows(&fleet[2], smallest), "a pool not yet reported");
        assert!(!auto.allows(&fleet[0], None), "no decoder reports a pool");
        assert!(PrefillWorkersDecode::Always.allows(&fleet[1], smallest));
        assert!(!PrefillWorkersDecode::Never.allows(&fleet[0], smallest));
    }

    #[test]
    fn an_engine_that_only_prefills_never_decodes() {
        let mut w = worker(0, Role::Prefill, Some(400_000));
        w.prefill_decodes = false;
        for mode in [
            PrefillWorkersDecode::Never,
            PrefillWorkersDecode::Auto,
            PrefillWorkersDecode::Always,
        ] {
            assert!(!mode.allows(&w, Some(100)), "{mode}");
        }
    }

    #[test]
    fn the_key_takes_the_words_and_the_earlier_booleans() {
        #[derive(Deserialize)]
        struct Table {
            k: PrefillWorkersDecode,
        }
        let read = |s: &str| toml::from_str::<Table>(&format!("k = {s}")).map(|t| t.k);
        assert_eq!(read("\"auto\"").ok(), Some(PrefillWorkersDecode::Auto));
        assert_eq!(read("\"Never\"").ok(), Some(PrefillWorkersDecode::Never));
        assert_eq!(read("true").ok(), Some(PrefillWorkersDecode::Always));
        assert_eq!(read("false").ok(), Some(PrefillWorkersDecode::Never));
        let err = read("\"sometimes\"").err().map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("not one of never, auto, always")),
            "{err:?}"
        );
    }
}
