//! Workloads: what the clients send, as sessions of LLM calls with prompt block hashes.
//!
//! Readers turn the shipped traces into [`Workload`]s, generators synthesise agentic and
//! long-document sessions, and [`scale::scale_sessions`] multiplies a base workload into many
//! independent sessions. Everything here is pure and seeded (STYLE.md §5); the only IO is
//! reading trace files.
//!
//! # Layout
//! - `mod.rs`: the [`Workload`] types; `stats.rs`: [`WorkloadStats`]; `check.rs`: the
//!   contract as [`Workload::check`]; `error.rs`: [`WorkloadError`].
//! - `tokens.rs`: [`prompt_tokens`]; `context.rs`: a growing prompt that assigns block ids.
//! - Readers: `mooncake.rs`, `agentic.rs`, `azure.rs`, `gaps.rs` (over `jsonl.rs`).
//! - `arrivals.rs`, `scale.rs`, `dist.rs` (samplers).
//! - Generators: `coding_agent.rs`, `forked.rs`, `long_doc.rs`.

pub mod agentic;
pub mod arrivals;
pub mod azure;
mod check;
pub mod coding_agent;
mod context;
mod dist;
mod error;
pub mod forked;
pub mod gaps;
mod jsonl;
pub mod long_doc;
pub mod mooncake;
pub mod scale;
mod stats;
mod tokens;

#[cfg(test)]
mod tests;

pub use arrivals::Arrivals;
pub use azure::AzureRequest;
pub use check::Violation;
pub use error::{LineProblem, WorkloadError};
pub use stats::WorkloadStats;
pub use tokens::prompt_tokens;

pub use ownerserve_planner::lifecycle::Ending;

/// One LLM call of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Index within the session, as in the trace.
    pub turn: u32,
    /// The turn this continues (None for the first).
    pub parent: Option<u32>,
    /// Prompt length in tokens.
    pub input_tokens: u32,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// Prefix-chained ids of `Workload::hash_block`-token blocks of the prompt, the last one
    /// possibly partial: exactly ceil(input_tokens / hash_block) entries. Same id at the same
    /// position = same content (Mooncake convention). Ids are unique per content within a
    /// workload: distinct content never shares an id.
    pub hash_ids: Vec<u64>,
    /// Open loop: absolute arrival, ms from the start; closed loop: None.
    pub arrival_ms: Option<f64>,
    /// Closed loop: client wait (tool execution / think time) after this step's response
    /// before its session's next step.
    pub gap_after_ms: f64,
    /// Choices `n` (>= 1); > 1 means a forked rollout sent as one request.
    pub samples: u32,
    /// The step is an explicit fork of its session (`x-ownerserve-fork` header).
    pub fork: bool,
    /// How its response ends (a tool call or an answer), where the trace says: what the
    /// gap after it waits on, as the router reads it from the stream.
    pub ending: Ending,
}

#[cfg(test)]
impl Step {
    /// A first turn of `input_tokens` over `hash_ids`: one output token, no gap, one
    /// sample, not a fork, its ending unknown (tests set what differs).
    pub(crate) fn of(input_tokens: u32, hash_ids: Vec<u64>) -> Self {
        Self {
            turn: 0,
            parent: None,
            input_tokens,
            output_tokens: 1,
            hash_ids,
            arrival_ms: None,
            gap_after_ms: 0.0,
            samples: 1,
            fork: false,
            ending: Ending::Unknown,
        }
    }
}

/// Where a forked session branches off: an index into [`Workload::sessions`] and that
/// session's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForkOf {
    /// Index of the parent session in [`Workload::sessions`].
    pub session: usize,
    /// Index of the parent step in that session's `steps`.
    pub step: usize,
    /// The child starts after the parent step's tool gap (a forked rollout, once the tool
    /// ran); `false`: as soon as the step completes (a subagent its tool call spawned).
    pub after_gap: bool,
}

/// A sequence of dependent LLM calls from one client (a conversation or an agent run).
#[derive(Debug, Clone, PartialEq)]
pub struct Session {
    /// Unique within its workload.
    pub id: String,
    /// Closed loop: when the first step is sent (ignored if `fork_of` is Some).
    pub start_ms: f64,
    /// Closed loop: this session starts (its first step is sent) when step `step` of session
    /// `session` has completed. Used for forked rollouts: branches continue a parent's prefix.
    pub fork_of: Option<ForkOf>,
    /// The calls, in the order they are sent.
    pub steps: Vec<Step>,
}

/// How requests are paced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loop {
    /// Every step has an absolute arrival time, whatever the server does.
    Open,
    /// A session's next step is sent `gap_after_ms` after the previous response completes.
    Closed,
}

/// A named set of sessions with the block size their hash ids are computed over.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// Human-readable origin, e.g. the trace file stem or generator name.
    pub name: String,
    /// Tokens per hash block (512 for Mooncake, 16 for the engines' paged cache).
    pub hash_block: u32,
    /// Open or closed loop; see [`Loop`].
    pub looping: Loop,
    /// All sessions; [`ForkOf`] indexes into this.
    pub sessions: Vec<Session>,
}

impl Workload {
    /// Total LLM calls over all sessions.
    pub fn num_requests(&self) -> usize {
        self.sessions.iter().map(|s| s.steps.len()).sum()
    }

    /// Summary: sessions, requests, mean/p50/p99 input & output tokens, reuse ratio.
    pub fn stats(&self) -> WorkloadStats {
        stats::compute(self)
    }

    /// Checks the contract (hash id counts, arrival fields, unique ids, fork links) so a
    /// consumer can reject a hand-built or edited workload before running it.
    pub fn check(&self) -> Result<(), Violation> {
        check::check(self)
    }

    /// The names a client sends for step `step` of session `session`: the session the
    /// router sees (`x-session-id`) and, for a fork's first step, the child it starts
    /// (`x-ownerserve-fork`), which names the parent session. The simulator and the live
    /// replay both use this, so they route the same way.
    pub fn route_names(&self, session: usize, step: usize) -> (&str, Option<&str>) {
        let Some(s) = self.sessions.get(session) else {
            return ("", None);
        };
        let fork_step = step == 0 && s.steps.first().is_some_and(|st| st.fork);
        match s.fork_of.and_then(|f| self.sessions.get(f.session)) {
            Some(parent) if fork_step => (parent.id.as_str(), Some(s.id.as_str())),
            _ => (s.id.as_str(), None),
        }
    }

    /// Fork sessions by the step they start after: `(session, step)` → child sessions.
    pub fn forks_by_step(&self) -> std::collections::HashMap<(usize, usize), Vec<usize>> {
        let mut out: std::collections::HashMap<(usize, usize), Vec<usize>> =
            std::collections::HashMap::new();
        for (i, s) in self.sessions.iter().enumerate() {
            if let Some(f) = s.fork_of {
                out.entry((f.session, f.step)).or_default().push(i);
            }
        }
        out
    }

    /// Iterates over every step with its session index, in session then step order.
    pub fn steps(&self) -> impl Iterator<Item = (usize, &Step)> {
        self.sessions
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.steps.iter().map(move |st| (i, st)))
    }
}

/// Number of hash blocks a prompt of `tokens` tokens has: ceil(tokens / block).
pub fn blocks_for(tokens: u32, block: u32) -> usize {
    if block == 0 {
        return 0;
    }
    tokens.div_ceil(block) as usize
}
