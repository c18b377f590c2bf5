//! The lower bound: per step, what no placement policy can beat on a given workload and
//! cluster in the simulator's engine model. The report shows it as the `bound` row next
//! to the policies; `bound::tests` checks every policy against it step by step.
//!
//! A step's first token needs its prompt's *genuinely new* tokens prefilled: every token
//! except the longest prefix it shares with a step that may have run before it (any step
//! of another session, an earlier step of its own, but never a later step of its own or a
//! fork that starts after it). The engine reuses whole cached blocks only and always
//! computes at least one token. On an otherwise idle worker of the fastest kind in the
//! fleet those tokens take at least one roofline step per `max_num_batched_tokens` chunk:
//! for any chunking, `Σ max(compute_i, memory_i) ≥ max(Σ compute_i, Σ memory_i)`, the
//! attention work is the same however the prompt is split, and every chunk rereads the
//! context. Each later output token is one decode step at batch 1, the cheapest step that
//! produces it. Queueing, KV transfers, preemption and batching with other requests only
//! add to these times, so `actual ≥ bound` holds step by step, hence for every percentile
//! and for session task times (a closed-loop session is its steps' bounds plus its tool
//! gaps). Nothing is bounded from above: the duplicate factor floor is 1 and KV moved 0.

use std::collections::HashMap;

use ownerserve_planner::roofline::{prefill_pairs, StepWork};
use ownerserve_shim::sim::config::SimConfig;

use crate::sim::{Cluster, ClusterError, KvBytes, RunResult, StepRecord};
use crate::workload::{Loop, Workload};

/// The name of the bound's row in reports.
pub const BOUND: &str = "bound";

/// The lower bound of every step of `workload` on `cluster`, as a [`RunResult`] the report
/// tabulates like a policy's run (policy [`BOUND`]).
pub fn lower_bound(workload: &Workload, cluster: &Cluster) -> Result<RunResult, ClusterError> {
    let started = std::time::Instant::now();
    let configs = cluster.build()?;
    let shared = SharedPrefixes::new(workload);
    // Per session, per step: the step's bound, or None if no worker can take it.
    let mut times: Vec<Vec<Option<StepTimes>>> = Vec::with_capacity(workload.sessions.len());
    for (si, s) in workload.sessions.iter().enumerate() {
        let row = s
            .steps
            .iter()
            .enumerate()
            .map(|(k, st)| {
                let shared_tokens = shared.tokens(workload, si, k);
                step_times(&configs, st.input_tokens, st.output_tokens, shared_tokens)
            })
            .collect();
        times.push(row);
    }
    let issued = issue_times(workload, &times);
    let mut steps = Vec::new();
    let mut session_e2e_s = Vec::new();
    let (mut begin, mut end) = (f64::INFINITY, f64::NEG_INFINITY);
    for (si, s) in workload.sessions.iter().enumerate() {
        let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
        for (k, st) in s.steps.iter().enumerate() {
            let at = issued[si][k];
            let record = match times[si][k] {
                Some(t) if at.is_finite() => {
                    first = first.min(at);
                    last = last.max(at + t.latency_s);
                    StepRecord {
                        session: si,
                        step: k,
                        issued_s: at,
                        ttft_s: t.ttft_s,
                        tpot_s: t.tpot_s,
                        latency_s: t.latency_s,
                        prompt_tokens: st.input_tokens,
                        cached_tokens: t.cached_tokens,
                        restored_tokens: 0,
                        rejected: false,
                        placement: Default::default(),
                    }
                }
                _ => StepRecord {
                    session: si,
                    step: k,
                    issued_s: at,
                    ttft_s: f64::NAN,
                    tpot_s: f64::NAN,
                    latency_s: 0.0,
                    prompt_tokens: st.input_tokens,
                    cached_tokens: 0,
                    restored_tokens: 0,
                    rejected: true,
                    placement: Default::default(),
                },
            };
            steps.push(record);
        }
        if first.is_finite() && last.is_finite() {
            session_e2e_s.push(last - first);
            begin = begin.min(first);
            end = end.max(last);
        }
    }
    Ok(RunResult {
        policy: BOUND.to_owned(),
        cluster: cluster.name.clone(),
        workload: workload.name.clone(),
        steps,
        session_e2e_s,
        kv_bytes: KvBytes::default(),
        duplicate_factor: 1.0,
        duplicate_factor_decoders: 1.0,
        duplicate_series: Vec::new(),
        owner_hit_rate: f64::NAN,
        decode_interference: f64::NAN,
        gpu_busy: f64::NAN,
        actions: Default::default(),
        preemptions: 0,
        makespan_s: if begin.is_finite() { end - begin } else { 0.0 },
        wall_s: started.elapsed().as_secs_f64(),
        host_restored_bytes: 0,
        lifecycle: Default::default(),
    })
}

/// The bound of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
struct StepTimes {
    ttft_s: f64,
    /// NaN with fewer than two output tokens, as the simulator records it.
    tpot_s: f64,
    latency_s: f64,
    /// Prompt tokens the best worker could have found cached.
    cached_tokens: u32,
}

/// The bound of a step of `input` prompt tokens, `output` generated tokens and a prefix of
/// `shared` tokens that other steps may have computed, over the fleet's workers.
fn step_times(configs: &[SimConfig], input: u32, output: u32, shared: u64) -> Option<StepTimes> {
    let len = u64::from(input);
    let out = output.max(1);
    // (ttft, cached tokens) of the best worker that can prefill the prompt.
    let prefill = configs
        .iter()
        .filter(|c| c.scheduler.check(input as usize, 1).is_ok())
        .map(|c| prefill_time(c, len, shared))
        .min_by(|a, b| a.0.total_cmp(&b.0))?;
    let decode = configs
        .iter()
        .filter(|c| c.scheduler.check(input as usize, out).is_ok())
        .map(|c| decode_time(c, len, u64::from(out) - 1))
        .min_by(f64::total_cmp)?;
    Some(StepTimes {
        ttft_s: prefill.0,
        tpot_s: if out > 1 {
            decode / f64::from(out - 1)
        } else {
            f64::NAN
        },
        latency_s: prefill.0 + decode,
        cached_tokens: prefill.1 as u32,
    })
}

/// The least time worker `c` needs to compute the first token of a `len`-token prompt of
/// which at most `shared` tokens can be cached, and the tokens it finds cached.
fn prefill_time(c: &SimConfig, len: u64, shared: u64) -> (f64, u64) {
    let bs = u64::from(c.scheduler.block_size.max(1));
    // Whole blocks only, and at least one token computed (the scheduler's rule).
    let cached = (shared.min(len) / bs).min(len.saturating_sub(1) / bs) * bs;
    let new = len - cached;
    let one_pass = c.roofline.step_time(
        &c.model,
        &StepWork {
            prefill_tokens: new,
            prefill_attention_pairs: prefill_pairs(new, cached),
            prefill_context_tokens: cached,
            ..StepWork::default()
        },
    );
    let chunks = new.div_ceil(u64::from(c.scheduler.max_num_batched_tokens.max(1)));
    let overhead = one_pass.total_s - one_pass.compute_s.max(one_pass.memory_s);
    (
        one_pass.total_s + overhead * chunks.saturating_sub(1) as f64,
        cached,
    )
}

/// The least time worker `c` needs for `steps` decode steps after a `len`-token prompt:
/// step `k` reads `len + k` tokens of KV. Compute and memory time are linear in the
/// context, so each sums as an arithmetic series.
fn decode_time(c: &SimConfig, len: u64, steps: u64) -> f64 {
    if steps == 0 {
        return 0.0;
    }
    let at = |k: u64| {
        c.roofline.step_time(
            &c.model,
            &StepWork {
                decode_seqs: 1,
                decode_context_tokens: len + k,
                ..StepWork::default()
            },
        )
    };
    let (a, b) = (at(1), at(steps));
    let n = steps as f64;
    let overhead = a.total_s - a.compute_s.max(a.memory_s);
    let compute = n * (a.compute_s + b.compute_s) / 2.0;
    let memory = n * (a.memory_s + b.memory_s) / 2.0;
    compute.max(memory) + n * overhead
}

/// When each step is issued if every step before it took its bound: open loop at its
/// arrival, closed loop after the previous step and its tool gap (a fork after its parent
/// step). NaN for steps that follow a step no worker can take.
fn issue_times(workload: &Workload, times: &[Vec<Option<StepTimes>>]) -> Vec<Vec<f64>> {
    let mut issued: Vec<Vec<f64>> = workload
        .sessions
        .iter()
        .map(|s| vec![f64::NAN; s.steps.len()])
        .collect();
    if workload.looping == Loop::Open {
        for (si, s) in workload.sessions.iter().enumerate() {
            for (k, st) in s.steps.iter().enumerate() {
                issued[si][k] = st.arrival_ms.unwrap_or(s.start_ms) / 1e3;
            }
        }
        return issued;
    }
    // Closed loop: a session can start once its parent's fork step has a time; sweep until
    // nothing changes (forks nest shallowly; a cycle, which `Workload::check` does not
    // rule out, leaves its sessions at NaN).
    let mut done = vec![false; workload.sessions.len()];
    loop {
        let mut progressed = false;
        for (si, s) in workload.sessions.iter().enumerate() {
            if done[si] {
                continue;
            }
            let start = match s.fork_of {
                None => s.start_ms / 1e3,
                Some(f) if done.get(f.session) == Some(&true) => {
                    let parent = &workload.sessions[f.session];
                    let gap = match f.after_gap {
                        true => parent.steps[f.step].gap_after_ms.max(0.0) / 1e3,
                        false => 0.0,
                    };
                    match times[f.session][f.step] {
                        Some(t) => issued[f.session][f.step] + t.latency_s + gap,
                        None => f64::NAN,
                    }
                }
                Some(_) => continue,
            };
            let mut at = start;
            for (k, st) in s.steps.iter().enumerate() {
                issued[si][k] = at;
                at = match times[si][k] {
                    Some(t) => at + t.latency_s + st.gap_after_ms.max(0.0) / 1e3,
                    None => f64::NAN,
                };
            }
            done[si] = true;
            progressed = true;
        }
        if !progressed {
            return issued;
        }
    }
}

/// Every step's prompt blocks in one trie, with which sessions pass through each node
/// (and their earliest step there), to find the longest prefix a step shares with the
/// steps that may have run before it.
struct SharedPrefixes {
    /// (parent node, block id) → node; node 0 is the root.
    children: HashMap<(u32, u64), u32>,
    /// Per node: the sessions whose prompts pass through it, each with its first step
    /// there, in the order sessions were inserted.
    passers: Vec<Vec<(u32, u32)>>,
    /// Per session: its fork parent and the step it forks after.
    fork_of: Vec<Option<(usize, usize)>>,
}

impl SharedPrefixes {
    fn new(workload: &Workload) -> Self {
        let mut children = HashMap::new();
        let mut passers: Vec<Vec<(u32, u32)>> = vec![Vec::new()];
        for (si, s) in workload.sessions.iter().enumerate() {
            for (k, st) in s.steps.iter().enumerate() {
                let mut node = 0u32;
                for &id in &st.hash_ids {
                    let next = passers.len() as u32;
                    node = *children.entry((node, id)).or_insert(next);
                    if node == next {
                        passers.push(Vec::new());
                    }
                    let here = &mut passers[node as usize];
                    // Sessions are inserted one after another, so this session's entry,
                    // if any, is the last one and already holds its earliest step.
                    if here.last().map(|e| e.0) != Some(si as u32) {
                        here.push((si as u32, k as u32));
                    }
                }
            }
        }
        let fork_of = workload
            .sessions
            .iter()
            .map(|s| s.fork_of.map(|f| (f.session, f.step)))
            .collect();
        Self {
            children,
            passers,
            fork_of,
        }
    }

    /// Whether every step of session `t` is issued after step `k` of session `s`
    /// completes: `t` descends from `s` through a fork at step `k` or later.
    fn starts_after(&self, t: usize, s: usize, k: usize) -> bool {
        let mut child = t;
        // Bounded walk up the fork chain (a cycle must not loop forever).
        for _ in 0..self.fork_of.len() {
            match self.fork_of.get(child).copied().flatten() {
                Some((parent, step)) if parent == s => return step >= k,
                Some((parent, _)) => child = parent,
                None => return false,
            }
        }
        false
    }

    /// Tokens of step `k` of session `s` that some step which may run before it also has
    /// as a prefix (an over-estimate within the last shared block, which keeps the bound
    /// a bound).
    fn tokens(&self, workload: &Workload, s: usize, k: usize) -> u64 {
        let Some(step) = workload.sessions.get(s).and_then(|x| x.steps.get(k)) else {
            return 0;
        };
        let may_precede = |&(t, j): &(u32, u32)| {
            let t = t as usize;
            if t == s {
                (j as usize) < k
            } else {
                !self.starts_after(t, s, k)
            }
        };
        let mut node = 0u32;
        let mut blocks = 0u64;
        for &id in &step.hash_ids {
            let Some(&next) = self.children.get(&(node, id)) else {
                break;
            };
            if !self.passers[next as usize].iter().any(may_precede) {
                break;
            }
            node = next;
            blocks += 1;
        }
        (blocks * u64::from(workload.hash_block)).min(u64::from(step.input_tokens))
    }
}

#[cfg(test)]
mod tests;
