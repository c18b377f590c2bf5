//! The discrete-event loop: clients issue steps (open loop at their arrival, closed loop
//! after the previous step and its tool gap), the policy places each step exactly as the
//! live router does, and the engines step in virtual time.

mod admission;
mod idle;
mod issue;
mod lifecycle;
mod transit;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::ids::Role;
use ownerserve_planner::policy::Policy;
use ownerserve_planner::roofline::Roofline;
use ownerserve_planner::spec::ModelSpec;
use ownerserve_planner::step::Charged;
use ownerserve_shim::sim::config::SimConfig;
use ownerserve_shim::sim::scheduler::CachedRun;

use super::directory::SimDirectory;
use super::engine::Engine;
use super::events::{Event, Queue};
use super::residency::FleetResidency;
use super::stats::{KvBytes, Placement, RunResult, StepRecord};
use super::SimOptions;
use crate::workload::{Loop, Workload};

/// Where a request is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Its prefill leg runs on `prefill`.
    Prefill { prefill: usize, started_s: f64 },
    /// Its KV is on the way to the decode worker.
    Transfer,
    /// It runs on its decode worker.
    Decode,
}

/// Why KV moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    PrefillToDecode,
    Fetch,
    Migrate { source: usize },
}

/// KV on its way to a request's decode worker.
#[derive(Debug)]
struct InTransit {
    /// Leading blocks the decode worker had already.
    local: usize,
    run: CachedRun,
    why: Move,
    /// Blocks the receiving worker holds for the copy while it is in flight.
    reserved: Vec<ownerserve_shim::sim::block_pool::BlockId>,
}

/// One step in flight.
#[derive(Debug)]
struct Req {
    session: usize,
    step: usize,
    issued_s: f64,
    prompt: Arc<[u32]>,
    hashes: Vec<u64>,
    worker: usize,
    choices_left: u32,
    first_token_s: Option<f64>,
    last_token_s: f64,
    tokens: u32,
    cached_tokens: u32,
    /// Of those, restored from the computing worker's host tier.
    restored_tokens: u32,
    /// `cached_tokens` came from a prefill worker's leg.
    prefilled_remotely: bool,
    /// What it is counted for in its decode worker's ledger, from issue to its end: its
    /// KV blocks, its prefill until the first token (`Ledger::start_request`), and its
    /// decode leg as heading there until its KV arrives.
    charged: Charged,
    /// What the prefill leg counts against its prefill worker until it finishes, as the
    /// router does while a NIXL prefill leg runs (`Ledger::start_prefill_leg`).
    leg_charged: Option<(usize, Charged)>,
    /// Its slot among its decode worker's decodes, from its first token.
    decode_slot: Option<usize>,
    phase: Phase,
    transit: Option<InTransit>,
    /// The preset's time for its remote prefill leg, when that leg calibrates
    /// (`calibrating_leg`).
    predicted_prefill_s: Option<f64>,
    /// The prefix key a migration moves in the directory.
    artifact_key: Option<u64>,
    /// Where it runs and what its plan predicted (completed at first admission).
    placement: Placement,
}

/// Idle tracking of one session (the router's `Sessions`).
#[derive(Debug, Clone)]
struct Idle {
    lease: GapLease,
    in_flight: u32,
    idle_since_s: Option<f64>,
    generation: u64,
    owner: usize,
    tail: Vec<u64>,
    /// Its KV lifecycle (`simulate --lifecycle`), and what a resend re-sends.
    life: ownerserve_planner::lifecycle::SessionLife,
    prompt: Option<Arc<[u32]>>,
    hashes: Vec<u64>,
    /// When its next step is sent (None: it ended), for `SimOptions::lifecycle_oracle`.
    next_issue_s: Option<f64>,
    /// Its context, tokens: its last step's prompt.
    tokens: u64,
}

/// The whole simulation state.
pub(crate) struct Sim<'w> {
    wl: &'w Workload,
    opts: &'w SimOptions,
    engines: Vec<Engine>,
    policy: Box<dyn Policy>,
    queue: Queue,
    reqs: Vec<Option<Req>>,
    seqs: HashMap<(usize, u64), usize>,
    dir: SimDirectory,
    idle: Vec<Idle>,
    /// Child sessions to start when a step completes, by (session, step).
    forks: HashMap<(usize, usize), Vec<usize>>,
    residency: FleetResidency,
    block: u32,
    model: ModelSpec,
    // Measurements.
    steps: Vec<StepRecord>,
    first_issue: Vec<f64>,
    last_done: Vec<f64>,
    kv: KvBytes,
    hits: (u64, u64),
    decode_steps: [(f64, u64); 2],
    actions: BTreeMap<String, u64>,
    preemptions: u64,
    host_restored_bytes: u64,
    kv_bytes_per_token: u64,
    /// The parked sessions' KV lifecycle (`ownerserve` with `SimOptions::lifecycle`).
    lifecycle: lifecycle::Lifecycle,
    /// Session admission (`ownerserve` with `SimOptions::admission`).
    admission: admission::Admission,
    now_s: f64,
}

impl<'w> Sim<'w> {
    /// Whether the engines can pull KV from a peer (`Cluster::peer_pulls`).
    pub fn set_peer_pulls(&mut self, pulls: bool) {
        for e in &mut self.engines {
            e.pulls_kv = pulls;
        }
    }

    pub fn new(
        wl: &'w Workload,
        model: ModelSpec,
        configs: &[SimConfig],
        roles: &[Role],
        believed: Vec<Roofline>,
        policy: Box<dyn Policy>,
        opts: &'w SimOptions,
    ) -> Self {
        // The lifecycle is the router's (`ownerserve`): its engines run vLLM's priority
        // policy so a returning step goes ahead of new prompts.
        let policy_is_ownerserve = policy.name() == "ownerserve";
        let lifecycle_on = opts.lifecycle && policy_is_ownerserve;
        let engines: Vec<Engine> = configs
            .iter()
            .zip(roles)
            .zip(believed)
            .map(|((c, &r), b)| Engine::new(c, r, lifecycle_on, b))
            .collect();
        let block = configs.first().map_or(16, |c| c.scheduler.block_size);
        let template = GapLease::new(opts.lease_factor, opts.lease_min_ms, opts.lease_max_ms);
        let n = wl.sessions.len();
        let kv_bytes_per_token = model.kv_bytes_per_token() as u64;
        Self {
            wl,
            opts,
            engines,
            policy,
            queue: Queue::default(),
            reqs: Vec::new(),
            seqs: HashMap::new(),
            dir: SimDirectory::default(),
            idle: vec![
                Idle {
                    lease: template,
                    in_flight: 0,
                    idle_since_s: None,
                    generation: 0,
                    owner: 0,
                    tail: Vec::new(),
                    life: Default::default(),
                    prompt: None,
                    next_issue_s: None,
                    tokens: 0,
                    hashes: Vec::new(),
                };
                n
            ],
            forks: wl.forks_by_step(),
            residency: FleetResidency::new(opts.sample_every_s),
            block,
            model,
            steps: Vec::new(),
            first_issue: vec![f64::NAN; n],
            last_done: vec![f64::NAN; n],
            kv: KvBytes::default(),
            hits: (0, 0),
            decode_steps: [(0.0, 0); 2],
            actions: BTreeMap::new(),
            preemptions: 0,
            host_restored_bytes: 0,
            kv_bytes_per_token,
            lifecycle: lifecycle::Lifecycle::new(lifecycle_on),
            admission: admission::Admission::new(
                opts.admission && policy_is_ownerserve,
                opts.admission_headroom,
                n,
            ),
            now_s: 0.0,
        }
    }

    /// Runs every step of the workload to completion; `progress` gets completed steps.
    pub fn run(mut self, progress: &dyn Fn(u64)) -> RunResult {
        let started = std::time::Instant::now();
        for (i, s) in self.wl.sessions.iter().enumerate() {
            match self.wl.looping {
                Loop::Open => {
                    for (k, step) in s.steps.iter().enumerate() {
                        let at = step.arrival_ms.unwrap_or(s.start_ms) / 1e3;
                        self.queue.push(
                            at,
                            Event::Issue {
                                session: i,
                                step: k,
                            },
                        );
                    }
                }
                Loop::Closed if s.fork_of.is_none() && !s.steps.is_empty() => {
                    self.queue.push(
                        s.start_ms / 1e3,
                        Event::Issue {
                            session: i,
                            step: 0,
                        },
                    );
                }
                Loop::Closed => {}
            }
        }
        let mut done = 0u64;
        while let Some((at, event)) = self.queue.pop() {
            self.now_s = at;
            match event {
                Event::Issue { session, step } => self.issue(session, step),
                Event::StepEnd { worker } => {
                    let before = self.steps.len();
                    self.step_end(worker);
                    if self.steps.len() != before {
                        done += (self.steps.len() - before) as u64;
                        progress(done);
                    }
                }
                Event::Arrived { req } => self.arrived(req),
                Event::IdleCheck {
                    session,
                    generation,
                } => self.idle_check(session, generation),
                Event::Lifecycle {
                    session,
                    generation,
                } => self.lifecycle_sweep(session, generation),
            }
        }
        self.finish(started)
    }

    fn finish(mut self, started: std::time::Instant) -> RunResult {
        let end = self
            .last_done
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max);
        let begin = self
            .first_issue
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f64::INFINITY, f64::min);
        let makespan = if begin.is_finite() { end - begin } else { 0.0 };
        let busy: f64 = self.engines.iter().map(|e| e.busy_s).sum();
        let [(mixed_s, mixed_n), (pure_s, pure_n)] = self.decode_steps;
        let interference = if mixed_n > 0 && pure_n > 0 {
            (mixed_s / mixed_n as f64) / (pure_s / pure_n as f64)
        } else {
            f64::NAN
        };
        let session_e2e_s = self
            .first_issue
            .iter()
            .zip(&self.last_done)
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .map(|(a, b)| b - a)
            .collect();
        let duplicate_factor = self.residency.all.factor(end);
        let duplicate_factor_decoders = self.residency.decoders.factor(end);
        RunResult {
            policy: self.policy.name().to_owned(),
            cluster: String::new(),
            workload: self.wl.name.clone(),
            steps: self.steps,
            session_e2e_s,
            kv_bytes: self.kv,
            duplicate_factor,
            duplicate_factor_decoders,
            duplicate_series: std::mem::take(&mut self.residency.all.series),
            owner_hit_rate: if self.hits.1 == 0 {
                f64::NAN
            } else {
                self.hits.0 as f64 / self.hits.1 as f64
            },
            decode_interference: interference,
            gpu_busy: if makespan > 0.0 {
                busy / (makespan * self.engines.len() as f64)
            } else {
                0.0
            },
            actions: self.actions,
            preemptions: self.preemptions,
            makespan_s: makespan,
            wall_s: started.elapsed().as_secs_f64(),
            host_restored_bytes: self.host_restored_bytes,
            lifecycle: self.lifecycle.counts(),
        }
    }

    /// A step finished (or was refused): closed-loop clients send the next one after the
    /// tool gap, and forks of this step start.
    fn step_completed(&mut self, session: usize, step: usize, now: f64) {
        let last = &mut self.last_done[session];
        *last = if last.is_finite() { last.max(now) } else { now };
        if !matches!(self.wl.looping, Loop::Closed) {
            return;
        }
        let s = &self.wl.sessions[session];
        let gap = s
            .steps
            .get(step)
            .map_or(0.0, |st| st.gap_after_ms.max(0.0) / 1e3);
        self.idle[session].next_issue_s = (step + 1 < s.steps.len()).then_some(now + gap);
        if step + 1 < s.steps.len() {
            self.queue.push(
                now + gap,
                Event::Issue {
                    session,
                    step: step + 1,
                },
            );
        }
        if let Some(children) = self.forks.get(&(session, step)) {
            for &c in children {
                let after_gap = self.wl.sessions[c].fork_of.is_none_or(|f| f.after_gap);
                self.queue.push(
                    now + if after_gap { gap } else { 0.0 },
                    Event::Issue {
                        session: c,
                        step: 0,
                    },
                );
            }
        }
    }
}
