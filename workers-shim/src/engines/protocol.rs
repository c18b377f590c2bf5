//! What an engine protocol is: everything the router does differently for one engine
//! kind, as one object ([`EngineProtocol`]) per engine (`vllm.rs`, `sglang.rs`, `sim.rs`),
//! which [`super::protocol()`] maps each [`EngineKind`] to. Pure: names, paths, flags and
//! parsers; the router does the IO they describe.

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::lifecycle::Levers;

/// Everything that differs by engine. Implementations are unit structs, one per engine
/// file; the contract test (`engines/contract.rs`) checks every one of them.
pub trait EngineProtocol: Sync {
    /// The kind this protocol serves (its name: `kind().as_str()`).
    fn kind(&self) -> EngineKind;

    /// The cheap readiness path the health checker probes (`WorkerSpec::probe_path`,
    /// unless the worker sets `health_path`).
    fn probe_path(&self) -> &'static str;

    /// What its `/metrics` calls the gauges the router reads (load, KV capacity).
    fn metric_names(&self) -> &'static MetricNames;

    /// What the router asks of it once at startup (`router/src/engine_report.rs`): the
    /// path of a `GET`, and how its answer is read.
    fn self_report_path(&self) -> &'static str;

    /// Reads the answer to `GET self_report_path()`; what it cannot read is `None`.
    fn read_self_report(&self, body: &[u8]) -> EngineReport;

    /// Where the planner's step budget for it comes from when no config sets one.
    fn step_budget(&self) -> StepBudgetSource;

    /// How a remote prefill's two legs are paired; engines of different pairings run a
    /// disaggregated step whole on the decode worker.
    fn pairing(&self) -> Pairing;

    /// `POST` path where it copies a session's sealed blocks from a peer (a migration),
    /// and which makes it pull KV ([`EngineProtocol::pulls_kv`]); `None`: KV moves only
    /// from a prefill leg to its decode leg.
    fn kv_copy_path(&self) -> Option<&'static str>;

    /// `POST` path where it drops named blocks (a demoted session's tail, a migration
    /// source's copy once handed off); `None`: it evicts by LRU only, so demotion leaves
    /// the tail to it.
    fn drop_path(&self) -> Option<&'static str>;

    /// Whether an instance started in the prefill role still serves whole requests
    /// (`WorkerView::prefill_decodes`).
    fn prefill_role_decodes(&self) -> bool;

    /// What it lets the router do with a parked session's KV: the levers the lifecycle
    /// decision (`ownerserve_planner::lifecycle`) prices. A host tier is the worker's
    /// (`host_tier` here says whether the kind can have one the router drives).
    fn levers(&self) -> Levers;

    /// The request header that orders its waiting queue, and its value for a step of
    /// priority `rank` (lower runs sooner, vLLM's convention: `Class::engine_rank` in the
    /// router); `None`: no priority.
    fn priority_header(&self, rank: i8) -> Option<(&'static str, i32)>;

    /// What the contract test checks it against: its `/metrics` and its self-report as
    /// the engine serves them.
    #[cfg(test)]
    fn samples(&self) -> Samples;

    /// Whether its workers can pull a sealed prefix from a peer and serve one
    /// (`WorkerView::pulls_kv`).
    fn pulls_kv(&self) -> bool {
        self.kv_copy_path().is_some()
    }

    /// Whether a decode instance gets a remote prefill's decode leg at the same time as
    /// the prefill leg (`WorkerView::decode_leg_at_dispatch`).
    fn decode_leg_at_dispatch(&self) -> bool {
        self.pairing().legs_sent_together()
    }
}

/// What an engine serves, as the contract test (`engines/contract.rs`) reads it; each
/// engine file gives its own.
#[cfg(test)]
pub struct Samples {
    /// Its `/metrics` exposition.
    pub metrics: String,
    /// Its answer to `GET self_report_path()`.
    pub self_report: Vec<u8>,
}

/// How the two legs of a remote prefill are built and sent (WIRE_FORMATS.md §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pairing {
    /// vLLM NixlConnector's pull mode ([`super::vllm`]): the prefill leg first
    /// (`prefill_request`), then the decode leg with the `kv_transfer_params` it returned
    /// (`decode_request`). Also spoken by the sim engine.
    NixlTwoStep,
    /// SGLang's bootstrap ([`super::sglang`]): one body with the prefill server's bootstrap
    /// triple (`with_bootstrap`) sent to both servers at once; the decode server holds it
    /// in its queue while the prefill runs.
    Bootstrap,
}

impl Pairing {
    /// Whether the decode leg is sent with the prefill leg, not after it.
    pub fn legs_sent_together(self) -> bool {
        self == Pairing::Bootstrap
    }
}

/// Where the planner's step budget (`StepBudget`) for an engine comes from when neither
/// the worker nor the router configures one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepBudgetSource {
    /// It publishes none: vLLM's default for the worker's GPU
    /// (`ownerserve_planner::plan::engine_default_chunk_tokens`).
    GpuDefault,
    /// Its self-report's [`EngineReport::step_tokens`] (else the GPU default).
    SelfReport,
}

/// What one engine reported about itself; `None` where it reported nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineReport {
    /// Tokens per KV block.
    pub block_size: Option<usize>,
    /// Prompt tokens one engine step computes (SGLang's `chunked_prefill_size` when
    /// chunked prefill is on).
    pub step_tokens: Option<u64>,
}

/// The names of the gauges an engine's `/metrics` exposes that the router reads
/// (`crate::load_metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricNames {
    /// Requests in the running batch.
    pub running: &'static str,
    /// Requests waiting to be scheduled.
    pub waiting: &'static str,
    /// KV cache usage, a fraction.
    pub kv_usage: &'static str,
    /// An older name of `kv_usage`, read only when no sample has `kv_usage`'s name.
    pub kv_usage_legacy: Option<&'static str>,
    /// Its KV capacity.
    pub capacity: CapacityGauge,
    /// Its samples carry a `tp_rank` label, and ranks other than 0 repeat rank 0's.
    pub per_tp_rank: bool,
}

/// How an engine's `/metrics` gives its KV capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityGauge {
    /// A gauge of tokens (SGLang's `sglang:max_total_num_tokens`).
    Tokens(&'static str),
    /// An info gauge whose labels give the blocks and the tokens per block (vLLM's
    /// `vllm:cache_config_info`); also where its block size is read.
    BlockLabels {
        name: &'static str,
        blocks: &'static str,
        block_size: &'static str,
    },
}

impl MetricNames {
    /// Whether `name` is one of the load gauges (`running`, `waiting`, KV usage).
    pub fn is_load_gauge(&self, name: &str) -> bool {
        name == self.running
            || name == self.waiting
            || name == self.kv_usage
            || self.kv_usage_legacy == Some(name)
    }

    /// The KV block size (tokens) an exposition reports in the capacity gauge's
    /// block-size label; `None` for a capacity in tokens, or when none is reported.
    pub fn block_size(&self, text: &str) -> Option<u32> {
        let CapacityGauge::BlockLabels {
            name, block_size, ..
        } = self.capacity
        else {
            return None;
        };
        let line = text
            .lines()
            .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{')))?;
        let labels = &line[line.find('{')? + 1..line.rfind('}')?];
        labels.split(',').find_map(|pair| {
            let value = pair.trim().strip_prefix(block_size)?.strip_prefix('=')?;
            value.trim_matches('"').parse().ok()
        })
    }
}
