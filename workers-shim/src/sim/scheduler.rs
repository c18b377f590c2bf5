//! The simulated engine's scheduler: continuous batching with chunked prefill over a paged
//! prefix cache, timed by the roofline. Pure: [`Scheduler::step`] takes the virtual time
//! and returns the work done, how long it took and what it produced; the shell sleeps.
//!
//! Each step (vLLM V1 style) first gives every running sequence the tokens it needs (one
//! for a decode, a chunk for a prefill) out of a token budget, preempting the newest running
//! sequence when blocks run out, then admits waiting sequences, reusing cached prefix
//! blocks so a prompt that shares a cached prefix only pays prefill for the rest.
//!
//! With a host tier (`host_blocks > 0`), blocks evicted from HBM are offloaded to host
//! DRAM, and an admitted prompt whose cached prefix continues there restores those blocks
//! instead of recomputing them. The copy is asynchronous, as vLLM's offloading connector
//! and LMCache load: the request holds its blocks and waits one step overhead plus
//! `restored bytes / PCIe bandwidth` before it computes, while the batch proceeds.
//!
//! Outside steps, the shell moves KV between engines through the methods in `transfer.rs`:
//! [`Scheduler::read_cached`] (the source's side of a transfer),
//! [`Scheduler::insert_cached`] (the receiver's), [`Scheduler::pin`] (a prefill leg's
//! blocks kept for a decode leg) and [`Scheduler::drop_cached`] (a demoted session's tail).

use std::collections::VecDeque;
use std::sync::Arc;

use ownerserve_planner::hash::BlockChain;
use ownerserve_planner::roofline::{prefill_pairs, Roofline, StepTime, StepWork};
use ownerserve_planner::spec::ModelSpec;

use super::block_pool::{BlockId, BlockPool};
use super::filler::Filler;
use crate::openai::response::FinishReason;

/// Limits of one engine (vLLM's scheduler config).
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    /// Tokens per KV block.
    pub block_size: u32,
    /// Token budget of one step (`max_num_batched_tokens`).
    pub max_num_batched_tokens: u32,
    /// Most prompt tokens one sequence may compute in a step while other sequences are
    /// running or waiting (vLLM's `long_prefill_token_threshold`, not adaptive); 0 = no
    /// cap beyond the step budget.
    pub long_prefill_token_threshold: u32,
    /// Most sequences running at once (`max_num_seqs`).
    pub max_num_seqs: u32,
    /// KV blocks available, from HBM minus weights.
    pub num_blocks: u32,
    /// Longest sequence (prompt + output).
    pub max_model_len: u32,
    /// Seed of the block hash chain.
    pub hash_seed: u64,
    /// Whether steps report cache changes ([`StepOutput::cache_events`]) for KV events.
    pub emit_cache_events: bool,
    /// KV blocks of the host-DRAM tier HBM evictions offload to (0: none).
    pub host_blocks: u32,
    /// Host-to-GPU bandwidth restores run at, bytes per second.
    pub pcie_bytes_per_s: f64,
    /// vLLM's `--scheduling-policy priority`: the waiting queue is ordered by (priority,
    /// arrival) and a preemption takes the running sequence of the largest (priority,
    /// arrival); `false` is `fcfs` (priorities ignored).
    pub priority_scheduling: bool,
}

impl SchedulerConfig {
    /// Checks that a sequence could ever run: it fits the context length and, alone, the
    /// KV cache (otherwise it would preempt itself forever).
    pub fn check(&self, prompt_len: usize, max_tokens: u32) -> Result<(), AdmitError> {
        if prompt_len + max_tokens as usize > self.max_model_len as usize {
            return Err(AdmitError::TooLong {
                max: self.max_model_len,
                prompt: prompt_len,
                max_tokens,
            });
        }
        let needed = (prompt_len + max_tokens as usize).div_ceil(self.block_size as usize);
        if needed > self.num_blocks as usize {
            return Err(AdmitError::ExceedsCache {
                needed,
                capacity: self.num_blocks as usize,
            });
        }
        Ok(())
    }

    /// Tokens a sequence may generate when the client sets no `max_tokens`: up to the
    /// context length (vLLM's default), and no more than the cache holds.
    pub fn default_max_tokens(&self, prompt_len: usize) -> u32 {
        let by_context = (self.max_model_len as usize).saturating_sub(prompt_len);
        let by_cache =
            (self.num_blocks as usize * self.block_size as usize).saturating_sub(prompt_len);
        by_context.min(by_cache) as u32
    }
}

/// Engine-wide id of one sequence (one choice of one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

/// A sequence to run.
#[derive(Debug, Clone)]
pub struct NewSeq {
    pub id: SeqId,
    pub prompt: Arc<[u32]>,
    pub max_tokens: u32,
    /// Output length at which the model emits end-of-sequence; `None` ignores EOS.
    pub eos_after: Option<u32>,
    pub stop: Arc<[String]>,
    /// Start of this sequence's stream of filler pieces.
    pub stream_seed: u64,
    /// Virtual time the request arrived, seconds.
    pub arrival_s: f64,
    /// vLLM's request priority: lower runs sooner (0 by default).
    pub priority: i32,
}

/// A sequence the engine cannot run at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error(
        "this model's maximum context length is {max} tokens, but {prompt} prompt tokens \
         plus {max_tokens} max_tokens were requested"
    )]
    TooLong {
        max: u32,
        prompt: usize,
        max_tokens: u32,
    },
    #[error("the prompt needs {needed} KV blocks but the cache has only {capacity}")]
    ExceedsCache { needed: usize, capacity: usize },
}

/// First admission of a sequence: how much of its prompt came from the cache.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    pub seq: SeqId,
    /// Prompt tokens not computed: found in HBM or restored from the host tier.
    pub cached_tokens: u32,
    /// Of those, the tokens restored from the host tier.
    pub restored_tokens: u32,
    pub queue_s: f64,
}

/// One generated token and the text it releases (held back while it might start a stop
/// string).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOut {
    pub seq: SeqId,
    pub token: u32,
    pub text: String,
    pub finish: Option<FinishReason>,
}

/// A change to the prefix cache, in the order it happened (for KV events).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive full blocks of one sequence became cached, chained under `parent`.
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
    },
    /// Cached blocks were evicted.
    Removed { hashes: Vec<u64> },
    /// Blocks evicted from HBM were offloaded to the host tier (`medium = "CPU"`). As
    /// vLLM's offloading connector does, the event names the blocks only: their chain and
    /// tokens are those of the HBM blocks they copy, announced before.
    HostStored { hashes: Vec<u64> },
    /// Blocks were evicted from the host tier.
    HostRemoved { hashes: Vec<u64> },
    /// The whole cache was dropped.
    Cleared,
}

/// What one step did.
#[derive(Debug, Clone, Default)]
pub struct StepOutput {
    pub work: StepWork,
    pub time: Option<StepTime>,
    pub admitted: Vec<Admission>,
    pub tokens: Vec<TokenOut>,
    pub preempted: u32,
    /// Cache changes, when the config asks for them.
    pub cache_events: Vec<CacheEvent>,
    /// Tokens restored from the host tier in this step.
    pub restored_tokens: u64,
    /// Seconds their copy over PCIe takes (the requests wait; the step does not).
    pub restore_s: f64,
    /// The earliest a restore under way lands, when one is: an engine with nothing else
    /// to do steps again then.
    pub idle_until_s: Option<f64>,
}

impl StepOutput {
    /// Seconds the step took (0 for an empty step).
    pub fn duration_s(&self) -> f64 {
        self.time.map_or(0.0, |t| t.total_s)
    }
}

#[derive(Debug)]
struct Seq {
    spec: NewSeq,
    tokens: Vec<u32>,
    num_output: u32,
    computed: usize,
    blocks: Vec<BlockId>,
    registered: usize,
    chain: BlockChain,
    /// Cached prefix blocks kept from eviction until the first admission (KV received for
    /// this sequence must still be there when it is scheduled).
    held: Vec<BlockId>,
    admitted_once: bool,
    text: String,
    sent: usize,
    /// Its restore from the host tier lands then (virtual s); it computes nothing before.
    ready_at_s: f64,
}

/// The engine's scheduling state.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    model: ModelSpec,
    roofline: Roofline,
    pool: BlockPool,
    filler: Filler,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    max_stop_len: usize,
    /// Hashes evicted during the current step.
    evicted: Vec<u64>,
}

impl Scheduler {
    /// An idle engine with an empty cache.
    pub fn new(cfg: SchedulerConfig, model: ModelSpec, roofline: Roofline) -> Self {
        Self {
            pool: BlockPool::with_host_tier(cfg.num_blocks, cfg.host_blocks),
            cfg,
            model,
            roofline,
            filler: Filler::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            max_stop_len: 0,
            evicted: Vec::new(),
        }
    }

    /// The limits this engine runs with.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// Whether there is nothing to do.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Sequences running (holding KV).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The KV cache.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Queues a sequence.
    pub fn add(&mut self, spec: NewSeq) -> Result<(), AdmitError> {
        self.add_inner(spec, false)
    }

    /// Queues a sequence and keeps its currently cached prefix from eviction until it is
    /// first admitted: used right after [`Self::insert_cached`] received its KV.
    pub fn add_holding_prefix(&mut self, spec: NewSeq) -> Result<(), AdmitError> {
        self.add_inner(spec, true)
    }

    fn add_inner(&mut self, spec: NewSeq, hold: bool) -> Result<(), AdmitError> {
        self.cfg.check(spec.prompt.len(), spec.max_tokens)?;
        self.max_stop_len = self
            .max_stop_len
            .max(spec.stop.iter().map(String::len).max().unwrap_or(0));
        let mut tokens = Vec::with_capacity(spec.prompt.len() + spec.max_tokens as usize);
        tokens.extend_from_slice(&spec.prompt);
        let mut chain = BlockChain::new(self.block_size(), self.cfg.hash_seed);
        let held = if hold {
            chain.extend_to(&tokens);
            self.pin(chain.hashes())
        } else {
            Vec::new()
        };
        self.enqueue(Seq {
            chain,
            held,
            spec,
            tokens,
            num_output: 0,
            computed: 0,
            blocks: Vec::new(),
            registered: 0,
            admitted_once: false,
            text: String::new(),
            sent: 0,
            ready_at_s: 0.0,
        });
        Ok(())
    }

    /// Puts a new sequence in the waiting queue: at the back (fcfs), or after every
    /// sequence that sorts before or with it by (priority, arrival) (vLLM's priority heap).
    fn enqueue(&mut self, seq: Seq) {
        if !self.cfg.priority_scheduling {
            self.waiting.push_back(seq);
            return;
        }
        let key = |s: &Seq| (s.spec.priority, s.spec.arrival_s);
        let at = self
            .waiting
            .iter()
            .rposition(|w| key(w) <= key(&seq))
            .map_or(0, |i| i + 1);
        self.waiting.insert(at, seq);
    }

    /// Puts a preempted sequence back: at the front (fcfs), else in its place by
    /// (priority, arrival) as vLLM re-adds it to the heap.
    fn requeue(&mut self, seq: Seq) {
        if self.cfg.priority_scheduling {
            self.enqueue(seq);
        } else {
            self.waiting.push_front(seq);
        }
    }

    /// The running sequence a preemption takes among those at `from..` (not yet
    /// scheduled this step): the last (fcfs), or the one of the largest (priority,
    /// arrival) (vLLM; it also considers sequences already scheduled in the step, which
    /// this engine leaves alone).
    fn victim(&self, from: usize) -> Option<usize> {
        if self.running.len() <= from {
            return None;
        }
        if !self.cfg.priority_scheduling {
            return Some(self.running.len() - 1);
        }
        (from..self.running.len()).max_by(|&a, &b| {
            let key = |i: usize| {
                (
                    self.running[i].spec.priority,
                    self.running[i].spec.arrival_s,
                )
            };
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        })
    }

    /// Drops every cached block (vLLM's `POST /reset_prefix_cache`). Refused (false) while
    /// requests hold blocks.
    pub fn reset_prefix_cache(&mut self) -> Option<CacheEvent> {
        self.pool.reset().then_some(CacheEvent::Cleared)
    }

    /// Drops a sequence (client gone), freeing its blocks. Returns whether it existed.
    pub fn abort(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.waiting.iter().position(|s| s.spec.id == id) {
            if let Some(seq) = self.waiting.remove(i) {
                self.unpin(&seq.held);
            }
            return true;
        }
        if let Some(i) = self.running.iter().position(|s| s.spec.id == id) {
            let mut seq = self.running.remove(i);
            self.free_blocks(&mut seq);
            return true;
        }
        false
    }

    fn release_holds(&mut self) {
        for seq in &mut self.waiting {
            self.pool.free(seq.held.drain(..).rev());
        }
    }

    fn block_size(&self) -> usize {
        self.cfg.block_size as usize
    }

    fn free_blocks(&mut self, seq: &mut Seq) {
        // Tail blocks first, so the least shareable content is evicted first (vLLM).
        self.pool.free(seq.blocks.drain(..).rev());
        seq.registered = 0;
    }

    /// Runs one engine step starting at virtual time `now_s`.
    pub fn step(&mut self, now_s: f64) -> StepOutput {
        let mut out = StepOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens as usize;
        let mut scheduled: Vec<(usize, usize)> = Vec::new();
        let cap = self.per_sequence_cap();

        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let seq = &self.running[i];
            if seq.ready_at_s > now_s {
                // Its restore is still copying: the batch goes on without it.
                i += 1;
                continue;
            }
            let n = (seq.tokens.len() - seq.computed).min(budget).min(cap);
            // Blocks taken at admission may already cover these tokens.
            let need = (seq.computed + n)
                .div_ceil(self.block_size())
                .saturating_sub(seq.blocks.len());
            if self.pool.num_free() < need {
                // Running work comes first: a waiting sequence's held prefix is only an
                // optimisation, and holding it could starve the engine.
                self.release_holds();
            }
            let mut preempted_self = false;
            while self.pool.num_free() < need {
                let Some(v) = self.victim(i) else {
                    break;
                };
                let mut victim = self.running.remove(v);
                preempted_self |= v == i;
                self.free_blocks(&mut victim);
                victim.computed = 0;
                self.requeue(victim);
                out.preempted += 1;
                if preempted_self {
                    break;
                }
            }
            if preempted_self || self.running.len() <= i {
                break;
            }
            // The loop above made `need` blocks free, so every allocation succeeds.
            for _ in 0..need {
                if let Some(b) = self.pool.allocate(&mut self.evicted) {
                    self.running[i].blocks.push(b);
                }
            }
            scheduled.push((i, n));
            budget -= n;
            i += 1;
        }

        if out.preempted == 0 {
            let restored_before = self.pool.host().restored();
            self.admit(now_s, cap, &mut budget, &mut scheduled, &mut out);
            out.restored_tokens =
                (self.pool.host().restored() - restored_before) * self.block_size() as u64;
        }

        for &(i, n) in &scheduled {
            let seq = &self.running[i];
            let decode = n == 1 && seq.computed + 1 == seq.tokens.len() && seq.num_output > 0;
            if decode {
                out.work.decode_seqs += 1;
                out.work.decode_context_tokens += seq.tokens.len() as u64;
            } else {
                out.work.prefill_tokens += n as u64;
                out.work.prefill_attention_pairs += prefill_pairs(n as u64, seq.computed as u64);
                out.work.prefill_context_tokens += seq.computed as u64;
            }
        }
        out.restore_s = self.restore_s(out.restored_tokens);
        if !out.work.is_empty() {
            out.time = Some(self.roofline.step_time(&self.model, &out.work));
        }
        out.idle_until_s = self
            .running
            .iter()
            .map(|s| s.ready_at_s)
            .filter(|&t| t > now_s)
            .min_by(f64::total_cmp);

        for &(i, n) in &scheduled {
            self.advance(i, n, &mut out);
        }
        let evicted = std::mem::take(&mut self.evicted);
        // Evictions happen while allocating, before this step stores anything.
        let mut events = self.eviction_events(evicted);
        events.append(&mut out.cache_events);
        out.cache_events = events;
        let finished: Vec<SeqId> = out
            .tokens
            .iter()
            .filter(|t| t.finish.is_some())
            .map(|t| t.seq)
            .collect();
        for id in finished {
            self.abort(id);
        }
        out
    }

    /// Most tokens one sequence may compute this step: the long-prefill threshold while
    /// another sequence is running or waiting (vLLM lifts it when a request is alone, as
    /// there is no one for it to starve).
    fn per_sequence_cap(&self) -> usize {
        let threshold = self.cfg.long_prefill_token_threshold as usize;
        if threshold > 0 && self.running.len() + self.waiting.len() > 1 {
            threshold
        } else {
            usize::MAX
        }
    }

    fn admit(
        &mut self,
        now_s: f64,
        cap: usize,
        budget: &mut usize,
        scheduled: &mut Vec<(usize, usize)>,
        out: &mut StepOutput,
    ) {
        let bs = self.block_size();
        while *budget > 0 && self.running.len() < self.cfg.max_num_seqs as usize {
            let Some(seq) = self.waiting.front_mut() else {
                break;
            };
            seq.chain.extend_to(&seq.tokens);
            let len = seq.tokens.len();
            let hashes = seq.chain.hashes().to_vec();
            let Some(got) = self.take_prefix(&hashes, len, (*budget).min(cap), out) else {
                break;
            };
            let (blocks, hit_blocks, restored, n) = got;
            let hit_tokens = (hit_blocks + restored) * bs;
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            seq.blocks = blocks;
            seq.computed = hit_tokens;
            seq.registered = hit_blocks + restored;
            // Its restored blocks copy in the background: it computes once they land.
            let restoring = restored > 0;
            if restoring {
                seq.ready_at_s = now_s + self.restore_s((restored * bs) as u64);
            }
            let held = std::mem::take(&mut seq.held);
            self.unpin(&held);
            if !seq.admitted_once {
                seq.admitted_once = true;
                out.admitted.push(Admission {
                    seq: seq.spec.id,
                    cached_tokens: hit_tokens as u32,
                    restored_tokens: (restored * bs) as u32,
                    queue_s: (now_s - seq.spec.arrival_s).max(0.0),
                });
            }
            self.running.push(seq);
            if !restoring {
                scheduled.push((self.running.len() - 1, n));
                *budget -= n;
            }
        }
    }

    /// Takes the blocks a waiting prompt of `len` tokens chained as `hashes` needs to run
    /// `n ≤ budget` tokens: its HBM-cached prefix, the host-tier blocks that continue it
    /// (restored into fresh blocks and announced as stored in HBM), and fresh blocks for
    /// the rest. Returns `(blocks, HBM hits, restored, n)`, or `None` (nothing held) when
    /// HBM lacks the room, or a host block was lost while making room (host LRU): the
    /// blocks restored before it stay cached in HBM, and the next step admits the prompt
    /// with them as hits.
    fn take_prefix(
        &mut self,
        hashes: &[u64],
        len: usize,
        budget: usize,
        out: &mut StepOutput,
    ) -> Option<(Vec<BlockId>, usize, usize, usize)> {
        let bs = self.block_size();
        // At least one token is always computed, to produce logits (vLLM does the same).
        let max_reuse = (len - 1) / bs;
        let hit = self.pool.longest_cached_prefix(hashes).min(max_reuse);
        let restore = self.pool.host_prefix(&hashes[hit..]).min(max_reuse - hit);
        let reused = (hit + restore) * bs;
        let n = (len - reused).min(budget);
        let total = (reused + n).div_ceil(bs);
        // vLLM 0.32 admits a waiting request only if its whole sequence fits
        // (`scheduler_reserve_full_isl`, on by default), counting the cached blocks it would
        // take off the free list; it touches nothing when it does not.
        let needed = len.div_ceil(bs) - hit + self.pool.free_cached(&hashes[..hit]);
        if needed > self.pool.num_free() {
            return None;
        }
        let mut blocks = Vec::with_capacity(total);
        blocks.extend(
            hashes[..hit]
                .iter()
                .filter_map(|&h| self.pool.acquire_cached(h)),
        );
        while blocks.len() < total {
            match self.pool.allocate(&mut self.evicted) {
                Some(b) => blocks.push(b),
                None => break,
            }
        }
        if blocks.len() == total && self.restore_into(&blocks, hashes, hit, restore, out) == restore
        {
            return Some((blocks, hit, restore, n));
        }
        self.pool.free(blocks.into_iter().rev());
        None
    }

    /// Restores host blocks `hashes[hit..hit + restore]` into `blocks` at the same places;
    /// returns how many it restored (fewer if the host tier lost one).
    fn restore_into(
        &mut self,
        blocks: &[BlockId],
        hashes: &[u64],
        hit: usize,
        restore: usize,
        out: &mut StepOutput,
    ) -> usize {
        let bs = self.block_size();
        let mut done = 0;
        for j in hit..hit + restore {
            if !self.pool.restore(blocks[j], hashes[j]) {
                break;
            }
            done += 1;
            if !self.cfg.emit_cache_events {
                continue;
            }
            let content = self.pool.content(hashes[j]);
            let tokens = content.map_or(&[][..], |c| c.tokens);
            match out.cache_events.last_mut() {
                Some(CacheEvent::Stored {
                    hashes: run,
                    tokens: run_tokens,
                    ..
                }) if j > hit && run.last() == Some(&hashes[j - 1]) => {
                    run.push(hashes[j]);
                    run_tokens.extend_from_slice(tokens);
                }
                _ => out.cache_events.push(CacheEvent::Stored {
                    hashes: vec![hashes[j]],
                    parent: j.checked_sub(1).map(|p| hashes[p]),
                    tokens: tokens.to_vec(),
                }),
            }
            debug_assert_eq!(tokens.len(), bs);
        }
        done
    }

    /// Seconds a step waits to copy `tokens` of KV from host memory: one step's fixed cost
    /// (vLLM's offloading connector loads asynchronously and runs the request in a step
    /// after the copy lands) plus the bytes over PCIe. 0 when nothing is restored.
    fn restore_s(&self, tokens: u64) -> f64 {
        if tokens == 0 || self.cfg.pcie_bytes_per_s <= 0.0 {
            return 0.0;
        }
        self.roofline.step_overhead_s()
            + tokens as f64 * self.model.kv_bytes_per_token() / self.cfg.pcie_bytes_per_s
    }

    /// The events of HBM evictions `evicted`: host-tier stores first (each names a block
    /// whose HBM copy the index still knows), host-tier removals, then the HBM removals.
    /// Drains the host tier's changes even when events are off.
    fn eviction_events(&mut self, evicted: Vec<u64>) -> Vec<CacheEvent> {
        let host = self.pool.take_host_changes();
        let mut events = Vec::new();
        if !self.cfg.emit_cache_events {
            return events;
        }
        if !host.stored.is_empty() {
            events.push(CacheEvent::HostStored {
                hashes: host.stored,
            });
        }
        if !host.removed.is_empty() {
            events.push(CacheEvent::HostRemoved {
                hashes: host.removed,
            });
        }
        if !evicted.is_empty() {
            events.push(CacheEvent::Removed { hashes: evicted });
        }
        events
    }

    /// Applies `n` computed tokens to running sequence `i`; samples when caught up.
    fn advance(&mut self, i: usize, n: usize, out: &mut StepOutput) {
        let bs = self.block_size();
        let seq = &mut self.running[i];
        seq.computed += n;
        seq.chain.extend_to(&seq.tokens[..seq.computed]);
        let full = seq.computed / bs;
        let mut stored: Option<CacheEvent> = None;
        for j in seq.registered..full {
            let hash = seq.chain.hashes()[j];
            let parent = j.checked_sub(1).map(|p| seq.chain.hashes()[p]);
            let block_tokens = &seq.tokens[j * bs..(j + 1) * bs];
            let fresh = self
                .pool
                .register(seq.blocks[j], hash, parent, block_tokens);
            if !(fresh && self.cfg.emit_cache_events) {
                continue;
            }
            match &mut stored {
                // Extends the run of blocks stored for this sequence in this step.
                Some(CacheEvent::Stored { hashes, tokens, .. })
                    if hashes.last()
                        == j.checked_sub(1).map(|p| seq.chain.hashes()[p]).as_ref() =>
                {
                    hashes.push(hash);
                    tokens.extend_from_slice(block_tokens);
                }
                _ => {
                    out.cache_events.extend(stored.take());
                    stored = Some(CacheEvent::Stored {
                        hashes: vec![hash],
                        parent,
                        tokens: block_tokens.to_vec(),
                    });
                }
            }
        }
        out.cache_events.extend(stored);
        seq.registered = full;
        let tokens = &mut out.tokens;
        if seq.computed < seq.tokens.len() {
            return;
        }
        let (piece, token) = self
            .filler
            .piece(seq.spec.stream_seed, seq.num_output as usize);
        seq.tokens.push(token);
        seq.num_output += 1;
        seq.text.push_str(piece);

        let mut finish = None;
        let mut end = seq.text.len();
        if let Some(pos) = first_stop(&seq.text, seq.sent, &seq.spec.stop) {
            finish = Some(FinishReason::Stop);
            end = pos.max(seq.sent);
        } else if seq.spec.eos_after == Some(seq.num_output) {
            finish = Some(FinishReason::Stop);
        } else if seq.num_output >= seq.spec.max_tokens
            || seq.tokens.len() >= self.cfg.max_model_len as usize
        {
            finish = Some(FinishReason::Length);
        } else if self.max_stop_len > 0 && !seq.spec.stop.is_empty() {
            // Hold back text that could be the start of a stop string.
            end = end.saturating_sub(self.max_stop_len - 1).max(seq.sent);
            while !seq.text.is_char_boundary(end) {
                end -= 1;
            }
        }
        let text = seq.text[seq.sent..end].to_owned();
        seq.sent = end;
        tokens.push(TokenOut {
            seq: seq.spec.id,
            token,
            text,
            finish,
        });
    }
}

/// Byte offset of the earliest stop string in `text` that ends after `sent` (text before
/// `sent` was checked already).
fn first_stop(text: &str, sent: usize, stop: &[String]) -> Option<usize> {
    stop.iter()
        .filter_map(|s| {
            let mut from = sent.saturating_sub(s.len());
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            text[from..].find(s.as_str()).map(|p| from + p)
        })
        .min()
}

mod transfer;
pub use transfer::{CacheUpdate, CachedRun};

#[cfg(test)]
mod tests;
