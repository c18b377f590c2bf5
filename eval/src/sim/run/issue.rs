//! Issuing a step: its view assembled through the planner's canonical step helpers
//! (`ownerserve_planner::step`), the policy's decision, the request charged in the
//! ledgers, and its legs started.

use std::sync::Arc;

use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::{Decision, Dispatch, WorkerView};
use ownerserve_planner::step::{self, Needs, Owned, StepInput, ViewSources};

use super::super::engine::Engine;
use super::super::stats::{Placement, StepRecord};
use crate::workload::prompt_tokens;

use super::*;

impl Sim<'_> {
    pub(super) fn issue(&mut self, session: usize, step: usize) {
        let wl = self.wl;
        let Some(st) = wl.sessions.get(session).and_then(|s| s.steps.get(step)) else {
            return;
        };
        let now = self.now_s;
        if !self.admitted(session, step, st.input_tokens) {
            return;
        }
        // A first step held for admission was sent when it first arrived.
        let arrived = std::mem::replace(&mut self.admission.waiting_since[session], f64::NAN);
        let arrived = if arrived.is_finite() { arrived } else { now };
        if !self.first_issue[session].is_finite() {
            self.first_issue[session] = arrived;
        }
        let prompt: Arc<[u32]> = prompt_tokens(st, wl.hash_block).into();
        let hashes = prompt_hashes(&prompt, self.block as usize, XXH3_SEED);
        let (route_session, _) = wl.route_names(session, step);
        let found = self
            .dir
            .lookup(Some(route_session), &hashes, u64::from(self.block));
        let cached: Vec<usize> = self
            .engines
            .iter()
            .map(|e| e.sched.cached_prefix(&hashes))
            .collect();
        let host: Vec<usize> = self
            .engines
            .iter()
            .zip(&cached)
            .map(|(e, &hbm)| e.sched.host_cached_after(&hashes, hbm))
            .collect();
        let needs = Needs::of(self.policy.as_ref());
        let mut views: Vec<WorkerView> = (0..self.engines.len())
            .map(|i| self.engines[i].view(i))
            .collect();
        let mut sources = SimSources {
            engines: &mut self.engines,
            cached: &cached,
            host: &host,
            idle: &self.idle,
            now_s: now,
        };
        step::complete_views(&mut views, needs, &mut sources);
        let input = StepInput {
            model: "",
            prompt_tokens: prompt.len() as u32,
            block_size: self.block,
            session: Some(route_session),
            now_ms: (now * 1e3) as u64,
            samples: st.samples.max(1),
            fork: st.fork,
        };
        let owned = Owned {
            owner: found.owner,
            artifact: found.artifact,
        };
        let route = step::route_request(input, owned, needs);
        let decision = match self.policy.choose(&route, &views) {
            Ok(d) => d,
            Err(_) => {
                self.reject(session, step, now, prompt.len() as u32);
                return;
            }
        };
        let worker = decision.worker.0 as usize;
        let max_tokens = st.output_tokens.max(1);
        if worker >= self.engines.len()
            || self.engines[worker]
                .sched
                .config()
                .check(prompt.len(), max_tokens)
                .is_err()
        {
            self.reject(session, step, now, prompt.len() as u32);
            return;
        }
        *self
            .actions
            .entry(decision.action().name().to_owned())
            .or_insert(0) += 1;
        self.count_hit(&decision, &cached);
        self.record_directory(session, decision.worker, &hashes);
        self.start_idle_tracking(session, worker, &hashes, now);
        self.lifecycle_return(session, &prompt, &hashes);

        let placement = placement_of(&decision, &views[worker]);
        // What the router charges: the prefix its view showed the policy (none for a
        // policy that does not match prefixes), not the engine's exact cache.
        let held = u64::from(views[worker].cached_blocks) * u64::from(self.block);
        let charged = self.engines[worker].ledger.start_request(
            &decision,
            route.prompt_blocks(),
            prompt.len() as u64,
            held,
        );

        let id = self.reqs.len();
        self.reqs.push(Some(Req {
            session,
            step,
            issued_s: arrived,
            prompt,
            hashes,
            worker,
            choices_left: st.samples.max(1),
            first_token_s: None,
            last_token_s: now,
            tokens: 0,
            cached_tokens: 0,
            restored_tokens: 0,
            prefilled_remotely: false,
            charged,
            leg_charged: None,
            decode_slot: None,
            phase: Phase::Decode,
            transit: None,
            predicted_prefill_s: calibrating_leg(&decision, &views, route.prompt_tokens),
            artifact_key: found.artifact_key,
            placement,
        }));
        match decision.dispatch {
            Dispatch::Single => self.submit(id, worker, false),
            Dispatch::Disaggregated { prefill } => {
                let p = prefill.0 as usize;
                if let Some(r) = self.reqs[id].as_mut() {
                    r.phase = Phase::Prefill {
                        prefill: p,
                        started_s: now,
                    };
                    self.engines[worker].ledger.heading(&mut r.charged);
                    // The router counts the leg against the prefill worker while it runs.
                    if let Some(e) = self.engines.get(p) {
                        let leg = e.ledger.start_prefill_leg(
                            &decision,
                            r.hashes.len() as u64,
                            u64::from(self.block),
                            r.prompt.len() as u64,
                        );
                        r.leg_charged = Some((p, leg));
                    }
                }
                self.submit_prefill_leg(id, p);
            }
            Dispatch::Fetch { source, tokens } => {
                self.start_transfer(id, source.0 as usize, tokens, Move::Fetch);
            }
            Dispatch::Migrate { source, tokens } => {
                let s = source.0 as usize;
                self.start_transfer(id, s, tokens, Move::Migrate { source: s });
            }
        }
    }

    /// A step no engine can run: answered with an error at once.
    pub(super) fn reject(&mut self, session: usize, step: usize, now: f64, prompt_tokens: u32) {
        self.steps.push(StepRecord {
            session,
            step,
            issued_s: now,
            ttft_s: f64::NAN,
            tpot_s: f64::NAN,
            latency_s: 0.0,
            prompt_tokens,
            cached_tokens: 0,
            restored_tokens: 0,
            rejected: true,
            placement: Default::default(),
        });
        self.step_completed(session, step, now);
    }

    /// Whether the step runs where its prefix's longest resident copy is.
    pub(super) fn count_hit(&mut self, d: &Decision, cached: &[usize]) {
        let best = cached.iter().copied().max().unwrap_or(0);
        if best == 0 {
            return;
        }
        let compute = match d.dispatch {
            Dispatch::Disaggregated { prefill } => prefill.0 as usize,
            _ => d.worker.0 as usize,
        };
        self.hits.1 += 1;
        if cached.get(compute).copied().unwrap_or(0) == best {
            self.hits.0 += 1;
        }
    }

    /// The directory writes the router makes for a routed step. A migration's prefix
    /// moves only once its KV has arrived (`arrived`), as the router flips it after the copy.
    pub(super) fn record_directory(&mut self, session: usize, worker: WorkerId, hashes: &[u64]) {
        // The router tracks the child a fork starts, else the session itself.
        let tracked = self.wl.sessions[session].id.as_str();
        self.dir.record(Some(tracked), hashes, worker);
    }
}

/// The preset's time for a remote prefill's leg, when its observed time will measure
/// the prefill worker's rate: the leg starts at once there (the router's rule,
/// `WorkerView::starts_prefill_now`).
fn calibrating_leg(d: &Decision, views: &[WorkerView], prompt_tokens: u32) -> Option<f64> {
    let Dispatch::Disaggregated { prefill } = d.dispatch else {
        return None;
    };
    let plan = d.plan.as_ref()?;
    views
        .iter()
        .find(|v| v.id == prefill)
        .filter(|v| v.starts_prefill_now(u64::from(prompt_tokens)))
        .map(|_| plan.chosen.preset_compute_s)
}

/// What a step's record says about where it ran, what its plan predicted and what the
/// router saw of its decode worker (`there`) when it placed it.
fn placement_of(d: &Decision, there: &WorkerView) -> Placement {
    let cost = d.plan.as_ref().map(|p| p.chosen.cost);
    let load = there.load.unwrap_or_default();
    Placement {
        action: Some(d.action().name()),
        decode_on: Some(there.id.0 as usize),
        prefill_on: match d.dispatch {
            Dispatch::Disaggregated { prefill } => Some(prefill.0 as usize),
            _ => None,
        },
        admit_wait_s: 0.0,
        planned_queue_s: cost.map_or(0.0, |c| c.queue_s),
        planned_compute_s: cost.map_or(0.0, |c| c.compute_s),
        planned_interference_s: cost.map_or(0.0, |c| c.interference_s),
        running_there: load.running as u32,
        planned_reused_tokens: d.plan.as_ref().map_or(0, |p| p.chosen.reused_tokens as u32),
        waiting_there: load.waiting as u32,
        kv_free_there: load.kv_free_tokens.unwrap_or(0),
        prefill_tokens_there: there.active_prefill_tokens,
        preempted_while_waiting: 0,
    }
}

/// The simulator's sources for `step::complete_views`: the engines' decodes (their
/// prompts' KV, as the live router's relay counts them), the prompt's exact cached prefix
/// on each engine, and the sessions idle on each.
struct SimSources<'s> {
    engines: &'s mut [Engine],
    /// The prompt's cached blocks on each engine.
    cached: &'s [usize],
    /// Its blocks past those the engine's host tier holds in a row (what the live
    /// router's index reads from the engines' `medium`).
    host: &'s [usize],
    idle: &'s [Idle],
    now_s: f64,
}

impl ViewSources for SimSources<'_> {
    fn decode_ages(&mut self, at: usize, _: &WorkerView) -> DecodeAges {
        self.engines[at].decodes.ages(self.now_s, 1.0)
    }

    fn fill_cached(&mut self, views: &mut [WorkerView]) {
        for ((v, &cached), &host) in views.iter_mut().zip(self.cached).zip(self.host) {
            v.cached_blocks = cached as u32;
            v.host_cached_blocks = host as u32;
        }
    }

    /// Per worker, the steps per second its parked sessions are expected to send: 1 /
    /// predicted gap of each session idle on it within its lease, once a gap was seen
    /// (the router's `Sessions::fill_parked_returns`).
    fn fill_parked_returns(&mut self, views: &mut [WorkerView]) {
        for i in self.idle {
            if i.in_flight > 0 || i.idle_since_s.is_none() {
                continue;
            }
            if let Some(v) = views.get_mut(i.owner) {
                v.parked_returns_per_s += i.lease.return_rate_per_s().unwrap_or(0.0);
            }
        }
    }
}
