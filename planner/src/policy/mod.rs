//! Routing policies. Every policy (OwnerServe's planner and each baseline) implements
//! [`Policy`], so the live router and the trace simulator share one implementation.
//! Policies are pure: no IO, no clock; state they keep (a cursor, an RNG) is their own.

mod kv_aware;
mod least_loaded;
mod rng;
mod round_robin;
mod session_affinity;

pub use kv_aware::{BusyThresholds, KvAware, KvAwareConfig};
pub use least_loaded::LeastLoaded;
pub use rng::SplitMix64;
pub use round_robin::RoundRobin;
pub use session_affinity::SessionAffinity;

use crate::ids::{Role, WorkerId};

/// Load an engine reports in its `/metrics` (vLLM or SGLang gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests being executed.
    pub running: f64,
    /// Requests queued.
    pub waiting: f64,
    /// KV-cache occupancy, 0..1.
    pub kv_usage: f64,
}

/// What the router knows about one worker when it routes a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerView {
    pub id: WorkerId,
    pub role: Role,
    pub healthy: bool,
    /// Requests the router has sent there that have not finished.
    pub in_flight: u32,
    /// KV blocks of the requests in flight there (the router's own prediction).
    pub active_blocks: u64,
    /// Prompt tokens sent there whose prefill has not finished (no first byte yet).
    pub active_prefill_tokens: u64,
    /// Leading blocks of this request's prompt the worker holds in GPU memory.
    pub cached_blocks: u32,
    /// The engine's last scraped load, if any.
    pub load: Option<EngineLoad>,
}

impl WorkerView {
    /// A view with no load and no cached blocks.
    pub fn idle(id: WorkerId, role: Role) -> Self {
        Self {
            id,
            role,
            healthy: true,
            in_flight: 0,
            active_blocks: 0,
            active_prefill_tokens: 0,
            cached_blocks: 0,
            load: None,
        }
    }
}

/// What a policy knows about the request being routed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteRequest<'a> {
    /// The `model` the client asked for; candidates already serve it.
    pub model: &'a str,
    /// Prompt length in tokens (0 when the router did not tokenize).
    pub prompt_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// The session the request belongs to, if the client named one.
    pub session: Option<&'a str>,
    /// Router time in milliseconds (policies never read a clock).
    pub now_ms: u64,
}

impl RouteRequest<'_> {
    /// Blocks the prompt occupies.
    pub fn prompt_blocks(&self) -> u64 {
        u64::from(self.prompt_tokens).div_ceil(u64::from(self.block_size.max(1)))
    }
}

/// Where a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub worker: WorkerId,
}

/// Why a policy could not place a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("no healthy worker can serve this request")]
    NoHealthyWorker,
    /// Every candidate is past a busy threshold: the client should retry later.
    #[error("every worker is busy")]
    AllBusy,
}

/// A routing policy.
pub trait Policy: Send {
    /// The name `--policy` selects it by.
    fn name(&self) -> &'static str;

    /// Picks a worker among `workers` (the candidates serving the request's model).
    fn choose(
        &mut self,
        req: &RouteRequest<'_>,
        workers: &[WorkerView],
    ) -> Result<Decision, PolicyError>;

    /// Whether the policy needs the prompt tokenized and matched against the KV index.
    fn needs_prefix_match(&self) -> bool {
        false
    }
}

/// Names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &[
    "round_robin",
    "least_loaded",
    "kv_aware",
    "session_affinity",
];

/// A policy that is not one we have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown policy `{0}` (available: round_robin, least_loaded, kv_aware, session_affinity)")]
pub struct UnknownPolicy(pub String);

/// Settings of the configurable policies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicySettings {
    pub kv_aware: KvAwareConfig,
    /// How long a session sticks to its worker after its last request.
    pub session_ttl_ms: u64,
    /// Seed of policies that sample.
    pub seed: u64,
}

impl Default for PolicySettings {
    fn default() -> Self {
        Self {
            kv_aware: KvAwareConfig::default(),
            session_ttl_ms: 30 * 60 * 1000,
            seed: 0x05EE_D0F0_0D5E_ED00,
        }
    }
}

/// Builds a policy from its name.
pub fn by_name(name: &str, s: &PolicySettings) -> Result<Box<dyn Policy>, UnknownPolicy> {
    match name {
        "round_robin" => Ok(Box::new(RoundRobin::default())),
        "least_loaded" => Ok(Box::new(LeastLoaded::default())),
        "kv_aware" => Ok(Box::new(KvAware::new(s.kv_aware, s.seed))),
        "session_affinity" => Ok(Box::new(SessionAffinity::new(s.session_ttl_ms))),
        _ => Err(UnknownPolicy(name.to_owned())),
    }
}

/// Candidates a plain (non-disaggregated) request may go to: healthy decode or hybrid
/// workers, or, in a fleet that has none, any healthy worker (a prefill-only engine still
/// serves whole requests).
pub(crate) fn full_request_candidates(
    workers: &[WorkerView],
) -> impl Iterator<Item = &WorkerView> + '_ {
    let any_full = workers
        .iter()
        .any(|w| w.healthy && w.role.serves_full_requests());
    workers
        .iter()
        .filter(move |w| w.healthy && (!any_full || w.role.serves_full_requests()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_builds_and_reports_its_name() {
        let s = PolicySettings::default();
        for name in POLICY_NAMES {
            assert_eq!(by_name(name, &s).unwrap().name(), *name);
        }
        assert_eq!(
            by_name("nope", &s).err(),
            Some(UnknownPolicy("nope".to_owned()))
        );
    }
}
