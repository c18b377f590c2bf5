//! Which candidates a step has, and what each costs.

use std::cell::Cell;

use crate::ids::{Role, WorkerId};
use crate::kv_state::PrefixBytes;
use crate::roofline::{prefill_pairs, StepFigures};

use super::admission::{admission, admitted_view, Admission};
use super::cost::hysteresis_s;
use super::decode::{expected_decode_steps, marginal_decode_s};
use super::interference::marginal_interference_s;
use super::{Action, Candidate, CostTerms, PlanInput, PlanWorker, Weights};

/// Every candidate `(action, workers)` for the step, except those provably unable to win
/// when no exhaustive list is asked for: with uniform links each decoder gets only its
/// cheapest prefill partner (see [`best_partners`]), and a decoder or a move whose floor
/// is at least the cheapest candidate so far is not priced.
pub fn generate(input: &PlanInput<'_>) -> Vec<Candidate> {
    // Every worker is priced as this step will find it when admitted there: its queue
    // includes the wait for KV, its cached prefix only what survives that wait
    // (`admission.rs`). A migration's source and a fetch's source are read at once, so
    // they keep what they hold. Admitted views are made only where a candidate may be
    // priced: a decoder or move target whose queue and decode alone reach the cheapest
    // candidate so far is ruled out before (on 1,024 workers, all but a few dozen).
    let block = u64::from(input.block_size.max(1));
    let figures = StepFigures::of(input.model);
    let admit = |w: &PlanWorker| -> (PlanWorker, Admission) {
        let a = admission(w, &figures, input.prompt_tokens, block);
        (admitted_view(w, &a), a)
    };
    let held_now = input.workers;
    let find = |id: WorkerId| held_now.iter().find(|w| w.id == id);
    let owner = input.decode_owner.and_then(find).map(|w| admit(w).0);
    let artifact_at = input
        .artifact
        .and_then(|a| find(a.owner))
        .map(|w| admit(w).0);
    let p = Pricing::new(input, figures, artifact_at.as_ref());
    let artifact_owner = artifact_at.as_ref().filter(|o| o.healthy);
    // Where the session can decode: its owner while it takes work and may decode (a
    // prefill worker stops being one when the option is turned off), else anywhere. A
    // fork is a new branch reading the shared prefix: it may start anywhere, and never
    // moves its parent.
    let fork = input.is_fork();
    let sole = owner
        .as_ref()
        .filter(|d| d.takes_work() && d.decodes() && !fork);
    let decoders = sole
        .map_or(held_now, std::slice::from_ref)
        .iter()
        .filter(|w| sole.is_some() || (w.takes_work() && w.decodes()));
    // Each prefill worker's share of a remote prefill, computed once for every decoder:
    // the work, and the bytes it computes (and keeps a copy of). Only the prefill pool
    // prefills for another worker, as in the peers' disaggregation (`dynamo_disagg`,
    // `llm_d`): a hybrid worker computes its own sessions' prompts and receives, never
    // sends, a remote prefill. Why: a leg on a hybrid worker is the newest sequence beside
    // that worker's own decodes, so it is the one the engine preempts (and recomputes)
    // when their growth runs out of blocks, and the prompt's KV is then allocated twice
    // in a fleet whose every pool holds decodes. Priced as a prefill worker's, such legs
    // took 1.4–3.5 s longer than planned at the p90 on Qwen3-30B coding-agent sessions
    // on `8h` (34–39 sessions; colocations and moves were within 0.4 s), and they set the
    // tail (EVALUATION.md, twenty-first pass). A prefill worker allowed to decode too
    // (`PlanWorker::prefill_decodes`) stays in the pool: prefill is its first job, and on
    // the P/D fleets it decodes only where its pool has room (`prefill_workers_decode`).
    //
    // With one link for every pair, a remote prefill reads only the two cheapest shares
    // (`best_partners`) and the soonest leg (`earliest_leg_s`): a prefill worker whose
    // floor (`Pricing::prefill_floor_s`) reaches the soonest leg and the second cheapest
    // share so far is not priced (later ones only lower both; equals go to the earlier).
    let pairwise = input.exhaustive || !input.links.pairs.is_empty();
    let floors_hold = {
        let w = input.weights;
        w.lambda_s_per_gb >= 0.0 && w.mu >= 0.0 && w.nu >= 0.0
    };
    let mut prefillers: Vec<Prefiller> = Vec::new();
    // The soonest any remote prefill's KV can reach a decoder (`decode_leg_wait_s`).
    let mut earliest_leg_s = f64::INFINITY;
    let mut cheapest = [f64::INFINITY; 2];
    for w in held_now
        .iter()
        .filter(|w| w.takes_work() && w.role == Role::Prefill)
    {
        if !pairwise && floors_hold && p.prefill_floor_s(w) >= earliest_leg_s.max(cheapest[1]) {
            continue;
        }
        let w = admit(w).0;
        let local = p.local_reuse(&w);
        let work = p.work(&w, p.to_compute(local.reused));
        let computed = p.prompt_bytes - p.state_bytes(input.prompt_tokens.saturating_sub(work.new));
        let pre = Prefiller {
            w,
            work,
            computed,
            local,
        };
        earliest_leg_s = earliest_leg_s.min(pre.w.queue_s + pre.work.compute_s);
        let own = pre.own_s(input.weights);
        if own < cheapest[0] {
            cheapest = [own, cheapest[0]];
        } else if own < cheapest[1] {
            cheapest[1] = own;
        }
        prefillers.push(pre);
    }
    let partners = (!pairwise).then(|| best_partners(&prefillers, input.weights));
    // At most a colocation, the remote prefills and a fetch per decoder, a tail recompute
    // and a migration per worker: one allocation.
    // Every decoder's when each pair is priced (explain); else a few dozen are.
    let remote = partners.map_or(prefillers.len(), |_| 1);
    let priced = if pairwise {
        decoders.clone().count()
    } else {
        64
    };
    let mut out = Vec::with_capacity(priced * (2 + remote) + 1 + held_now.len());
    // Outside explain, what provably cannot beat the cheapest candidate so far (which ties
    // go to) is not priced.
    let prune = !input.exhaustive;
    let mut beat = f64::INFINITY;
    for d in decoders {
        // A decoder none of whose candidates can beat it is skipped: each pays what the
        // step evicts and decodes there, and waits at least for d's queue: a colocation or
        // fetch computes behind it, and a remote prefill's leg and decode leg together
        // take at least `earliest_leg_s + decode_leg_wait_s`, which is never less than it.
        // Every other term is ≥ 0; the margin covers the rounding of summing in another
        // order. First without admitting d, whose queue admission only lengthens and whose
        // decode it leaves alone.
        if prune && sole.is_none() && p.floor_before_admission(d) >= beat {
            continue;
        }
        let admitted;
        let d = match sole {
            Some(d) => d,
            None => {
                admitted = admit(d).0;
                &admitted
            }
        };
        if prune {
            let on_d = p.decoder_terms(d);
            let floor = on_d.evict_s + input.weights.rho * on_d.decode_s + d.queue_s;
            if floor * (1.0 - 1e-9) >= beat {
                continue;
            }
        }
        let first = out.len();
        // What d holds, priced once; what it duplicates of the artifact and receives from
        // a prefill worker, whoever prefills.
        let cached = p.bytes(d.cached_tokens);
        let dup = p.duplicated(d, cached);
        let lacks = (p.prompt_bytes - cached.total).max(0.0);
        // Moving the session onto the artifact's owner is what tail_recompute prices.
        if input.decode_owner == Some(d.id) || artifact_owner.is_none_or(|o| o.id != d.id) {
            out.push(p.colocate(d, dup));
        }
        let leg_wait_s = decode_leg_wait_s(d, earliest_leg_s);
        let remote = |pre: &Prefiller| {
            let mut c = p.candidate(
                Action::RemotePrefill,
                &pre.w,
                d,
                Some(pre.w.id),
                pre.work,
                lacks,
                dup + pre.computed,
            );
            c.cost = c
                .cost
                .with_decode_leg_wait(leg_wait_s)
                .with_duplicate(p.duplicate_s(d, dup))
                .with_host_restore(pre.local.restore_s);
            c.restored_tokens = pre.local.restored;
            c
        };
        match partners {
            // Worker ids are unique, so one of the best two is not d.
            Some(best) => out.extend(
                best.into_iter()
                    .flatten()
                    .find(|pre| pre.w.id != d.id)
                    .map(remote),
            ),
            None => out.extend(prefillers.iter().filter(|pre| pre.w.id != d.id).map(remote)),
        }
        if let Some(o) = artifact_owner {
            if o.id != d.id && o.pulls_kv && d.pulls_kv {
                out.extend(p.artifact_fetch(o, d, cached));
            }
        }
        beat = out[first..]
            .iter()
            .map(|c| c.cost.total)
            .fold(beat, f64::min);
    }
    if let Some(o) = artifact_owner {
        if o.takes_work() && o.decodes() && input.decode_owner != Some(o.id) {
            let c = p.tail_recompute(o);
            beat = beat.min(c.cost.total);
            out.push(c);
        }
    }
    if let Some(d) = owner.as_ref().filter(|d| d.healthy && !fork) {
        let now = held_now.iter().find(|w| w.id == d.id).unwrap_or(d);
        let sent = p.state_bytes(now.cached_tokens.min(input.prompt_tokens));
        // Leaving an owner that could keep the session pays the hysteresis; leaving one
        // that cannot (draining) does not.
        let could_stay = d.takes_work() && d.decodes();
        // A move that cannot win is not priced: its floor (`Pricing::migration_floor_s`)
        // is at least the cheapest candidate so far (earlier moves included); first
        // without admitting t.
        for t in held_now
            .iter()
            .filter(|t| t.id != d.id && t.takes_work() && t.decodes())
        {
            if prune && p.move_floor_before_admission(now, t) >= beat {
                continue;
            }
            let (t, a) = admit(t);
            let t = &t;
            // What the move lands on t waits there for the step's turn (`admission.rs`).
            let m = p.cheaper_way_in(t, p.move_bytes(now, t, sent, a.copy_room_tokens));
            // The budget caps moves the planner chooses, not the hand-over off an owner
            // that cannot keep the session (draining, or no longer decoding).
            if could_stay && !input.migration_budget.allows(m.moved) {
                continue;
            }
            let floor = p.migration_floor_s(t, m, could_stay);
            if prune && floor >= beat {
                continue;
            }
            // Then with the compute on t, which the move's candidate reuses.
            let new = p.to_compute(m.reused.max(t.cached_tokens));
            let compute_s = p.prefill_s(t, new, u64::from(input.samples.max(1)));
            if prune && floor + compute_s * (1.0 - 1e-9) >= beat {
                continue;
            }
            let mut c = p.migrate(now, t, m, p.work_taking(t, new, compute_s));
            if could_stay {
                c.cost = c.cost.with_hysteresis(p.hysteresis());
            }
            beat = beat.min(c.cost.total);
            out.push(c);
        }
    }
    out
}

/// How long a remote prefill's decode leg waits on decoder `d` after its KV arrives.
/// Depends on the decoder alone, so the cheapest prefill partner stays the same for every
/// decoder ([`best_partners`]). A remote prefill to a decoder whose queue is long waits
/// there too: without this it looked as fast as on an idle decoder.
///
/// - A leg that finds `d`'s queue drained ([`leg_finds_queue_drained`]) waits what `d` has
///   queued beyond `earliest_leg_s`, the soonest any prefill worker can finish the leg.
/// - Otherwise it joins the back of `d`'s queue as that queue is then, and a backlog is as
///   long then as now, since steps keep arriving as fast as `d` drains them: the leg waits
///   `d`'s whole queue. (Crediting the drain there made remote prefills between saturated
///   hybrid workers look cheap: on Qwen3-30B SWE-smith ×200 on `8h`, seed 7, 31 of the 50
///   slowest steps were such legs, which waited ~20 s on their prefill worker and then
///   ~23 s more on their decoder, planned at ~24 s in all.)
fn decode_leg_wait_s(d: &PlanWorker, earliest_leg_s: f64) -> f64 {
    if !earliest_leg_s.is_finite() {
        0.0
    } else if leg_finds_queue_drained(d) {
        (d.queue_s - earliest_leg_s).max(0.0)
    } else {
        d.queue_s
    }
}

/// Whether a remote prefill's decode leg finds what decoder `d` has queued now drained by
/// the time the prefill ends: where the leg holds its place in `d`'s queue from dispatch
/// (SGLang's bootstrap pair, `PlanWorker::decode_leg_at_dispatch`), or where `d`'s engine
/// has no step waiting (`PlanWorker::queued`), so its queue is only the prompts it is
/// computing now and nothing is arriving behind them faster than they finish. A leg sent
/// after the prefill (vLLM's NIXL two-step, the simulated engine) to a decoder with steps
/// waiting meets a backlog.
fn leg_finds_queue_drained(d: &PlanWorker) -> bool {
    d.decode_leg_at_dispatch || d.queued == 0
}

/// KV tokens of running sequences a step of `prompt` tokens pushes out of a worker with
/// `free` tokens not held by running sequences: every block of the prompt is held while
/// it runs (cached ones included), so past the free ones the engine preempts running
/// sequences, which recompute at least that much later (vLLM's recompute preemption).
/// 0 when the free room is unknown.
fn preempted_tokens(prompt: u64, free: Option<u64>) -> u64 {
    free.map_or(0, |f| prompt.saturating_sub(f))
}

/// A prefill worker's share of any remote prefill it runs.
#[derive(Debug, Clone)]
struct Prefiller {
    /// The prefill worker, as the step finds it admitted there.
    w: PlanWorker,
    work: Work,
    /// Bytes it computes, and so keeps a copy of.
    computed: f64,
    /// What it restores from its host tier first ([`Pricing::local_reuse`]).
    local: LocalReuse,
}

impl Prefiller {
    /// The part of a remote prefill's total that depends on the prefill worker alone:
    /// its queue, its compute, the copy it keeps and the decodes it stalls. The rest
    /// (network, restore, the decoder's duplicate) depends on the decoder alone when every
    /// pair shares one link.
    fn own_s(&self, weights: Weights) -> f64 {
        self.w.queue_s
            + self.work.compute_s
            + self.local.restore_s
            + weights.lambda_s_per_gb * self.computed / 1e9
            + weights.mu * self.work.interference_s
            + weights.nu * self.work.compute_s * self.w.later_arrivals(self.work.compute_s)
    }
}

/// The two prefill workers with the lowest [`Prefiller::own_s`], the earliest first among
/// equals. With uniform links a remote prefill's total is `own_s(pre) + f(decoder)`, so
/// each decoder's cheapest partner is the first of these that is not the decoder itself:
/// the candidate the exhaustive list would choose for that decoder (its first minimal
/// one, as [`super::plan`] keeps). Exact up to float rounding: the total is summed term by
/// term, not as `own_s + f`, so partners whose totals differ by a few ulps may swap.
fn best_partners(prefillers: &[Prefiller], weights: Weights) -> [Option<&Prefiller>; 2] {
    let mut best: [Option<(f64, &Prefiller)>; 2] = [None, None];
    for pre in prefillers {
        let s = pre.own_s(weights);
        match best {
            [Some((b, _)), _] if s >= b => {
                if best[1].is_none_or(|(r, _)| s < r) {
                    best[1] = Some((s, pre));
                }
            }
            _ => best = [Some((s, pre)), best[0]],
        }
    }
    best.map(|b| b.map(|(_, pre)| pre))
}

/// How a worker gets the prompt's tokens it holds itself: its HBM prefix as is, and the
/// host-cached tokens after it restored over PCIe when that is faster than recomputing
/// them (else recomputed, as if not held).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LocalReuse {
    /// Leading prompt tokens not computed: HBM-cached plus any restored.
    reused: u64,
    /// Of those, restored from host memory.
    restored: u64,
    /// Seconds of PCIe copy.
    restore_s: f64,
}

/// Tokens a candidate computes, and how long that takes where it runs.
#[derive(Debug, Clone, Copy)]
struct Work {
    /// Prompt tokens each sequence computes (the rest is reused).
    new: u64,
    /// Tokens computed in all.
    tokens: u64,
    compute_s: f64,
    /// Decode-seconds it stalls where it runs ([`Pricing::interference_s`]).
    interference_s: f64,
}

/// What a move of the session to a worker reuses, sends and leaves behind.
#[derive(Debug, Clone, Copy)]
struct MoveBytes {
    /// Leading prompt tokens the target need not compute.
    reused: u64,
    /// Bytes sent to the target.
    moved: f64,
    /// Bytes left as a second copy (engines that cannot pull KV from a peer).
    duplicated: f64,
    /// Seconds of the copy: network and restore.
    copy_s: f64,
}

/// The terms of a step that depend on its decoder alone.
#[derive(Debug, Clone, Copy)]
struct DecoderTerms {
    /// [`Pricing::eviction_s`].
    evict_s: f64,
    /// [`Pricing::decode_s`].
    decode_s: f64,
}

/// The prompt's tokens the directory's artifact covers that its owner still caches: a
/// fetch can copy no more, and a prefix the owner evicted is no one's to duplicate. (Priced
/// on the directory's figure alone, fetches from owners that had evicted the prefix were
/// planned to reuse it and recomputed it all: on Mooncake's conversation trace on 2p6d,
/// 58 fetches planned to reuse 3K–73K tokens reused 512, and the prompts sent after
/// them to the same worker waited up to 5 s behind a prefill the planner had not seen.)
/// `at`: the owner as admitted.
fn artifact_held(input: &PlanInput<'_>, at: Option<&PlanWorker>) -> u64 {
    input.artifact.map_or(0, |a| {
        let owner_holds = at.map_or(0, |o| o.cached_tokens);
        a.tokens.min(input.prompt_tokens).min(owner_holds)
    })
}

/// Prices candidates; holds the step's byte figures every candidate is a difference from.
struct Pricing<'a, 'b> {
    input: &'a PlanInput<'b>,
    /// Bytes of the whole prompt's state.
    prompt_bytes: f64,
    /// The prompt's tokens the artifact covers and its owner still caches
    /// ([`artifact_held`]); 0 without one.
    artifact_tokens: u64,
    /// Sealed bytes of those tokens.
    artifact_sealed: f64,
    /// Decode steps the step is expected to run (`decode::expected_decode_steps`).
    decode_steps: Option<f64>,
    /// The model's step figures, read once.
    figures: StepFigures<'b>,
    /// The last decoder whose own terms were priced, and them: a decoder's colocation,
    /// remote prefills and fetch are generated one after another and share them.
    last_decoder: Cell<Option<(WorkerId, DecoderTerms)>>,
}

impl<'a, 'b> Pricing<'a, 'b> {
    /// Prices `input`'s candidates; `artifact_at`: the artifact's owner as admitted.
    fn new(
        input: &'a PlanInput<'b>,
        figures: StepFigures<'b>,
        artifact_at: Option<&PlanWorker>,
    ) -> Self {
        let bytes = |tokens| input.model.prefix_bytes(tokens, input.block_size);
        let artifact_tokens = artifact_held(input, artifact_at);
        Self {
            input,
            prompt_bytes: bytes(input.prompt_tokens).total,
            artifact_tokens,
            artifact_sealed: bytes(artifact_tokens).sealed,
            decode_steps: (input.weights.rho > 0.0)
                .then(|| expected_decode_steps(input.workers, &figures))
                .flatten(),
            figures,
            last_decoder: Cell::new(None),
        }
    }
}

impl Pricing<'_, '_> {
    fn prompt(&self) -> u64 {
        self.input.prompt_tokens
    }

    /// Bytes of the state of the first `tokens` prompt tokens, sealed and in all.
    fn bytes(&self, tokens: u64) -> PrefixBytes {
        self.input.model.prefix_bytes(tokens, self.input.block_size)
    }

    /// Bytes of the whole state of the first `tokens` prompt tokens.
    fn state_bytes(&self, tokens: u64) -> f64 {
        self.bytes(tokens).total
    }

    /// Bytes of the artifact's sealed state `w` does not hold: past its cached tokens,
    /// whose bytes are `cached`, up to the artifact's end within the prompt.
    fn artifact_lacked(&self, w: &PlanWorker, cached: PrefixBytes) -> f64 {
        if w.cached_tokens >= self.artifact_tokens {
            return 0.0;
        }
        (self.artifact_sealed - cached.sealed).max(0.0)
    }

    /// What `w` reuses of its own copies of the prompt ([`LocalReuse`]): the host-cached
    /// segment after its HBM prefix is restored at its PCIe bandwidth when `restore +
    /// prefill of the rest` beats `prefill of it all`: a long segment on a fast bus is
    /// restored; a tiny one (the restore's fixed step cost outweighs its compute) or a
    /// slow bus recomputes.
    /// Nothing changes for a worker that holds nothing in host memory.
    fn local_reuse(&self, w: &PlanWorker) -> LocalReuse {
        let hbm = LocalReuse {
            reused: w.cached_tokens,
            restored: 0,
            restore_s: 0.0,
        };
        let end = (w.cached_tokens + w.host_cached_tokens).min(self.prompt().saturating_sub(1));
        if w.host_cached_tokens == 0 || w.pcie_bytes_per_s <= 0.0 || end <= w.cached_tokens {
            return hbm;
        }
        let bytes = self.state_bytes(end) - self.state_bytes(w.cached_tokens);
        // The request waits for its copy: a step's fixed cost plus the bytes over PCIe
        // (the sim engine charges the same, `Scheduler::restore_s`).
        let restore_s = w.roofline.step_overhead_s() + bytes.max(0.0) / w.pcie_bytes_per_s;
        let n = u64::from(self.input.samples.max(1));
        let recompute_s = self.prefill_s(w, self.to_compute(w.cached_tokens), n);
        let restore_then_s = restore_s + self.prefill_s(w, self.to_compute(end), n);
        if restore_then_s < recompute_s {
            LocalReuse {
                reused: end,
                restored: end - w.cached_tokens,
                restore_s,
            }
        } else {
            hbm
        }
    }

    /// Tokens computed when `reused` leading tokens need no compute; at least one, as
    /// engines recompute the last prompt token to sample from it.
    fn to_compute(&self, reused: u64) -> u64 {
        self.prompt().saturating_sub(reused).max(1)
    }

    /// `new` tokens computed on `w` after the rest of the prompt, by each of the step's
    /// samples: `n` sequences admitted together each prefill what is not cached yet (as
    /// vLLM's parallel sampling does).
    fn work(&self, w: &PlanWorker, new: u64) -> Work {
        let n = u64::from(self.input.samples.max(1));
        self.work_taking(w, new, self.prefill_s(w, new, n))
    }

    /// [`Pricing::work`] whose compute is known to take `compute_s`.
    fn work_taking(&self, w: &PlanWorker, new: u64, compute_s: f64) -> Work {
        let tokens = new * u64::from(self.input.samples.max(1));
        Work {
            new,
            tokens,
            compute_s,
            interference_s: self.interference_s(w, tokens, compute_s),
        }
    }

    /// Seconds to compute `new` tokens of the prompt (`n` samples) on `w` once sent there:
    /// the engine step under way ends ([`PlanWorker::step_under_way_s`]), then the
    /// prompt's chunks run beside the decodes there ([`PlanWorker::preset_prefill_s`]), at
    /// its calibrated rate.
    fn prefill_s(&self, w: &PlanWorker, new: u64, n: u64) -> f64 {
        if new == 0 {
            return 0.0;
        }
        let context = self.prompt().saturating_sub(new);
        let pairs = prefill_pairs(new, context) * n;
        (w.step_under_way_s(&self.figures)
            + w.preset_prefill_s(&self.figures, new * n, pairs, context * n))
            * w.prefill_scale
    }

    /// Seconds of prefill someone will redo because `d`, to hold this step's KV, must evict
    /// cached prefixes: the prompt tokens it does not hold beyond its free room, priced
    /// at its own prefill rate. Evicting another session's prefix is a cost even when
    /// this step does not pay it; 0 while `d` has room or its capacity is unknown.
    fn eviction_s(&self, d: &PlanWorker) -> f64 {
        let evicted = d.kv_room_tokens.map_or(0, |room| {
            self.prompt()
                .saturating_sub(d.cached_tokens)
                .saturating_sub(room)
        });
        let preempted = preempted_tokens(self.prompt(), d.kv_free_tokens);
        let mut s = 0.0;
        if evicted > 0 {
            s += self.prefill_s(d, evicted, 1);
        }
        if preempted > 0 {
            s += self.prefill_s(d, preempted, 1);
        }
        s
    }

    /// The least a remote prefill on prefill worker `w` (before admission) can add to a
    /// candidate, and the soonest its leg can end: `w`'s queue (admission only lengthens
    /// it) and the floor of its compute ([`PlanWorker::preset_prefill_floor_s`]) of what
    /// it could not reuse even if it restored all it holds in host memory (admission
    /// moves HBM tokens there, never out of both). Every other term of
    /// [`Prefiller::own_s`] is ≥ 0 with non-negative weights. Scaled down by the same
    /// margin as the other floors.
    fn prefill_floor_s(&self, w: &PlanWorker) -> f64 {
        let new = self.to_compute(w.cached_tokens + w.host_cached_tokens);
        (w.queue_s + self.compute_floor_s(w, new)) * (1.0 - 1e-9)
    }

    /// At most [`Pricing::prefill_s`] of `new` tokens on `w` (each sample's).
    fn compute_floor_s(&self, w: &PlanWorker, new: u64) -> f64 {
        let n = u64::from(self.input.samples.max(1));
        let pairs = prefill_pairs(new, self.prompt().saturating_sub(new)) * n;
        w.preset_prefill_floor_s(&self.figures, new * n, pairs) * w.prefill_scale
    }

    /// The least any candidate decoding on `w` (or moving there) can cost, read off `w`
    /// before admission: its queue, which admission only lengthens, and the step's decode
    /// there, which admission leaves alone; what the step evicts there is left out (≥ 0).
    /// Scaled down by the same margin as the full floors.
    fn floor_before_admission(&self, w: &PlanWorker) -> f64 {
        (w.queue_s + self.input.weights.rho * self.decode_s(w)) * (1.0 - 1e-9)
    }

    /// The least a move from `from` (as it holds now) to `t` (before admission) can cost:
    /// [`Pricing::floor_before_admission`] and the floor of computing on `t` what neither
    /// `from`'s copy nor `t`'s own cache covers (a move reuses no more than one of them).
    fn move_floor_before_admission(&self, from: &PlanWorker, t: &PlanWorker) -> f64 {
        let reused = from.cached_tokens.min(self.prompt()).max(t.cached_tokens);
        self.floor_before_admission(t)
            + self.compute_floor_s(t, self.to_compute(reused)) * (1.0 - 1e-9)
    }

    /// What the step costs on its decoder `d` whoever prefills it: the prefixes it evicts
    /// there and its decode.
    fn decoder_terms(&self, d: &PlanWorker) -> DecoderTerms {
        if let Some((id, terms)) = self.last_decoder.get() {
            if id == d.id {
                return terms;
            }
        }
        let terms = DecoderTerms {
            evict_s: self.eviction_s(d),
            decode_s: self.decode_s(d),
        };
        self.last_decoder.set(Some((d.id, terms)));
        terms
    }

    /// Decode-seconds of the step's expected decode on `d` (`decode.rs`); 0 before any
    /// decode lifetime is observed.
    fn decode_s(&self, d: &PlanWorker) -> f64 {
        self.decode_steps.map_or(0.0, |steps| {
            marginal_decode_s(d, &self.figures, self.prompt(), steps)
        })
    }

    /// Decode-seconds `work` on `w` stalls the sequences decoding there: the marginal
    /// interference of the prefill on its running batch (`interference.rs`).
    fn interference_s(&self, w: &PlanWorker, tokens: u64, compute_s: f64) -> f64 {
        marginal_interference_s(
            &w.roofline,
            &self.figures,
            w.stalled_decodes(),
            w.running_kv_tokens(),
            tokens,
            compute_s,
            w.prefill_chunk(),
        )
    }

    fn transfer_s(&self, from: WorkerId, to: &PlanWorker, bytes: f64) -> (f64, f64) {
        if bytes <= 0.0 {
            return (0.0, 0.0);
        }
        let link = self.input.links.get(from, to.id);
        (
            link.latency_s + bytes / link.bytes_per_s,
            bytes / to.roofline.bytes_per_s(),
        )
    }

    /// HBM duplicated when `w`, whose cached tokens' bytes are `cached`, ends up holding
    /// its own copy of the prompt's part of a sealed artifact another worker owns.
    fn duplicated(&self, w: &PlanWorker, cached: PrefixBytes) -> f64 {
        match self.input.artifact {
            Some(a) if a.owner != w.id => self.artifact_lacked(w, cached),
            _ => 0.0,
        }
    }

    #[expect(
        clippy::too_many_arguments,
        reason = "one call per action, each term named"
    )]
    fn candidate(
        &self,
        action: Action,
        compute_on: &PlanWorker,
        decode_on: &PlanWorker,
        source: Option<WorkerId>,
        work: Work,
        network_bytes: f64,
        hbm_bytes: f64,
    ) -> Candidate {
        let Work {
            new,
            tokens: compute_tokens,
            compute_s,
            interference_s,
        } = work;
        let (network_s, restore_s) = match source {
            Some(s) => self.transfer_s(s, decode_on, network_bytes),
            None => (0.0, 0.0),
        };
        let cost = CostTerms::new(
            self.input.weights,
            compute_on.queue_s,
            compute_s,
            network_s,
            restore_s,
            hbm_bytes,
            interference_s,
        );
        let on_decoder = self.decoder_terms(decode_on);
        let cost = cost
            .with_eviction(on_decoder.evict_s)
            .with_queue_delay(
                self.input.weights,
                compute_s * compute_on.later_arrivals(compute_s),
            )
            .with_decode(self.input.weights, on_decoder.decode_s);
        // A later term (a restore from host, a leg's wait) is not subtracted from the
        // hold: it is priced at most that much above the wait.
        let cost = if self.input.moves_to(decode_on.id) {
            cost.with_move_hold(self.input.move_hold_s)
        } else {
            cost
        };
        Candidate {
            action,
            compute_on: compute_on.id,
            decode_on: decode_on.id,
            source,
            compute_tokens,
            reused_tokens: self.prompt().saturating_sub(new),
            restored_tokens: 0,
            network_bytes,
            preset_compute_s: if compute_on.prefill_scale > 0.0 {
                compute_s / compute_on.prefill_scale
            } else {
                compute_s
            },
            cost,
        }
    }

    /// Prefill and decode on `d`, which then holds `dup` bytes of someone else's artifact
    /// ([`Pricing::duplicated`]).
    fn colocate(&self, d: &PlanWorker, dup: f64) -> Candidate {
        let local = self.local_reuse(d);
        let new = self.to_compute(local.reused);
        let mut c = self.candidate(Action::Colocate, d, d, None, self.work(d, new), 0.0, dup);
        c.cost = c
            .cost
            .with_duplicate(self.duplicate_s(d, dup))
            .with_host_restore(local.restore_s);
        c.restored_tokens = local.restored;
        c
    }

    /// What the copy of `dup` bytes of another worker's prefix that `d` keeps for a fork's
    /// branch is worth in HBM: the prefill it would take `d` to recompute as many bytes of
    /// this prompt, at κ. The prefix owner serves every branch from one copy (copy-on-write
    /// block refs), so a branch placed elsewhere holds a second copy for as long as it lives
    /// and after (an LRU cache keeps it until something evicts it); that room would otherwise
    /// hold a prefix whose reuse saves as much prefill. 0 for steps that are not forks.
    fn duplicate_s(&self, d: &PlanWorker, dup: f64) -> f64 {
        let w = self.input.weights;
        if dup <= 0.0 || w.kappa <= 0.0 || !self.input.is_fork() {
            return 0.0;
        }
        let tokens = (self.prompt() as f64 * dup / self.prompt_bytes.max(1.0)).ceil() as u64;
        w.kappa * self.prefill_s(d, tokens.min(self.prompt()), 1)
    }

    /// `w`, whose cached tokens' bytes are `cached`, fetches the rest of the artifact from
    /// its owner `o`.
    fn artifact_fetch(
        &self,
        o: &PlanWorker,
        w: &PlanWorker,
        cached: PrefixBytes,
    ) -> Option<Candidate> {
        let sealed = self.artifact_tokens;
        if sealed <= w.cached_tokens {
            return None;
        }
        // The part of the artifact w holds in host memory is restored instead of fetched
        // when its PCIe is faster than the link; only the rest crosses the network.
        let local = self.local_reuse(w);
        let restore = local.restored > 0
            && w.pcie_bytes_per_s >= self.input.links.get(o.id, w.id).bytes_per_s;
        let (fetched, from) = if restore {
            let held = local.reused.min(sealed);
            let lacked = (self.artifact_sealed - self.bytes(held).sealed).max(0.0);
            (lacked, local.reused)
        } else {
            (self.artifact_lacked(w, cached), w.cached_tokens)
        };
        let reused = self.input.model.resume_point(sealed).max(from);
        let new = self.to_compute(reused);
        let mut c = self.candidate(
            Action::ArtifactFetch,
            w,
            w,
            Some(o.id),
            self.work(w, new),
            fetched,
            fetched,
        );
        c.cost = c.cost.with_duplicate(self.duplicate_s(w, fetched));
        if restore {
            c.cost = c.cost.with_host_restore(local.restore_s);
            c.restored_tokens = local.restored;
        }
        Some(c)
    }

    fn tail_recompute(&self, o: &PlanWorker) -> Candidate {
        let sealed = self.artifact_tokens;
        let resume = self.input.model.resume_point(sealed);
        // A demoted session's tail offloaded to the owner's host tier comes back from it.
        let local = self.local_reuse(o);
        let restored = local.restored > 0 && local.reused > resume;
        let new = self.to_compute(if restored { local.reused } else { resume });
        let mut c = self.candidate(
            Action::TailRecompute,
            o,
            o,
            None,
            self.work(o, new),
            0.0,
            0.0,
        );
        if restored {
            c.cost = c.cost.with_host_restore(local.restore_s);
            c.restored_tokens = local.restored;
        }
        c
    }

    /// What a move from `d` to `t` reuses, sends and leaves duplicated ([`MoveBytes`]);
    /// `sent` is the bytes of `d`'s cached prefix of the prompt (see [`Pricing::migrate`]).
    /// Of what `t` lacks of that prefix, only the leading `room` tokens are moved and
    /// counted as reused: the rest would be evicted on `t` before the step's turn there
    /// (`Admission::copy_room_tokens`), so it is recomputed rather than shipped.
    /// (Counting all of it, moves onto full workers planned to reuse 36% of their prompts
    /// and found 14%: Qwen3-30B SWE-smith ×200 on 8h, seed 7.)
    fn move_bytes(&self, d: &PlanWorker, t: &PlanWorker, sent: f64, room: u64) -> MoveBytes {
        let mut held = d.cached_tokens.min(self.prompt());
        let mut sent = sent;
        let own = t.cached_tokens.min(held);
        if held - own > room {
            let block = u64::from(self.input.block_size.max(1));
            held = (own + room) / block * block;
            sent = self.state_bytes(held);
        }
        let lacked = (sent - self.state_bytes(t.cached_tokens.min(held))).max(0.0);
        let (reused, moved, duplicated) = match d.pulls_kv && t.pulls_kv {
            true => (held, lacked, 0.0),
            false => (0, 0.0, lacked),
        };
        let (network_s, restore_s) = self.transfer_s(d.id, t, moved);
        MoveBytes {
            reused,
            moved,
            duplicated,
            copy_s: network_s + restore_s,
        }
    }

    /// A move copies the owner's prefix, or recomputes it on `t` where that is faster than
    /// the copy on this link: at 1 GB/s a 19K-token Llama-3.1-8B prefix takes 2.5 s to copy
    /// and 0.9 s to recompute on an H100, and the copy, with its hysteresis, priced every
    /// move off a queued owner out (Llama SWE-smith ×200 on `8h` at 1 GB/s: p99 TTFT 4.3 s
    /// against `dynamo_kv`'s 1.7 s, steps queued 8 s on an owner while others idled). The
    /// recompute sends nothing and leaves the source its copy, as a move between engines
    /// that cannot pull KV does (its price: the compute, with no hysteresis).
    fn cheaper_way_in(&self, t: &PlanWorker, m: MoveBytes) -> MoveBytes {
        // The tokens the copy saves, at their FLOPs alone (attention left out): what they
        // add to a step that runs anyway. A short prompt's chunk costs its weight reads
        // whatever its length, so the roofline would call a short recompute free; priced
        // so, it won against a 50 GB/s copy on the overloaded Qwen3 SWE-smith rows and
        // raised their p99 TTFT (4p4d: 38 → 44 s).
        let saved = m.reused.saturating_sub(t.cached_tokens) as f64;
        let flops = saved * 2.0 * self.input.model.params_active;
        let recompute_s = flops / t.roofline.flops_per_s() * t.prefill_scale.max(1e-9);
        // Only onto a worker with nothing queued: on a busy one the recompute delays the
        // prompts behind it, which a copy does not.
        if m.moved > 0.0 && t.queue_s <= 0.0 && recompute_s < m.copy_s {
            MoveBytes {
                reused: 0,
                moved: 0.0,
                duplicated: m.moved,
                copy_s: 0.0,
            }
        } else {
            m
        }
    }

    /// The least a move to `t` that sends `m` can cost: `t`'s queue, the copy, the
    /// hysteresis on it when it leaves an owner that could stay, and what it evicts and
    /// decodes on `t` (priced once: the move's candidate reuses them). Every other term is
    /// ≥ 0; the margin covers the rounding of summing in another order.
    fn migration_floor_s(&self, t: &PlanWorker, m: MoveBytes, could_stay: bool) -> f64 {
        let on_t = self.decoder_terms(t);
        let w = self.input.weights;
        (t.queue_s + self.copy_s(m, could_stay) + on_t.evict_s + w.rho * on_t.decode_s)
            * (1.0 - 1e-9)
    }

    /// A move's copy, with the hysteresis on it when it leaves an owner that could stay.
    fn copy_s(&self, m: MoveBytes, could_stay: bool) -> f64 {
        let hysteresis = if could_stay { self.hysteresis() } else { 0.0 };
        m.copy_s + hysteresis_s(m.copy_s, hysteresis)
    }

    /// The multiple of its copy a move off an owner that could keep the session pays on
    /// top of it: `Weights::migrate_hysteresis`, raised by the migration budget's shadow
    /// price once half of it is spent (`migration_budget.rs`).
    fn hysteresis(&self) -> f64 {
        let h = self.input.weights.migrate_hysteresis.max(0.0);
        h * (1.0 + self.input.migration_budget.shadow_price())
    }

    /// Move the session from `d` to `t`, sending `m` ([`Pricing::move_bytes`]) and computing
    /// `work` there. A copy sends what `t` lacks of `d`'s cached prefix and the source frees
    /// it. Between engines that cannot pull KV from a peer (`PlanWorker::pulls_kv`) nothing
    /// is sent: the target recomputes it, as the dispatch then does, and the source keeps its
    /// copy (vLLM and SGLang drop nothing on request), so it is a duplicate instead.
    fn migrate(&self, d: &PlanWorker, t: &PlanWorker, m: MoveBytes, work: Work) -> Candidate {
        self.candidate(
            Action::Migrate,
            t,
            t,
            Some(d.id),
            work,
            m.moved,
            m.duplicated,
        )
    }
}
