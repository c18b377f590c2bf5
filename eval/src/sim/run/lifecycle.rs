//! The parked sessions' KV lifecycle in the simulator (`simulate --lifecycle`, the
//! `ownerserve` policy only), run as the router's sweep runs it
//! (`router/src/ownership/lifecycle.rs`): the same decision
//! (`ownerserve_planner::lifecycle::decide`) revised every second while a session waits, the
//! same per-session record (`SessionLife`), and touches and bring-backs sent to the owner's
//! engine as one-token requests of the session's last prompt, marked ahead of new prompts
//! (the engines run vLLM's priority policy). What the engine's cache really holds tells
//! the record when a kept session was evicted anyway (the router reads its KV index).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ownerserve_planner::ids::EngineKind;
use ownerserve_planner::lifecycle::gap::{PRIOR_MEDIAN_S, PRIOR_P90_S};
use ownerserve_planner::lifecycle::{
    decide, p_return, Churn, Effect, EndingGaps, GapEstimate, Hold, KvPlace, LifecycleWeights,
    OwnerKv, Parked, Prices, Returned, EVICTED_BELOW, REVISE_MS,
};
use ownerserve_shim::engines::protocol;
use ownerserve_shim::sim::scheduler::{NewSeq, SeqId};

use super::super::engine::Engine;
use super::super::events::Event;
use super::*;

/// The sweep's period, virtual seconds (the router's `SWEEP_EVERY`).
const SWEEP_S: f64 = 0.25;
/// The priority a returning step and a resend carry (`X-Vllm-Priority`).
pub(super) const RETURN_PRIORITY: i32 = -1;

/// The lifecycle's state across sessions: on or off, the fleet's gaps, how many parked
/// sessions came back, the resends in flight, each engine's churn, and counts.
#[derive(Debug, Default)]
pub(super) struct Lifecycle {
    pub on: bool,
    pub fleet_gaps: EndingGaps,
    pub came_back: u64,
    pub ended: u64,
    resends: HashMap<(usize, u64), Resend>,
    churn: HashMap<usize, Churn>,
    decisions: BTreeMap<&'static str, u64>,
    actions: BTreeMap<&'static str, u64>,
    /// Returning steps by where their KV was (`KvPlace::name`).
    found: BTreeMap<&'static str, u64>,
}

impl Lifecycle {
    pub fn new(on: bool) -> Self {
        Self {
            on,
            ..Self::default()
        }
    }

    /// New KV computed per second on `engine`, sampled at `now_s`.
    fn churn_of(&mut self, id: usize, engine: &Engine, now_s: f64) -> f64 {
        let total = engine.ledger.computed_total();
        self.churn.entry(id).or_default().sample(total, now_s)
    }

    fn returned(&mut self, found: Returned) {
        *self.found.entry(found.found.name()).or_insert(0) += 1;
    }

    /// What it did, for the run's result: decisions, resends and returns by kind.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        if !self.on {
            return out;
        }
        for (k, v) in &self.decisions {
            out.insert(format!("decided {k}"), *v);
        }
        for (k, v) in &self.actions {
            out.insert(format!("sent {k}"), *v);
        }
        for place in [KvPlace::Hbm, KvPlace::Host, KvPlace::Gone] {
            let n = self.found.get(place.name()).copied().unwrap_or(0);
            out.insert(format!("returned to {}", place.name()), n);
        }
        out
    }
}

/// One touch or bring-back in flight on an engine.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resend {
    session: usize,
    effect: Effect,
}

impl Sim<'_> {
    /// `session`'s step starts: its lifecycle record learns the gap and what it found.
    pub(super) fn lifecycle_return(&mut self, session: usize, prompt: &Arc<[u32]>, hashes: &[u64]) {
        if !self.lifecycle.on {
            return;
        }
        let i = &mut self.idle[session];
        // Pins (none on the sim engine) would be undone here.
        let (returned, _effects) = i.life.returned(true);
        i.prompt = Some(prompt.clone());
        i.hashes = hashes.to_vec();
        if let Some((_, found)) = returned {
            self.lifecycle.returned(found);
        }
    }

    /// `session` parked: its sweep starts.
    pub(super) fn lifecycle_park(&mut self, session: usize, now: f64) {
        if !self.lifecycle.on {
            return;
        }
        let generation = self.idle[session].generation;
        self.queue.push(
            now,
            Event::Lifecycle {
                session,
                generation,
            },
        );
    }

    /// One sweep of a parked session: note an eviction, decide or revise, send what is due.
    pub(super) fn lifecycle_sweep(&mut self, session: usize, generation: u64) {
        let i = &self.idle[session];
        if i.generation != generation || i.in_flight > 0 || i.idle_since_s.is_none() {
            return;
        }
        let (owner, since) = (i.owner, i.idle_since_s.unwrap_or(self.now_s));
        let now_ms = (self.now_s * 1e3) as u64;
        let churn = self
            .lifecycle
            .churn_of(owner, &self.engines[owner], self.now_s);
        if i.life.decided() && i.life.resident() && !i.hashes.is_empty() {
            let sched = &self.engines[owner].sched;
            let least = EVICTED_BELOW * i.hashes.len() as f64;
            let in_hbm = sched.cached_prefix(&i.hashes);
            if (in_hbm as f64) < least {
                // Evicted from HBM: into the host tier if it holds the rest now (the
                // engine offloads what HBM evicts), else gone.
                let on_host = sched.host_cached_after(&i.hashes, in_hbm);
                if ((in_hbm + on_host) as f64) >= least {
                    self.idle[session].life.offloaded();
                } else {
                    self.idle[session].life.evicted();
                }
            }
        }
        if self.idle[session].life.due_for_decision(now_ms, REVISE_MS) {
            self.lifecycle_decide(session, owner, churn, since, now_ms);
        }
        if let Some(effect) = self.idle[session].life.due(now_ms) {
            self.resend(session, owner, effect);
        }
        self.queue.push(
            self.now_s + SWEEP_S,
            Event::Lifecycle {
                session,
                generation,
            },
        );
    }

    fn lifecycle_decide(
        &mut self,
        session: usize,
        owner: usize,
        churn: f64,
        since: f64,
        now_ms: u64,
    ) {
        let e = &self.engines[owner];
        let pool = e.sched.pool();
        let block = u64::from(self.block);
        let host = pool.host();
        let mut levers = protocol(EngineKind::Sim).levers();
        levers.host_tier = host.is_enabled();
        let tokens = self.idle[session]
            .prompt
            .as_ref()
            .map_or(0, |p| p.len() as u64);
        let prices = Prices::of(
            &e.roofline,
            &self.model,
            tokens,
            u64::from(e.sched.config().max_num_batched_tokens),
            e.sched.config().pcie_bytes_per_s,
        );
        let kv = OwnerKv {
            levers,
            capacity_tokens: pool.capacity() as u64 * block,
            usage: pool.usage(),
            churn_tokens_per_s: churn,
            host_free_tokens: (host.capacity().saturating_sub(host.len())) as u64 * block,
            kept_tokens: self.kept_tokens(owner, session),
        };
        let prior = self.lifecycle.fleet_gaps.estimate(
            self.idle[session].life.ending,
            GapEstimate::from_median_p90(PRIOR_MEDIAN_S, PRIOR_P90_S),
        );
        let mut parked = Parked {
            context_tokens: tokens,
            gap: self.idle[session].life.gap(prior),
            idle_s: (self.now_s - since).max(0.0),
            p_return: p_return(self.lifecycle.came_back, self.lifecycle.ended),
            resident: self.idle[session].life.resident(),
        };
        if self.opts.lifecycle_oracle {
            // The true gap as a point mass, and a sure return or end.
            let next = self.idle[session].next_issue_s;
            let gap_s = next.map_or(f64::INFINITY, |at| (at - since).max(1e-3));
            parked.gap = GapEstimate::from_median_p90(gap_s, gap_s);
            parked.p_return = if next.is_some() { 1.0 } else { 0.0 };
        }
        let l = decide(&parked, &kv, &prices, &LifecycleWeights::default());
        let (changed, _effects) = self.idle[session].life.decide(l, levers.retention, now_ms);
        if changed {
            *self.lifecycle.decisions.entry(l.hold.name()).or_insert(0) += 1;
        }
    }

    /// Tokens of `owner`'s parked sessions other than `except` kept (or to be brought
    /// back) in its HBM (the router's `Sessions::undecided`).
    fn kept_tokens(&self, owner: usize, except: usize) -> u64 {
        self.idle
            .iter()
            .enumerate()
            .filter(|&(s, i)| {
                s != except
                    && i.owner == owner
                    && i.in_flight == 0
                    && matches!(i.life.hold(), Some(Hold::Keep | Hold::Prefetch))
            })
            .map(|(_, i)| i.prompt.as_ref().map_or(0, |p| p.len() as u64))
            .sum()
    }

    /// A touch, prefetch or restore: the session's last prompt, one token, ahead of new
    /// prompts.
    fn resend(&mut self, session: usize, owner: usize, effect: Effect) {
        let Some(prompt) = self.idle[session].prompt.clone() else {
            return;
        };
        let e = &mut self.engines[owner];
        let seq = e.next_seq;
        e.next_seq += 1;
        let spec = NewSeq {
            id: SeqId(seq),
            prompt,
            max_tokens: 1,
            eos_after: None,
            stop: Arc::from(Vec::<String>::new()),
            stream_seed: seq,
            arrival_s: self.now_s,
            priority: RETURN_PRIORITY,
        };
        if e.sched.add(spec).is_ok() {
            self.lifecycle
                .resends
                .insert((owner, seq), Resend { session, effect });
            *self.lifecycle.actions.entry(effect.name()).or_insert(0) += 1;
            self.kick(owner);
        }
    }

    /// A resend's sequence produced its token: a bring-back has landed.
    pub(super) fn resend_done(&mut self, worker: usize, seq: u64) -> bool {
        let Some(r) = self.lifecycle.resends.remove(&(worker, seq)) else {
            return false;
        };
        if matches!(r.effect, Effect::Recompute | Effect::Restore) {
            self.idle[r.session].life.brought_back();
        }
        true
    }
}
