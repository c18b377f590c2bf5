//! The discrete-event loop: clients issue steps (open loop at their arrival, closed loop
//! after the previous step and its tool gap), the policy places each step exactly as the
//! live router does, and the engines step in virtual time.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::hash::{prompt_hashes, XXH3_SEED};
use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::{
    Decision, Dispatch, Policy, PrefillCharge, RouteRequest, WorkerView,
};
use ownerserve_planner::spec::ModelSpec;
use ownerserve_shim::sim::config::SimConfig;
use ownerserve_shim::sim::scheduler::{CachedRun, NewSeq, SeqId};

use super::directory::SimDirectory;
use super::engine::Engine;
use super::events::{Event, Queue};
use super::residency::FleetResidency;
use super::stats::{KvBytes, Placement, RunResult, StepRecord};
use super::SimOptions;
use crate::workload::{prompt_tokens, Loop, Workload};

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
    /// Prefill tokens counted against the decode worker until the first token: the KV
    /// they will allocate, and of it what it computes (`PrefillCharge::of`).
    prefill_charged: PrefillCharge,
    /// What the prefill leg counts against its prefill worker until it finishes, as the
    /// router does while a NIXL prefill leg runs: (worker, blocks, tokens).
    leg_charged: Option<(usize, u64, PrefillCharge)>,
    phase: Phase,
    /// Its decode leg is counted as heading to its decode worker (`Engine::legs_heading`)
    /// until its KV arrives there.
    leg_heading: bool,
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
    now_s: f64,
}

impl<'w> Sim<'w> {
    pub fn new(
        wl: &'w Workload,
        model: ModelSpec,
        configs: &[SimConfig],
        roles: &[Role],
        policy: Box<dyn Policy>,
        opts: &'w SimOptions,
    ) -> Self {
        let engines: Vec<Engine> = configs
            .iter()
            .zip(roles)
            .map(|(c, &r)| Engine::new(c, r))
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
        }
    }

    fn issue(&mut self, session: usize, step: usize) {
        let wl = self.wl;
        let Some(st) = wl.sessions.get(session).and_then(|s| s.steps.get(step)) else {
            return;
        };
        let now = self.now_s;
        if !self.first_issue[session].is_finite() {
            self.first_issue[session] = now;
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
        let match_prefix = self.policy.needs_prefix_match();
        let uses_dir = self.policy.needs_directory();
        let reads_ages = self.policy.needs_decode_ages();
        let parked = if uses_dir {
            self.parked_returns_per_s()
        } else {
            Vec::new()
        };
        let views: Vec<_> = self
            .engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut v = e.view(i, None);
                if match_prefix {
                    v.cached_blocks = cached[i] as u32;
                }
                if reads_ages {
                    v.decode_ages = self.decode_ages(i, now);
                }
                if uses_dir {
                    v.parked_returns_per_s = parked[i];
                }
                v
            })
            .collect();
        let route = RouteRequest {
            model: "",
            prompt_tokens: prompt.len() as u32,
            block_size: self.block,
            session: Some(route_session),
            now_ms: (now * 1e3) as u64,
            decode_owner: if uses_dir { found.owner } else { None },
            artifact: if uses_dir { found.artifact } else { None },
            samples: st.samples.max(1),
            fork: st.fork,
        };
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

        let placement = placement_of(&decision, &views[worker]);
        let e = &mut self.engines[worker];
        e.in_flight += 1;
        e.active_blocks += route.prompt_blocks();
        let held = cached[worker] as u64 * u64::from(self.block);
        let prefill = PrefillCharge::of(&decision, prompt.len() as u64, held);
        e.charge(prefill);

        let id = self.reqs.len();
        self.reqs.push(Some(Req {
            session,
            step,
            issued_s: now,
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
            prefill_charged: prefill,
            leg_charged: None,
            phase: Phase::Decode,
            leg_heading: false,
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
                    head_to(r, &mut self.engines[worker]);
                    // The router counts the leg against the prefill worker while it runs.
                    if let Some(e) = self.engines.get_mut(p) {
                        let blocks = r.hashes.len() as u64;
                        let tokens = blocks * u64::from(self.block);
                        let leg = PrefillCharge {
                            tokens,
                            ..PrefillCharge::prefill_leg(&decision, r.prompt.len() as u64)
                        };
                        e.in_flight += 1;
                        e.active_blocks += blocks;
                        e.charge(leg);
                        r.leg_charged = Some((p, blocks, leg));
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
    fn reject(&mut self, session: usize, step: usize, now: f64, prompt_tokens: u32) {
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
    fn count_hit(&mut self, d: &Decision, cached: &[usize]) {
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
    fn record_directory(&mut self, session: usize, worker: WorkerId, hashes: &[u64]) {
        // The router tracks the child a fork starts, else the session itself.
        let tracked = self.wl.sessions[session].id.as_str();
        self.dir.record(Some(tracked), hashes, worker);
    }

    fn start_idle_tracking(&mut self, session: usize, worker: usize, hashes: &[u64], now: f64) {
        let tokens = hashes.len() as u64 * u64::from(self.block);
        let sealed_tokens = self.model.prefix_state(tokens, self.block).sealed_tokens;
        let i = &mut self.idle[session];
        if let Some(since) = i.idle_since_s.take() {
            i.lease.observe_gap(((now - since) * 1e3).max(0.0) as u64);
        }
        i.in_flight += 1;
        i.owner = worker;
        let first_tail = (sealed_tokens / u64::from(self.block.max(1))) as usize;
        i.tail = hashes[first_tail.min(hashes.len())..].to_vec();
    }

    fn new_seq(
        &mut self,
        id: usize,
        worker: usize,
        max_tokens: u32,
        choice: u32,
    ) -> Option<NewSeq> {
        let r = self.reqs.get_mut(id)?.as_mut()?;
        let e = &mut self.engines[worker];
        // Counted from here until it is admitted (`step_end`).
        r.placement.preempted_while_waiting = e.preempted;
        let seq = e.next_seq;
        e.next_seq += 1;
        self.seqs.insert((worker, seq), id);
        Some(NewSeq {
            id: SeqId(seq),
            prompt: r.prompt.clone(),
            max_tokens,
            eos_after: None,
            stop: Arc::from(Vec::<String>::new()),
            stream_seed: (r.session as u64) << 32 ^ (r.step as u64) << 8 ^ u64::from(choice),
            arrival_s: self.now_s,
        })
    }

    /// Queues the request's sequences on its decode worker.
    fn submit(&mut self, id: usize, worker: usize, hold: bool) {
        let Some(r) = self.reqs.get(id).and_then(Option::as_ref) else {
            return;
        };
        let st = &self.wl.sessions[r.session].steps[r.step];
        let (samples, max_tokens) = (st.samples.max(1), st.output_tokens.max(1));
        for choice in 0..samples {
            let Some(seq) = self.new_seq(id, worker, max_tokens, choice) else {
                return;
            };
            let sched = &mut self.engines[worker].sched;
            // `check` passed when the step was placed, so adding cannot fail.
            let _ = if hold {
                sched.add_holding_prefix(seq)
            } else {
                sched.add(seq)
            };
        }
        self.kick(worker);
    }

    fn submit_prefill_leg(&mut self, id: usize, p: usize) {
        if let Some(seq) = self.new_seq(id, p, 1, 0) {
            let _ = self.engines[p].sched.add(seq);
            self.kick(p);
        }
    }

    /// Pulls the leading `tokens` of the request's prompt from `source` to its worker.
    fn start_transfer(&mut self, id: usize, source: usize, tokens: u64, why: Move) {
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        let worker = r.worker;
        let usable = (tokens.min(r.prompt.len() as u64) / u64::from(self.block)) as usize;
        let chain = &r.hashes[..usable.min(r.hashes.len())];
        let local = self.engines[worker].sched.cached_prefix(chain);
        let wanted = chain.get(local..).unwrap_or_default();
        let run = match self.engines.get(source) {
            Some(e) if source != worker => e.sched.read_cached(wanted),
            _ => CachedRun::default(),
        };
        let bytes = run.blocks as u64 * self.engines[worker].block_bytes;
        let took = self.engines[worker].link.transfer_s(bytes);
        match why {
            Move::PrefillToDecode => self.kv.prefill_to_decode += bytes,
            Move::Fetch => self.kv.fetch += bytes,
            Move::Migrate { .. } => self.kv.migration += bytes,
        }
        r.phase = Phase::Transfer;
        r.transit = Some(InTransit { local, run, why });
        // A fetch or move reaches its worker's queue only once its copy lands, as a remote
        // prefill's decode leg does: until then it is counted as heading there.
        head_to(r, &mut self.engines[worker]);
        self.queue
            .push(self.now_s + took, Event::Arrived { req: id });
    }

    fn arrived(&mut self, id: usize) {
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        r.phase = Phase::Decode;
        let worker = r.worker;
        arrived_at(r, &mut self.engines[worker]);
        let Some(t) = r.transit.take() else {
            self.submit(id, worker, false);
            return;
        };
        let chain = &r.hashes[..(t.local + t.run.blocks).min(r.hashes.len())];
        let received: Vec<u64> = chain[t.local..].to_vec();
        let local: Vec<u64> = chain[..t.local].to_vec();
        if let Move::Migrate { source } = t.why {
            let moved = self.engines[source].sched.drop_cached(&received);
            let role = self.engines[source].role;
            self.residency.apply(self.now_s, role, &moved.events);
            if let Some(key) = r.artifact_key {
                self.dir.move_prefix(key, WorkerId(worker as u32));
            }
        }
        if t.run.blocks == 0 {
            self.submit(id, worker, false);
            return;
        }
        let sched = &mut self.engines[worker].sched;
        let pins = sched.pin(&local);
        let update = sched.insert_cached(
            t.run.parent.or(local.last().copied()),
            &received,
            &t.run.tokens,
        );
        let role = self.engines[worker].role;
        self.residency.apply(self.now_s, role, &update.events);
        self.submit(id, worker, true);
        self.engines[worker].sched.unpin(&pins);
    }

    /// Starts a step on an engine that is not stepping and has work.
    fn kick(&mut self, worker: usize) {
        let e = &mut self.engines[worker];
        if e.stepping.is_some() || e.sched.is_idle() {
            return;
        }
        let out = e.sched.step(self.now_s);
        let Some(time) = out.time else {
            // Nothing runnable (waiting for blocks): the next change kicks it again.
            return;
        };
        let d = time.total_s;
        e.busy_s += d;
        if out.work.decode_seqs > 0 {
            let slot = usize::from(out.work.prefill_tokens == 0);
            self.decode_steps[slot].0 += d * out.work.decode_seqs as f64;
            self.decode_steps[slot].1 += out.work.decode_seqs;
        }
        e.stepping = Some(out);
        self.queue.push(self.now_s + d, Event::StepEnd { worker });
    }

    fn step_end(&mut self, worker: usize) {
        let Some(out) = self.engines[worker].stepping.take() else {
            return;
        };
        let now = self.now_s;
        self.preemptions += u64::from(out.preempted);
        self.engines[worker].preempted += u64::from(out.preempted);
        let preempted = self.engines[worker].preempted;
        let role = self.engines[worker].role;
        self.residency.apply(now, role, &out.cache_events);
        self.host_restored_bytes += out.restored_tokens * self.kv_bytes_per_token;
        for a in &out.admitted {
            if let Some(&id) = self.seqs.get(&(worker, a.seq.0)) {
                if let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) {
                    // Reuse is counted where the prompt is computed: a remote prefill's
                    // prefill worker, else the decode worker (KV it fetched counts).
                    match r.phase {
                        Phase::Prefill { prefill, .. } if prefill == worker => {
                            r.cached_tokens = a.cached_tokens;
                            r.restored_tokens = a.restored_tokens;
                            r.prefilled_remotely = true;
                            r.placement.admit_wait_s = a.queue_s;
                            r.placement.preempted_while_waiting =
                                preempted.saturating_sub(r.placement.preempted_while_waiting);
                        }
                        _ if r.worker == worker && !r.prefilled_remotely => {
                            if a.cached_tokens >= r.cached_tokens {
                                r.restored_tokens = a.restored_tokens;
                            }
                            r.cached_tokens = r.cached_tokens.max(a.cached_tokens);
                            r.placement.admit_wait_s = a.queue_s;
                            r.placement.preempted_while_waiting =
                                preempted.saturating_sub(r.placement.preempted_while_waiting);
                        }
                        _ => {}
                    }
                }
            }
        }
        for t in &out.tokens {
            let Some(&id) = self.seqs.get(&(worker, t.seq.0)) else {
                continue;
            };
            if t.finish.is_some() {
                self.seqs.remove(&(worker, t.seq.0));
            }
            self.token(id, worker, t.finish.is_some());
        }
        self.kick(worker);
    }

    fn token(&mut self, id: usize, worker: usize, finished: bool) {
        let now = self.now_s;
        let Some(r) = self.reqs.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        if let Phase::Prefill { prefill, started_s } = r.phase {
            if worker == prefill && finished {
                if let Some((p, blocks, leg)) = r.leg_charged.take() {
                    let e = &mut self.engines[p];
                    e.in_flight = e.in_flight.saturating_sub(1);
                    e.active_blocks = e.active_blocks.saturating_sub(blocks);
                    e.discharge(leg);
                }
                if let (Some(predicted), true) = (r.predicted_prefill_s, self.opts.calibrate) {
                    self.policy.observe_prefill(
                        WorkerId(prefill as u32),
                        predicted,
                        now - started_s,
                    );
                }
                let tokens = r.prompt.len() as u64;
                self.start_transfer(id, prefill, tokens, Move::PrefillToDecode);
            }
            return;
        }
        if r.first_token_s.is_none() {
            r.first_token_s = Some(now);
            let e = &mut self.engines[r.worker];
            e.discharge(r.prefill_charged);
            e.decoding.push(id);
        }
        r.last_token_s = now;
        r.tokens += 1;
        if !finished {
            return;
        }
        r.choices_left = r.choices_left.saturating_sub(1);
        if r.choices_left > 0 {
            return;
        }
        let Some(r) = self.reqs.get_mut(id).and_then(Option::take) else {
            return;
        };
        let samples = self.wl.sessions[r.session].steps[r.step].samples.max(1);
        let per_choice = (r.tokens / samples).max(1);
        let first = r.first_token_s.unwrap_or(now);
        if self.opts.calibrate {
            // How long its sequences held their KV on the decode worker.
            self.policy
                .observe_decode(WorkerId(r.worker as u32), now - first);
        }
        self.steps.push(StepRecord {
            session: r.session,
            step: r.step,
            issued_s: r.issued_s,
            ttft_s: first - r.issued_s,
            tpot_s: if per_choice > 1 {
                (r.last_token_s - first) / f64::from(per_choice - 1)
            } else {
                f64::NAN
            },
            latency_s: now - r.issued_s,
            prompt_tokens: r.prompt.len() as u32,
            cached_tokens: r.cached_tokens,
            restored_tokens: r.restored_tokens,
            rejected: false,
            placement: r.placement,
        });
        let e = &mut self.engines[r.worker];
        if let Some(i) = e.decoding.iter().position(|&d| d == id) {
            e.decoding.swap_remove(i);
        }
        e.in_flight = e.in_flight.saturating_sub(1);
        e.active_blocks = e
            .active_blocks
            .saturating_sub((r.prompt.len() as u64).div_ceil(u64::from(self.block)));
        self.end_idle_tracking(r.session, now);
        self.step_completed(r.session, r.step, now);
    }

    /// KV held by the requests decoding on `worker`, by how long they have decoded: their
    /// prompts', as the live router's relay counts them (`registry::Worker::decode_ages`).
    fn decode_ages(&self, worker: usize, now: f64) -> DecodeAges {
        let mut ages = DecodeAges::default();
        for &id in &self.engines[worker].decoding {
            if let Some(Some(r)) = self.reqs.get(id) {
                let first = r.first_token_s.unwrap_or(now);
                ages.add(now - first, r.prompt.len() as u64);
            }
        }
        ages
    }

    /// Per worker, the steps per second its parked sessions are expected to send: 1 /
    /// predicted gap of each session idle on it within its lease, once a gap was seen
    /// (the router's `Sessions::fill_parked_returns`).
    fn parked_returns_per_s(&self) -> Vec<f64> {
        let mut out = vec![0.0; self.engines.len()];
        for i in &self.idle {
            if i.in_flight > 0 || i.idle_since_s.is_none() {
                continue;
            }
            out[i.owner] += i.lease.return_rate_per_s().unwrap_or(0.0);
        }
        out
    }

    fn end_idle_tracking(&mut self, session: usize, now: f64) {
        let i = &mut self.idle[session];
        i.in_flight = i.in_flight.saturating_sub(1);
        if i.in_flight == 0 {
            i.idle_since_s = Some(now);
            i.generation += 1;
            let ttl = i.lease.ttl_ms() as f64 / 1e3;
            let generation = i.generation;
            self.queue.push(
                now + ttl + 1e-6,
                Event::IdleCheck {
                    session,
                    generation,
                },
            );
        }
    }

    /// The session went idle past its lease: the directory drops its owner and the owner
    /// drops the unsealed tail (the router's demotion sweep).
    fn idle_check(&mut self, session: usize, generation: u64) {
        let i = &self.idle[session];
        if i.generation != generation || i.in_flight > 0 || i.idle_since_s.is_none() {
            return;
        }
        let (owner, tail) = (i.owner, i.tail.clone());
        let name = self.wl.sessions[session].id.as_str();
        self.dir.demote(name);
        let dropped = self.engines[owner].sched.drop_cached(&tail);
        let role = self.engines[owner].role;
        self.residency.apply(self.now_s, role, &dropped.events);
        let template = GapLease::new(
            self.opts.lease_factor,
            self.opts.lease_min_ms,
            self.opts.lease_max_ms,
        );
        let i = &mut self.idle[session];
        i.lease = template;
        i.idle_since_s = None;
        i.tail.clear();
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
                self.queue.push(
                    now + gap,
                    Event::Issue {
                        session: c,
                        step: 0,
                    },
                );
            }
        }
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

/// Counts `r` as heading to its worker `e` (`Engine::legs_heading`) until its KV arrives;
/// once, however many legs and copies it passes through.
fn head_to(r: &mut Req, e: &mut Engine) {
    if !std::mem::replace(&mut r.leg_heading, true) {
        e.legs_heading += 1;
    }
}

/// `r`'s KV arrived at its worker `e`: it no longer counts as heading there.
fn arrived_at(r: &mut Req, e: &mut Engine) {
    if std::mem::take(&mut r.leg_heading) {
        e.legs_heading = e.legs_heading.saturating_sub(1);
    }
}
