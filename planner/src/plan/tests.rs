#![allow(clippy::unwrap_used, reason = "tests: a failure should panic")]

use super::*;
use crate::policy::SplitMix64;
use crate::roofline::Efficiency;
use crate::spec::GpuSpec;

/// A healthy, idle H100 worker with nothing cached and no load figures; tests set what
/// they need (`decode.rs`'s tests too).
pub(super) fn worker(id: u32, role: Role) -> PlanWorker {
    PlanWorker {
        id: WorkerId(id),
        role,
        healthy: true,
        draining: false,
        roofline: Roofline::new(&GpuSpec::preset("h100").unwrap(), 1, Efficiency::default()),
        step_budget: StepBudget::of(8_192),
        queue_s: 0.0,
        decoding: 0,
        queued: 0,
        cached_tokens: 0,
        host_cached_tokens: 0,
        pulls_kv: true,
        prefill_decodes: false,
        decode_leg_at_dispatch: false,
        pcie_bytes_per_s: 50e9,
        prefill_scale: 1.0,
        kv_room_tokens: None,
        kv_free_tokens: None,
        kv_capacity_tokens: None,
        waiting_tokens: 0,
        decode_lifetime_s: None,
        kv_release_per_s: None,
        parked_returns_per_s: 0.0,
    }
}

fn links(gb_per_s: f64) -> Links {
    Links {
        default: Link {
            bytes_per_s: gb_per_s * 1e9,
            latency_s: 20e-6,
        },
        pairs: BTreeMap::new(),
    }
}

struct Scenario {
    model: ModelSpec,
    prompt_tokens: u64,
    decode_owner: Option<u32>,
    artifact: Option<(u32, u64)>,
    workers: Vec<PlanWorker>,
    links: Links,
    samples: u32,
    fork: bool,
    weights: Weights,
    exhaustive: bool,
    migration_budget: MigrationBudget,
    move_hold_s: f64,
}

impl Scenario {
    fn new(prompt_tokens: u64, workers: Vec<PlanWorker>) -> Self {
        Self {
            model: ModelSpec::preset("llama-3.1-8b").unwrap(),
            prompt_tokens,
            decode_owner: None,
            artifact: None,
            workers,
            links: links(50.0),
            samples: 1,
            fork: false,
            weights: Weights::default(),
            exhaustive: false,
            migration_budget: MigrationBudget::UNLIMITED,
            move_hold_s: 0.0,
        }
    }

    fn plan(&self) -> Plan {
        plan(&self.input()).unwrap()
    }

    fn input(&self) -> PlanInput<'_> {
        PlanInput {
            model: &self.model,
            block_size: 16,
            prompt_tokens: self.prompt_tokens,
            decode_owner: self.decode_owner.map(WorkerId),
            artifact: self.artifact.map(|(owner, tokens)| ArtifactView {
                owner: WorkerId(owner),
                tokens,
            }),
            workers: &self.workers,
            links: &self.links,
            weights: self.weights,
            samples: self.samples,
            fork: self.fork,
            thresholds: ClassThresholds::default(),
            exhaustive: self.exhaustive,
            migration_budget: self.migration_budget,
            move_hold_s: self.move_hold_s,
        }
    }
}

/// The cheapest candidate of each other action costs more than the chosen one, and the
/// explanation names the choice.
fn assert_chosen(p: &Plan, action: Action, on: u32) {
    assert_eq!(
        (p.chosen.action, p.chosen.decode_on),
        (action, WorkerId(on)),
        "{p:#?}"
    );
    assert!(p
        .candidates
        .iter()
        .all(|c| c.cost.total >= p.chosen.cost.total));
    assert_eq!(p.ranked()[0].cost.total, p.chosen.cost.total);
    assert!(p
        .ranked()
        .windows(2)
        .all(|w| w[0].cost.total <= w[1].cost.total));
    assert!(p.reason().starts_with(action.name()), "{}", p.reason());
}

#[test]
fn a_small_turn_stays_on_the_decode_owner() {
    let mut owner = worker(0, Role::Hybrid);
    owner.cached_tokens = 40_000;
    let mut s = Scenario::new(
        40_200,
        vec![owner, worker(1, Role::Prefill), worker(2, Role::Hybrid)],
    );
    s.decode_owner = Some(0);
    s.artifact = Some((0, 39_984));
    let p = s.plan();
    assert_chosen(&p, Action::Colocate, 0);
    assert_eq!(p.class, StepClass::SmallIncrement);
    assert_eq!(p.chosen.compute_tokens, 200);
    assert!(p.changes.is_empty(), "{:?}", p.changes);
}

#[test]
fn a_new_long_prompt_is_prefilled_remotely_when_the_decoder_is_busy() {
    let mut d = worker(1, Role::Decode);
    d.decoding = 64;
    let s = Scenario::new(30_000, vec![worker(0, Role::Prefill), d]);
    let p = s.plan();
    assert_chosen(&p, Action::RemotePrefill, 1);
    assert_eq!(p.class, StepClass::NewLongPrefix);
    assert_eq!(p.chosen.compute_on, WorkerId(0));
    // 30,000 tokens × 128 KiB of KV shipped.
    assert_eq!(p.chosen.network_bytes, 30_000.0 * 131_072.0);
    let colocate = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Colocate)
        .unwrap();
    assert!(colocate.cost.interference_s > 0.0);
    assert_eq!(p.changes, [DirectoryChange::SetDecodeOwner(WorkerId(1))]);
}

#[test]
fn a_prefill_worker_allowed_to_decode_takes_a_new_session_off_a_busy_decoder() {
    let mut d = worker(1, Role::Decode);
    d.decoding = 64;
    let mut pre = worker(0, Role::Prefill);
    pre.prefill_decodes = true;
    let s = Scenario::new(30_000, vec![pre.clone(), d.clone()]);
    let p = s.plan();
    // The idle prefill worker computes the prompt and keeps it: nothing is shipped and no
    // running decode is stalled.
    assert_chosen(&p, Action::Colocate, 0);
    assert_eq!(p.chosen.network_bytes, 0.0);
    assert_eq!(p.changes, [DirectoryChange::SetDecodeOwner(WorkerId(0))]);

    // Once it decodes, its running sequences are stalled by a prefill there like any
    // decoder's, so the next long prompt is not piled onto it for free.
    let mut busy = pre;
    busy.decoding = 64;
    let s = Scenario::new(30_000, vec![busy, d.clone()]);
    let p = s.plan();
    let on_prefill_worker = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Colocate && c.decode_on == WorkerId(0))
        .unwrap();
    assert!(on_prefill_worker.cost.interference_s > 0.0);

    // A prefill worker not allowed to decode is never a decode candidate.
    let s = Scenario::new(30_000, vec![worker(0, Role::Prefill), d.clone()]);
    let p = s.plan();
    assert!(p.candidates.iter().all(|c| c.decode_on == WorkerId(1)));

    // Nor is it once the option is off for a session it already owns: the session goes to
    // a decoder (here prefilled where its history is, then shipped), and a move off the
    // prefill worker pays no hysteresis, since that owner could not keep it.
    let mut owner = worker(0, Role::Prefill);
    owner.cached_tokens = 29_000;
    let mut s = Scenario::new(30_000, vec![owner, d]);
    s.decode_owner = Some(0);
    // Every candidate listed: the move cannot win here, so a pruned plan skips it.
    s.exhaustive = true;
    let p = s.plan();
    assert!(
        p.candidates.iter().all(|c| c.decode_on == WorkerId(1)),
        "{p:#?}"
    );
    assert_eq!(p.chosen.compute_on, WorkerId(0), "{p:#?}");
    let moved = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Migrate)
        .unwrap();
    assert_eq!(moved.cost.hysteresis_s, 0.0);
}

#[test]
fn a_fork_off_a_busy_owner_fetches_the_sealed_prefix() {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 64_000;
    o.queue_s = 5.0;
    let s = Scenario {
        artifact: Some((0, 64_000)),
        decode_owner: Some(0),
        samples: 4,
        ..Scenario::new(64_100, vec![o, worker(1, Role::Hybrid)])
    };
    let p = s.plan();
    assert_chosen(&p, Action::ArtifactFetch, 1);
    assert_eq!(p.class, StepClass::ForkedRollout);
    assert_eq!(p.chosen.source, Some(WorkerId(0)));
    assert_eq!(
        p.chosen.compute_tokens, 400,
        "each of the 4 samples computes 100"
    );
    assert_eq!(p.chosen.reused_tokens, 64_000);
    assert_eq!(
        p.changes,
        [
            DirectoryChange::ForkTo(WorkerId(1)),
            DirectoryChange::Replicate(WorkerId(1))
        ],
        "the branch starts on 1; the parent stays on 0"
    );
    assert!(
        p.candidates.iter().all(|c| c.action != Action::Migrate),
        "a fork never moves its parent"
    );
}

/// The same fork off a busy owner on engines that cannot pull KV from a peer (vLLM,
/// SGLang): no fetch is offered (its dispatch would recompute the whole prefix while the
/// plan priced a copy), and moving the session is priced as the recompute it is.
#[test]
fn engines_that_cannot_pull_kv_get_no_fetch_and_a_move_that_recomputes() {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 64_000;
    o.queue_s = 5.0;
    o.pulls_kv = false;
    let mut other = worker(1, Role::Hybrid);
    other.pulls_kv = false;
    let fork = Scenario {
        artifact: Some((0, 64_000)),
        decode_owner: Some(0),
        samples: 4,
        ..Scenario::new(64_100, vec![o.clone(), other.clone()])
    };
    let p = fork.plan();
    assert!(
        p.candidates
            .iter()
            .all(|c| c.action != Action::ArtifactFetch),
        "{:?}",
        p.candidates
    );
    let mut step = Scenario::new(64_100, vec![o, other]);
    step.decode_owner = Some(0);
    let p = step.plan();
    let m = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Migrate)
        .unwrap();
    assert_eq!(m.network_bytes, 0.0, "{m:?}");
    assert_eq!(
        m.compute_tokens, 64_100,
        "the target computes the whole prompt: {m:?}"
    );
    // With pulling engines the same move copies the owner's 64K tokens.
    let mut pulling = Scenario::new(
        64_100,
        vec![worker(0, Role::Hybrid), worker(1, Role::Hybrid)],
    );
    pulling.workers[0].cached_tokens = 64_000;
    pulling.workers[0].queue_s = 5.0;
    pulling.decode_owner = Some(0);
    let p = pulling.plan();
    let m = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Migrate)
        .unwrap();
    assert!(m.network_bytes > 0.0 && m.compute_tokens == 100, "{m:?}");
}

/// Three branches of a fork just landed on the prefix owner; the fourth sees its short
/// queue. A copy on the idle worker would start ~30 ms sooner but hold a second 12K-token
/// prefix: at κ = 1 the branch stays with the prefix (copy-on-write there); without the
/// duplicate's price it spilled (the forked rows' duplicate factor of 1.7–2.6).
#[test]
fn a_fork_stays_with_its_prefix_unless_load_forces_a_spill() {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 12_480;
    o.queue_s = 0.03;
    o.queued = 3;
    o.decoding = 3;
    let mut s = Scenario {
        artifact: Some((0, 12_480)),
        decode_owner: Some(0),
        fork: true,
        ..Scenario::new(12_700, vec![o, worker(1, Role::Hybrid)])
    };
    let p = s.plan();
    assert_chosen(&p, Action::Colocate, 0);
    assert_eq!(p.chosen.cost.duplicate_s, 0.0, "no copy on the owner");
    let spill = p
        .candidates
        .iter()
        .find(|c| c.decode_on == WorkerId(1))
        .unwrap();
    assert!(spill.cost.duplicate_s > 0.1, "{spill:#?}");
    s.weights.kappa = 0.0;
    assert_eq!(
        s.plan().chosen.decode_on,
        WorkerId(1),
        "unpriced, it spills"
    );
    // A long queue on the owner is load that forces the spill, duplicate and all.
    s.weights.kappa = 1.0;
    s.workers[0].queue_s = 2.0;
    assert_eq!(s.plan().chosen.decode_on, WorkerId(1));
    // A session's own step (not a fork) pays no duplicate price.
    s.fork = false;
    s.workers[0].queue_s = 0.03;
    s.decode_owner = None;
    assert!(s
        .plan()
        .candidates
        .iter()
        .all(|c| c.cost.duplicate_s == 0.0));
}

#[test]
fn a_resume_after_the_owner_died_recomputes_the_tail_where_the_copy_is() {
    let mut dead = worker(0, Role::Hybrid);
    dead.healthy = false;
    dead.cached_tokens = 50_000;
    let mut copy = worker(1, Role::Hybrid);
    copy.cached_tokens = 49_984;
    let mut s = Scenario::new(50_300, vec![dead, copy, worker(2, Role::Hybrid)]);
    s.decode_owner = Some(0);
    s.artifact = Some((1, 49_984));
    let p = s.plan();
    assert_chosen(&p, Action::TailRecompute, 1);
    assert_eq!(p.class, StepClass::ColdResume);
    assert_eq!(p.chosen.compute_tokens, 316);
    assert_eq!(p.chosen.network_bytes, 0.0);
    assert!(
        p.candidates.iter().all(|c| c.action != Action::Migrate),
        "no migrating off a dead worker"
    );
}

#[test]
fn a_draining_owner_hands_the_session_over() {
    let mut d = worker(0, Role::Hybrid);
    d.draining = true;
    d.cached_tokens = 40_000;
    let mut s = Scenario::new(40_100, vec![d, worker(1, Role::Hybrid)]);
    s.decode_owner = Some(0);
    s.artifact = Some((0, 39_984));
    let p = s.plan();
    assert_chosen(&p, Action::Migrate, 1);
    assert_eq!(
        p.changes,
        [
            DirectoryChange::SetDecodeOwner(WorkerId(1)),
            DirectoryChange::MigrateOwner {
                from: WorkerId(0),
                to: WorkerId(1)
            }
        ]
    );
    // Fetching would also work but leaves a duplicate behind; migrating frees the source.
    let fetch = p
        .candidates
        .iter()
        .find(|c| c.action == Action::ArtifactFetch)
        .unwrap();
    assert!(fetch.cost.hbm_bytes > 0.0 && p.chosen.cost.hbm_bytes == 0.0);
}

#[test]
fn hybrid_models_recompute_the_window_after_a_fetch() {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 64_000;
    o.queue_s = 5.0;
    let s = Scenario {
        model: ModelSpec::preset("hybrid-v4-like").unwrap(),
        artifact: Some((0, 63_872)),
        ..Scenario::new(64_100, vec![o, worker(1, Role::Hybrid)])
    };
    let p = s.plan();
    assert_chosen(&p, Action::ArtifactFetch, 1);
    // Sealed up to 63,872; the 128-token window before it is recomputed with the rest.
    assert_eq!(p.chosen.compute_tokens, 64_100 - (63_872 - 128));
}

#[test]
fn a_new_session_goes_where_its_kv_evicts_no_one_else_s_prefix() {
    // Two idle hybrid workers; the first has room for 1,000 more tokens before it must
    // evict a cached prefix, the second for 100,000.
    let mut s = Scenario::new(
        4_000,
        vec![worker(0, Role::Hybrid), worker(1, Role::Hybrid)],
    );
    s.workers[0].kv_room_tokens = Some(1_000);
    s.workers[1].kv_room_tokens = Some(100_000);
    let p = s.plan();
    assert_chosen(&p, Action::Colocate, 1);
    let on_full = p
        .candidates
        .iter()
        .find(|c| c.decode_on == WorkerId(0))
        .unwrap();
    // The 3,000 tokens it would evict, recomputed at its prefill rate.
    assert!(on_full.cost.evict_s > 0.0, "{on_full:?}");
    assert_eq!(p.chosen.cost.evict_s, 0.0);
    // Unknown capacity: no memory term either way.
    s.workers[0].kv_room_tokens = None;
    let p = s.plan();
    assert!(p.candidates.iter().all(|c| c.cost.evict_s == 0.0));
}

#[test]
fn no_available_worker_is_an_error() {
    let mut w = worker(0, Role::Hybrid);
    w.healthy = false;
    let s = Scenario::new(100, vec![w]);
    let err = plan(&PlanInput {
        model: &s.model,
        block_size: 16,
        prompt_tokens: 100,
        decode_owner: None,
        artifact: None,
        workers: &s.workers,
        links: &s.links,
        weights: Weights::default(),
        samples: 1,
        fork: false,
        thresholds: ClassThresholds::default(),
        exhaustive: false,
        migration_budget: MigrationBudget::UNLIMITED,
        move_hold_s: 0.0,
    })
    .unwrap_err();
    assert_eq!(err, PlanError::NoWorker);
}

#[test]
fn more_bandwidth_never_makes_a_fetch_costlier() {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 64_000;
    let mut last = f64::INFINITY;
    for gb in [1.0, 5.0, 12.5, 25.0, 50.0, 100.0, 400.0, 900.0] {
        let s = Scenario {
            artifact: Some((0, 64_000)),
            links: links(gb),
            ..Scenario::new(64_100, vec![o.clone(), worker(1, Role::Hybrid)])
        };
        let fetch = s
            .plan()
            .candidates
            .into_iter()
            .find(|c| c.action == Action::ArtifactFetch)
            .unwrap();
        assert!(
            fetch.cost.total <= last,
            "{gb} GB/s: {} > {last}",
            fetch.cost.total
        );
        last = fetch.cost.total;
    }
}

#[test]
fn longer_prompts_never_make_remote_prefill_cheaper_per_token() {
    // Without fixed per-request costs (link latency, step overhead) and above the
    // roofline's ridge (~215 tokens for this model on an H100; below it a prefill step is
    // bound by reading the weights once, which longer prompts amortise) the cost per
    // token can only grow: attention grows with the context, everything else is linear.
    // The total grows everywhere.
    let mut p = worker(0, Role::Prefill);
    p.roofline = Roofline::new(
        &GpuSpec::preset("h100").unwrap(),
        1,
        Efficiency {
            step_overhead_s: 0.0,
            ..Efficiency::default()
        },
    );
    let mut d = worker(1, Role::Decode);
    d.decoding = 1_000;
    let mut last_per_token = 0.0;
    let mut last_total = 0.0;
    for tokens in [16, 100, 1_000, 4_096, 10_000, 32_768, 100_000, 131_072] {
        let mut s = Scenario::new(tokens, vec![p.clone(), d.clone()]);
        s.links.default.latency_s = 0.0;
        let remote = s
            .plan()
            .candidates
            .into_iter()
            .find(|c| c.action == Action::RemotePrefill)
            .unwrap();
        let per_token = remote.cost.total / tokens as f64;
        if tokens >= 1_000 {
            assert!(
                per_token >= last_per_token,
                "{tokens} tokens: {per_token} < {last_per_token}"
            );
            last_per_token = per_token;
        }
        assert!(remote.cost.total >= last_total, "{tokens} tokens");
        last_total = remote.cost.total;
    }
}

#[test]
fn an_observed_slow_prefill_worker_loses_to_the_preset_speed_one() {
    // Two identical prefill workers; one was measured at 3× its preset's prefill time.
    let mut d = worker(2, Role::Decode);
    d.decoding = 64;
    let mut slow = worker(0, Role::Prefill);
    let mut calibration = crate::ewma::PrefillCalibration::default();
    calibration.observe(0.1, 0.3);
    slow.prefill_scale = calibration.scale();
    let p = Scenario::new(30_000, vec![slow, worker(1, Role::Prefill), d]).plan();
    assert_chosen(&p, Action::RemotePrefill, 2);
    assert_eq!(p.chosen.compute_on, WorkerId(1));
}

#[test]
fn degenerate_steps_do_not_panic() {
    // An empty prompt, and caches that claim more than the prompt, still give a plan.
    for prompt in [0, 1, 15, 16] {
        let mut w = worker(0, Role::Hybrid);
        w.cached_tokens = 1_000;
        let mut s = Scenario::new(
            prompt,
            vec![w, worker(1, Role::Prefill), worker(2, Role::Decode)],
        );
        s.decode_owner = Some(0);
        s.artifact = Some((2, 512));
        let p = s.plan();
        assert!(p.chosen.cost.total.is_finite() && p.chosen.compute_tokens <= prompt.max(1));
    }
}

/// A random step over a random fleet: every role, busy and idle, cached and cold workers,
/// some unhealthy or draining, some exact copies of another worker (so partners tie), with
/// and without an owner, an artifact, samples and a fork, on uniform links.
fn random_scenario(rng: &mut SplitMix64) -> Scenario {
    let pick = |rng: &mut SplitMix64, n: usize| (rng.next_u64() % n as u64) as usize;
    let models = ["llama-3.1-8b", "deepseek-v3", "hybrid-v4-like"];
    let gpus = ["h100", "a100", "l40"];
    let prompt_tokens = match pick(rng, 4) {
        0 => rng.next_u64() % 64,
        _ => 1 + rng.next_u64() % 120_000,
    };
    let n = 1 + pick(rng, 12);
    let mut workers: Vec<PlanWorker> = Vec::with_capacity(n);
    for i in 0..n {
        let id = WorkerId(i as u32);
        if i > 0 && pick(rng, 4) == 0 {
            let twin = workers[pick(rng, i)].clone();
            workers.push(PlanWorker { id, ..twin });
            continue;
        }
        let gpu = GpuSpec::preset(gpus[pick(rng, gpus.len())]).unwrap();
        workers.push(PlanWorker {
            id,
            role: [Role::Prefill, Role::Decode, Role::Hybrid][pick(rng, 3)],
            healthy: pick(rng, 10) != 0,
            draining: pick(rng, 10) == 0,
            roofline: Roofline::new(&gpu, 1 + pick(rng, 4) as u32, Efficiency::default()),
            step_budget: StepBudget {
                tokens: [512, 2_048, 8_192, 16_384][pick(rng, 4)],
                long_prefill_cap: [0, 0, 256, 2_048][pick(rng, 4)],
            },
            queue_s: if pick(rng, 3) == 0 {
                0.0
            } else {
                rng.next_f64() * 2.0
            },
            decoding: rng.next_u64() % 128,
            queued: rng.next_u64() % 8,
            cached_tokens: match pick(rng, 3) {
                0 => 0,
                _ => rng.next_u64() % (prompt_tokens + 2_000) / 16 * 16,
            },
            host_cached_tokens: match pick(rng, 3) {
                0 => rng.next_u64() % (prompt_tokens + 2_000) / 16 * 16,
                _ => 0,
            },
            pulls_kv: pick(rng, 4) != 0,
            prefill_decodes: pick(rng, 2) == 0,
            decode_leg_at_dispatch: pick(rng, 2) == 0,
            pcie_bytes_per_s: gpu.pcie_gbs * 1e9,
            prefill_scale: 0.5 + rng.next_f64() * 1.5,
            kv_room_tokens: match pick(rng, 3) {
                0 => None,
                _ => Some(rng.next_u64() % (prompt_tokens + 2_000)),
            },
            kv_free_tokens: match pick(rng, 3) {
                0 => None,
                _ => Some(rng.next_u64() % (2 * prompt_tokens + 2_000)),
            },
            kv_capacity_tokens: match pick(rng, 3) {
                0 => None,
                _ => Some(2 * prompt_tokens + 2_000 + rng.next_u64() % (4 * prompt_tokens + 1)),
            },
            waiting_tokens: rng.next_u64() % (prompt_tokens + 1),
            decode_lifetime_s: match pick(rng, 3) {
                0 => None,
                _ => Some(rng.next_f64() * 20.0),
            },
            kv_release_per_s: match pick(rng, 3) {
                0 => None,
                _ => Some(rng.next_f64() * 50_000.0),
            },
            parked_returns_per_s: match pick(rng, 2) {
                0 => 0.0,
                _ => rng.next_f64() * 10.0,
            },
        });
    }
    // Ids that are not in the fleet too: a stale owner or artifact.
    let some_id = |rng: &mut SplitMix64| (rng.next_u64() % (n as u64 + 1)) as u32;
    let mut s = Scenario::new(prompt_tokens, workers);
    s.model = ModelSpec::preset(models[pick(rng, models.len())]).unwrap();
    s.decode_owner = (pick(rng, 2) == 0).then(|| some_id(rng));
    s.artifact = (pick(rng, 2) == 0).then(|| {
        let tokens = rng.next_u64() % (prompt_tokens + 1) / 128 * 128;
        (some_id(rng), tokens)
    });
    s.samples = if pick(rng, 4) == 0 {
        2 + pick(rng, 3) as u32
    } else {
        1
    };
    s.fork = pick(rng, 5) == 0;
    // A budget with room, one past half spent, or one spent (or zero): infinite shadow price.
    s.migration_budget = match pick(rng, 4) {
        0 => MigrationBudget::of(0.1, 1e9, rng.next_f64() * 1e8),
        1 => MigrationBudget::of(rng.next_f64() * 0.1, 1e9, 1e8),
        _ => MigrationBudget::UNLIMITED,
    };
    s.links = links(1.0 + rng.next_f64() * 400.0);
    s.links.default.latency_s = rng.next_f64() * 1e-4;
    if pick(rng, 2) == 0 {
        s.weights = Weights {
            lambda_s_per_gb: rng.next_f64() * 0.5,
            mu: rng.next_f64() * 2.0,
            migrate_hysteresis: rng.next_f64() * 4.0,
            nu: rng.next_f64() * 2.0,
            kappa: rng.next_f64() * 2.0,
            rho: rng.next_f64() * 0.5,
            migration_budget: rng.next_f64() * 0.2,
        };
    }
    s
}

/// The routing plan (dominated remote prefills left out) and the explain plan (every
/// pair), or `None` when neither has a worker.
fn pruned_and_exhaustive(s: &mut Scenario) -> Option<(Plan, Plan)> {
    let mut plan_listing = |exhaustive| {
        s.exhaustive = exhaustive;
        plan(&s.input())
    };
    match (plan_listing(false), plan_listing(true)) {
        (Ok(pruned), Ok(all)) => Some((pruned, all)),
        (Err(PlanError::NoWorker), Err(PlanError::NoWorker)) => None,
        other => panic!("one plan failed: {other:#?}"),
    }
}

/// Every candidate `pruned` lists is in `all`, priced the same, in the same order; every
/// move it leaves out costs at least what it chose (so it could not have won).
fn assert_listed_in_full(pruned: &Plan, all: &Plan, step: usize) {
    let mut rest = all.candidates.iter();
    for c in &pruned.candidates {
        assert!(
            rest.any(|e| e == c),
            "step {step}: {c:#?} is not listed in full"
        );
    }
    // A candidate left out unpriced (a move, or any of a skipped decoder's) could not
    // have won. Dominated remote prefills are checked by the caller.
    for c in all
        .candidates
        .iter()
        .filter(|c| c.action != Action::RemotePrefill)
    {
        if !pruned.candidates.contains(c) {
            assert!(
                c.cost.total >= pruned.chosen.cost.total,
                "step {step}: a candidate left out was cheaper: {c:#?}"
            );
        }
    }
}

/// The decoders `p` prices a colocation, remote prefill or fetch for.
fn decoders_priced(p: &Plan) -> std::collections::BTreeSet<WorkerId> {
    p.candidates
        .iter()
        .filter(|c| {
            matches!(
                c.action,
                Action::Colocate | Action::RemotePrefill | Action::ArtifactFetch
            )
        })
        .map(|c| c.decode_on)
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn pruning_dominated_remote_prefills_keeps_the_choice() {
    let mut rng = SplitMix64::new(0x5eed);
    let mut remote_chosen = 0;
    let mut moves_left_out = 0;
    let mut decoders_skipped = 0;
    for i in 0..3_000 {
        let mut s = random_scenario(&mut rng);
        let Some((pruned, all)) = pruned_and_exhaustive(&mut s) else {
            continue;
        };
        let (a, b) = (&pruned.chosen, &all.chosen);
        assert!(
            all.candidates.iter().all(|c| !c.cost.total.is_nan()),
            "step {i}: a NaN total: {:#?}",
            all.candidates
        );
        assert_eq!(
            (a.action, a.compute_on, a.decode_on, a.source),
            (b.action, b.compute_on, b.decode_on, b.source),
            "step {i}: {a:#?} vs {b:#?}"
        );
        assert!(close(a.cost.total, b.cost.total), "step {i}");
        assert_eq!((pruned.class, &pruned.changes), (all.class, &all.changes));
        remote_chosen += usize::from(a.action == Action::RemotePrefill);
        let moves = |p: &Plan| {
            p.candidates
                .iter()
                .filter(|c| c.action == Action::Migrate)
                .count()
        };
        moves_left_out += moves(&all) - moves(&pruned);
        // Every listed candidate is one of the full list, priced the same, in the same
        // order; only remote prefills, moves and decoders that cannot win are dropped.
        assert_listed_in_full(&pruned, &all, i);
        let priced = decoders_priced(&pruned);
        decoders_skipped += decoders_priced(&all).len() - priced.len();
        let others = |p: &Plan| {
            p.candidates
                .iter()
                .filter(|c| !matches!(c.action, Action::RemotePrefill | Action::Migrate))
                .filter(|c| c.action == Action::TailRecompute || priced.contains(&c.decode_on))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(others(&pruned), others(&all), "step {i}");
        // Each decoder keeps exactly its cheapest remote prefill, the first among equals.
        let remote = |p: &Plan, d: WorkerId| {
            p.candidates
                .iter()
                .filter(|c| c.action == Action::RemotePrefill && c.decode_on == d)
                .cloned()
                .collect::<Vec<_>>()
        };
        for d in all.candidates.iter().map(|c| c.decode_on) {
            if !priced.contains(&d) {
                assert!(remote(&pruned, d).is_empty(), "step {i}");
                continue;
            }
            let full = remote(&all, d);
            let Some(best) = full
                .iter()
                .reduce(|b, c| if c.cost.total < b.cost.total { c } else { b })
            else {
                assert!(remote(&pruned, d).is_empty(), "step {i}");
                continue;
            };
            let kept = remote(&pruned, d);
            assert_eq!(kept.len(), 1, "step {i}, decoder {d}");
            // Another partner only where float rounding of the split sum set them apart.
            let (k, b) = (kept[0].cost.total, best.cost.total);
            assert!(
                kept[0].compute_on == best.compute_on || (k != b && close(k, b)),
                "step {i}, decoder {d}: kept {:#?}, cheapest {best:#?}",
                kept[0]
            );
        }
    }
    // The fleets do exercise the pruned choice, and moves left out unpriced.
    assert!(
        remote_chosen > 300,
        "{remote_chosen} remote prefills chosen"
    );
    assert!(moves_left_out > 300, "{moves_left_out} moves left out");
    assert!(
        decoders_skipped > 300,
        "{decoders_skipped} decoders skipped"
    );
}

#[test]
fn per_pair_links_list_every_pair() {
    let mut rng = SplitMix64::new(11);
    for i in 0..500 {
        let mut s = random_scenario(&mut rng);
        let n = s.workers.len() as u32;
        let (from, to) = (rng.next_u64() as u32 % n, rng.next_u64() as u32 % n);
        let slow = Link {
            bytes_per_s: 1e9,
            latency_s: 1e-3,
        };
        s.links.pairs.insert((WorkerId(from), WorkerId(to)), slow);
        let Some((pruned, all)) = pruned_and_exhaustive(&mut s) else {
            continue;
        };
        // Every pair of each decoder priced (a decoder that cannot win is skipped whole).
        let priced = decoders_priced(&pruned);
        let pairs = |p: &Plan| {
            p.candidates
                .iter()
                .filter(|c| c.action != Action::Migrate)
                .filter(|c| c.action == Action::TailRecompute || priced.contains(&c.decode_on))
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(&pruned), pairs(&all), "step {i}");
        assert_listed_in_full(&pruned, &all, i);
        assert_eq!(pruned.chosen, all.chosen, "step {i}");
    }
    // And every pair is there: the prefill workers × the decoders.
    let mut s = mixed_fleet();
    s.links
        .pairs
        .insert((WorkerId(0), WorkerId(1)), s.links.default);
    let remote = s
        .plan()
        .candidates
        .iter()
        .filter(|c| c.action == Action::RemotePrefill)
        .count();
    assert_eq!(remote, 2 * 4);
}

/// Six workers, two of each role: 4 can decode (the hybrid ones too), and the 2 prefill
/// workers prefill for them.
fn mixed_fleet() -> Scenario {
    Scenario::new(
        30_000,
        (0..6)
            .map(|i| {
                worker(
                    i,
                    [Role::Prefill, Role::Decode, Role::Hybrid][i as usize % 3],
                )
            })
            .collect(),
    )
}

#[test]
fn uniform_links_list_one_remote_prefill_per_decoder() {
    let mut s = mixed_fleet();
    let remote = |s: &Scenario| {
        s.plan()
            .candidates
            .iter()
            .filter(|c| c.action == Action::RemotePrefill)
            .count()
    };
    assert_eq!(remote(&s), 4);
    s.exhaustive = true;
    assert_eq!(remote(&s), 2 * 4);
}

#[test]
fn only_prefill_workers_prefill_for_another_worker() {
    // Hybrid workers receive remote prefills from the prefill workers, and never send one:
    // on a fleet of hybrids alone no step is a remote prefill, however busy its decoder.
    let mut s = mixed_fleet();
    s.exhaustive = true;
    let plan = s.plan();
    let remote: Vec<_> = plan
        .candidates
        .iter()
        .filter(|c| c.action == Action::RemotePrefill)
        .collect();
    assert!(remote.iter().all(|c| c.compute_on.0 % 3 == 0));
    assert!(
        remote.iter().any(|c| c.decode_on.0 % 3 == 2),
        "hybrids receive"
    );
    let mut busy = worker(0, Role::Hybrid);
    busy.queue_s = 30.0;
    busy.queued = 20;
    let mut hybrids = Scenario::new(30_000, vec![busy, worker(1, Role::Hybrid)]);
    hybrids.exhaustive = true;
    assert!(hybrids
        .plan()
        .candidates
        .iter()
        .all(|c| c.action != Action::RemotePrefill));
}

#[test]
fn a_remote_prefill_waits_for_the_decoder_s_queue_too() {
    // Both decoders are equally far from the prefill worker; one has 5 s of prefills
    // queued. Its decode leg would wait behind them after the KV arrives.
    let scenario = |waiting: u64, at_dispatch: bool| {
        let mut busy = worker(1, Role::Decode);
        busy.queue_s = 5.0;
        busy.queued = waiting;
        busy.decoding = 30;
        busy.decode_leg_at_dispatch = at_dispatch;
        let mut idle = worker(2, Role::Decode);
        idle.decoding = 30;
        idle.decode_leg_at_dispatch = at_dispatch;
        Scenario::new(16_000, vec![worker(0, Role::Prefill), busy, idle])
    };
    let remote_to = |p: &Plan, d: u32| {
        p.candidates
            .iter()
            .find(|c| c.action == Action::RemotePrefill && c.decode_on == WorkerId(d))
            .unwrap()
            .cost
    };
    // vLLM's two-step to a backlogged decoder (steps waiting in its engine): the leg
    // arrives after the prefill and finds the queue as long as it is now.
    let p = scenario(4, false).plan();
    let (b, i) = (remote_to(&p, 1), remote_to(&p, 2));
    assert!((b.queue_s - 5.0).abs() < 1e-9, "{b:?} vs {i:?}");
    assert_eq!(i.queue_s, 0.0);
    assert_chosen(&p, Action::RemotePrefill, 2);
    // Nothing waiting there (only the prompts it computes now), or SGLang's pair, whose
    // leg holds its place from dispatch: the queue drains while the prefill runs.
    for (waiting, at_dispatch) in [(0, false), (4, true)] {
        let p = scenario(waiting, at_dispatch).plan();
        let (b, i) = (remote_to(&p, 1), remote_to(&p, 2));
        let leg = i.queue_s + i.compute_s;
        assert!((b.queue_s - (5.0 - leg)).abs() < 1e-9, "{b:?} vs {i:?}");
        assert_eq!(i.queue_s, 0.0);
        assert_chosen(&p, Action::RemotePrefill, 2);
    }
}

/// The cost of colocating the step on worker `d`.
fn colocate_cost(p: &Plan, d: u32) -> CostTerms {
    p.candidates
        .iter()
        .find(|c| c.action == Action::Colocate && c.decode_on == WorkerId(d))
        .unwrap()
        .cost
}

#[test]
fn a_decoder_whose_running_sequences_fill_its_kv_is_priced_for_the_preemption() {
    let mut full = worker(1, Role::Decode);
    full.kv_free_tokens = Some(2_000);
    let mut roomy = worker(2, Role::Decode);
    roomy.kv_free_tokens = Some(200_000);
    let s = Scenario::new(10_000, vec![full, roomy]);
    let p = s.plan();
    let on = |d: u32| colocate_cost(&p, d);
    // 8,000 running tokens are pushed out of the full one: their recompute is charged.
    assert!(on(1).evict_s > 0.0 && on(2).evict_s == 0.0, "{:?}", on(1));
    let expected = s.workers[0]
        .roofline
        .step_time(
            &s.model,
            &crate::roofline::StepWork {
                prefill_tokens: 8_000,
                prefill_attention_pairs: crate::roofline::prefill_pairs(8_000, 2_000),
                prefill_context_tokens: 2_000,
                ..Default::default()
            },
        )
        .total_s;
    assert!(
        (on(1).evict_s - expected).abs() < 1e-9,
        "{} vs {expected}",
        on(1).evict_s
    );
    assert_chosen(&p, Action::Colocate, 2);
}

/// A decoder with 400K KV tokens whose running sequences hold `400K − free`, decoding 20,
/// with an observed decode lifetime of 10 s.
fn pressured(id: u32, free: u64, room: u64, cached: u64) -> PlanWorker {
    let mut w = worker(id, Role::Decode);
    w.decoding = 20;
    w.kv_capacity_tokens = Some(400_000);
    w.kv_free_tokens = Some(free);
    w.kv_room_tokens = Some(room);
    w.cached_tokens = cached;
    w.decode_lifetime_s = Some(10.0);
    w
}

#[test]
fn a_prefix_the_queue_ahead_will_evict_is_not_counted_as_reused() {
    // The owner holds 48K of the 50K prompt in its evictable cache, but 90K tokens queued
    // ahead of the step will take its 10K empty blocks and then most of its 100K
    // evictable ones before the step is admitted.
    let mut owner = pressured(1, 110_000, 10_000, 48_000);
    owner.waiting_tokens = 90_000;
    owner.queue_s = 0.5;
    let mut s = Scenario::new(50_000, vec![owner.clone()]);
    s.decode_owner = Some(1);
    let stays = |p: &Plan| {
        p.candidates
            .iter()
            .find(|c| c.action == Action::Colocate && c.decode_on == WorkerId(1))
            .cloned()
            .unwrap()
    };
    let c = stays(&s.plan());
    assert!(c.reused_tokens < 48_000 / 5, "{c:?}");
    // With nothing queued ahead the prefix is all there.
    owner.waiting_tokens = 0;
    owner.queue_s = 0.0;
    owner.decoding = 0;
    s.workers = vec![owner];
    assert_eq!(stays(&s.plan()).reused_tokens, 48_000);
}

#[test]
fn a_decoder_whose_kv_is_full_waits_for_its_running_sequences_to_finish() {
    // 380K of 400K held by 20 running sequences (19K each): a 40K prompt is 20K short,
    // so it waits for two of them to end, a tenth of the running KV, a tenth of the
    // lifetime.
    let full = pressured(1, 20_000, 0, 0);
    let roomy = pressured(2, 200_000, 200_000, 0);
    let s = Scenario::new(40_000, vec![full, roomy]);
    let p = s.plan();
    let on = |d: u32| colocate_cost(&p, d);
    assert!((on(1).queue_s - 1.0).abs() < 1e-9, "{:?}", on(1));
    assert_eq!(on(2).queue_s, 0.0);
    assert_chosen(&p, Action::Colocate, 2);
}

/// An owner (worker 1) holding 48K tokens of a 50K prompt with 110K free (10K of it
/// empty), and an idle target (worker 2) as full, with `waiting` tokens queued there.
fn owner_and_full_target(waiting: u64) -> (PlanWorker, PlanWorker) {
    let owner = pressured(1, 110_000, 10_000, 48_000);
    let mut full = pressured(2, 110_000, 10_000, 0);
    full.waiting_tokens = waiting;
    full.decoding = 0;
    (owner, full)
}

#[test]
fn a_move_recomputes_the_prefix_where_that_beats_copying_it() {
    // The owner holds 19,200 of a 29,521-token prompt behind an 8 s queue; the other worker
    // is idle. At 50 GB/s the move copies the prefix; at 1 GB/s the copy (2.5 s) is slower
    // than recomputing it, so the move sends nothing and computes the whole prompt, and it
    // still beats waiting on the owner.
    let mut owner = worker(0, Role::Hybrid);
    owner.cached_tokens = 19_200;
    owner.queue_s = 8.0;
    let mut s = Scenario::new(29_521, vec![owner, worker(1, Role::Hybrid)]);
    s.decode_owner = Some(0);
    s.exhaustive = true;
    let move_to_1 = |s: &Scenario| {
        let p = s.plan();
        let m = p
            .candidates
            .iter()
            .find(|c| c.action == Action::Migrate)
            .cloned()
            .expect("a move is priced");
        (p, m)
    };
    let (_, fast) = move_to_1(&s);
    assert_eq!(fast.reused_tokens, 19_200, "{fast:#?}");
    assert!(fast.network_bytes > 0.0);
    s.links = links(1.0);
    let (p, slow) = move_to_1(&s);
    assert_eq!(
        (slow.reused_tokens, slow.network_bytes, slow.compute_tokens),
        (0, 0.0, 29_521),
        "{slow:#?}"
    );
    assert!(
        slow.cost.hbm_bytes > 0.0,
        "the source keeps its copy: {slow:#?}"
    );
    assert_chosen(&p, Action::Migrate, 1);
}

#[test]
fn a_move_that_copies_nothing_pays_no_hysteresis_when_the_budget_is_spent() {
    // The move recomputes the whole prompt on a full target (nothing of the owner's copy
    // survives its queue there), so it ships nothing. With the budget spent (or set to 0)
    // the shadow price is infinite; the move must still be a finite price, and lose to
    // the owner, which holds the prompt and has no queue.
    let (owner, full) = owner_and_full_target(200_000);
    for budget in [
        MigrationBudget::of(0.0, 1e12, 0.0),
        MigrationBudget::of(0.1, 1e9, 1e8),
    ] {
        assert_eq!(budget.shadow_price(), f64::INFINITY);
        let mut s = Scenario::new(50_000, vec![owner.clone(), full.clone()]);
        s.decode_owner = Some(1);
        s.exhaustive = true;
        s.migration_budget = budget;
        let p = s.plan();
        let m = p
            .candidates
            .iter()
            .find(|c| c.action == Action::Migrate)
            .expect("a move that ships nothing fits any budget");
        assert_eq!((m.network_bytes, m.cost.hysteresis_s), (0.0, 0.0), "{m:#?}");
        assert!(m.cost.total.is_finite(), "{m:#?}");
        assert_chosen(&p, Action::Colocate, 1);
    }
}

#[test]
fn a_migration_sends_what_its_source_holds_now_not_what_would_survive_there() {
    // The owner's prefix would not survive its queue, but a migration reads it at once.
    let mut owner = pressured(1, 110_000, 10_000, 48_000);
    owner.waiting_tokens = 200_000;
    let idle = pressured(2, 390_000, 390_000, 0);
    let mut s = Scenario::new(50_000, vec![owner, idle]);
    s.decode_owner = Some(1);
    let p = s.plan();
    let m = p
        .candidates
        .iter()
        .find(|c| c.action == Action::Migrate)
        .unwrap();
    assert_eq!(m.reused_tokens, 48_000, "{m:?}");
}

#[test]
fn a_move_onto_a_full_worker_ships_only_what_survives_its_queue_there() {
    // The owner holds 48K of the 50K prompt. The target has 110K free (10K empty, 100K of
    // older cached prefixes) and 90K queued ahead of the step. The copy lands as the
    // newest free content, so the queued prompts take the 110K − 48K older free tokens
    // first and then 28K of the copy: the move ships and counts as reused only the 20K
    // that are left; the rest is recomputed.
    let (owner, full) = owner_and_full_target(90_000);
    let mut s = Scenario::new(50_000, vec![owner, full]);
    s.decode_owner = Some(1);
    s.exhaustive = true;
    let moved = |s: &Scenario| {
        s.plan()
            .candidates
            .iter()
            .find(|c| c.action == Action::Migrate)
            .cloned()
            .unwrap()
    };
    let m = moved(&s);
    assert_eq!(m.reused_tokens, 20_000, "{m:?}");
    let part_bytes = s.model.prefix_bytes(20_000, 16).total;
    assert!((m.network_bytes - part_bytes).abs() < 1.0, "{m:?}");
    // With 60K queued, the older free tokens (62K) cover them: all of it moves, though a
    // prefix of the target's own anywhere in its evictable cache would lose half.
    s.workers[1].waiting_tokens = 60_000;
    assert_eq!(moved(&s).reused_tokens, 48_000);
    // More queued than is free: nothing survives, nothing is shipped.
    s.workers[1].waiting_tokens = 200_000;
    let m = moved(&s);
    assert_eq!((m.reused_tokens, m.network_bytes), (0, 0.0), "{m:?}");
    // Onto a worker with nothing queued, all of it moves.
    s.workers[1].waiting_tokens = 0;
    assert_eq!(moved(&s).reused_tokens, 48_000);
}

/// The colocate candidate on a lone hybrid worker that holds `hbm` tokens of a 32K prompt
/// in HBM and `host` more in host memory, restoring at `pcie_gbs`.
fn colocate_with_host(hbm: u64, host: u64, pcie_gbs: f64) -> Candidate {
    let mut w = worker(0, Role::Hybrid);
    w.cached_tokens = hbm;
    w.host_cached_tokens = host;
    w.pcie_bytes_per_s = pcie_gbs * 1e9;
    let mut s = Scenario::new(32_000, vec![w]);
    s.decode_owner = Some(0);
    let p = s.plan();
    assert_eq!(p.chosen.action, Action::Colocate);
    p.chosen
}

#[test]
fn a_long_host_cached_prefix_is_restored_over_pcie_instead_of_recomputed() {
    let none = colocate_with_host(0, 0, 50.0);
    let host = colocate_with_host(0, 30_000, 50.0);
    assert_eq!(host.restored_tokens, 30_000);
    assert_eq!(host.compute_tokens, 2_000);
    assert_eq!(host.reused_tokens, 30_000);
    // One step's fixed cost, then 30K tokens × 128 KiB over 50 GB/s.
    let expected = Efficiency::default().step_overhead_s + 30_000.0 * 131_072.0 / 50e9;
    assert!(
        (host.cost.host_restore_s - expected).abs() < 1e-9,
        "{host:?}"
    );
    assert!(
        host.cost.total < none.cost.total / 2.0,
        "{host:?} vs {none:?}"
    );
}

#[test]
fn a_tiny_host_copy_or_a_slow_bus_recomputes_at_the_price_without_a_host_tier() {
    let none = colocate_with_host(16_000, 0, 50.0);
    // One block: restoring it waits a step, recomputing it adds less than that to a
    // 16K-token prefill that runs anyway.
    let tiny = colocate_with_host(16_000, 16, 50.0);
    // A 0.05 GB/s bus takes longer to copy 16K tokens than the GPU takes to compute them.
    let slow = colocate_with_host(16_000, 15_000, 0.05);
    for c in [&tiny, &slow] {
        assert_eq!(c.restored_tokens, 0, "{c:?}");
        assert_eq!(c.cost.host_restore_s, 0.0);
        assert_eq!(
            c.cost, none.cost,
            "recomputing is priced as if nothing were held"
        );
    }
    // The same 15K on a PCIe Gen5 bus is restored.
    assert_eq!(
        colocate_with_host(16_000, 15_000, 50.0).restored_tokens,
        15_000
    );
}

#[test]
fn without_host_holds_the_pcie_figure_changes_no_price() {
    // The real-vLLM P/D check: a busy decoder, an idle prefill worker. Whatever the PCIe
    // bandwidth, with nothing in host memory every candidate costs the same.
    let plan_at = |pcie: f64| {
        let mut d = worker(0, Role::Decode);
        d.decoding = 40;
        d.queue_s = 0.2;
        d.pcie_bytes_per_s = pcie;
        let mut p = worker(1, Role::Prefill);
        p.pcie_bytes_per_s = pcie;
        let mut s = Scenario::new(12_000, vec![d, p]);
        s.decode_owner = Some(0);
        s.exhaustive = true;
        s.plan()
    };
    let (a, b) = (plan_at(50e9), plan_at(1e6));
    assert_eq!(a.candidates, b.candidates);
    assert_eq!(a.chosen.action, Action::RemotePrefill);
}

#[test]
fn a_demoted_tail_in_the_owners_host_memory_is_restored_by_tail_recompute() {
    // The session was demoted: its sealed prefix (24K) stays in the artifact owner's HBM,
    // its tail (6K) went to the owner's host memory.
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 24_000;
    o.host_cached_tokens = 6_000;
    let mut s = Scenario::new(30_500, vec![o, worker(1, Role::Hybrid)]);
    s.artifact = Some((0, 24_000));
    let p = s.plan();
    assert_chosen(&p, Action::TailRecompute, 0);
    assert_eq!(p.chosen.restored_tokens, 6_000);
    assert_eq!(p.chosen.compute_tokens, 500);
    s.workers[0].host_cached_tokens = 0;
    let cold = s.plan();
    assert_eq!(cold.chosen.compute_tokens, 6_500);
    assert!(p.chosen.cost.total < cold.chosen.cost.total);
}

/// The artifact fetch candidate onto worker 1, which holds the first `host` tokens of the
/// 64K sealed prefix in host memory at `pcie_gbs`; the owner 0 is busy.
fn fetch_with_host(host: u64, pcie_gbs: f64) -> Candidate {
    let mut o = worker(0, Role::Hybrid);
    o.cached_tokens = 64_000;
    o.queue_s = 5.0;
    let mut w = worker(1, Role::Hybrid);
    w.host_cached_tokens = host;
    w.pcie_bytes_per_s = pcie_gbs * 1e9;
    let s = Scenario {
        artifact: Some((0, 64_000)),
        decode_owner: Some(0),
        samples: 4,
        exhaustive: true,
        ..Scenario::new(64_100, vec![o, w])
    };
    s.plan()
        .candidates
        .into_iter()
        .find(|c| c.action == Action::ArtifactFetch)
        .unwrap()
}

#[test]
fn a_fetch_restores_what_the_target_holds_in_host_memory_and_pulls_only_the_rest() {
    let none = fetch_with_host(0, 50.0);
    let half = fetch_with_host(32_000, 50.0);
    // The first 32K come over PCIe, only the rest over the link.
    assert_eq!(half.restored_tokens, 32_000);
    assert!(
        (half.network_bytes - none.network_bytes / 2.0).abs() < none.network_bytes * 0.01,
        "{} of {}",
        half.network_bytes,
        none.network_bytes
    );
    assert_eq!(half.compute_tokens, none.compute_tokens);
    assert!(half.cost.host_restore_s > 0.0);
    // A bus slower than the link: the whole prefix is fetched, as without a host copy.
    let slow = fetch_with_host(32_000, 10.0);
    assert_eq!(slow.restored_tokens, 0);
    assert_eq!(slow.network_bytes, none.network_bytes);
}

#[test]
fn a_new_session_decodes_where_the_least_context_runs_not_where_the_fewest_sequences_do() {
    // Two idle-queued decoders: `0` runs 10 sequences holding 300K KV tokens, `1` runs 14
    // holding 100K. By count `0` is lighter; by what a decode step reads it is heavier.
    let decoder = |id, decoding, running: u64| {
        let mut w = worker(id, Role::Hybrid);
        w.decoding = decoding;
        w.kv_capacity_tokens = Some(430_000);
        w.kv_free_tokens = Some(430_000 - running);
        w.decode_lifetime_s = Some(5.0);
        w
    };
    let mut s = Scenario::new(
        8_000,
        vec![decoder(0, 10, 300_000), decoder(1, 14, 100_000)],
    );
    let p = s.plan();
    assert_eq!(p.chosen.decode_on, WorkerId(1), "{}", p.reason());
    let on = |p: &Plan, id| {
        p.candidates
            .iter()
            .find(|c| c.action == Action::Colocate && c.decode_on == WorkerId(id))
            .map(|c| c.cost.decode_s)
            .unwrap()
    };
    assert!(on(&p, 0) > on(&p, 1));
    // Without the decode term the step is priced up to its first token only, where the
    // decoder with fewer sequences to stall is cheaper.
    s.weights.rho = 0.0;
    assert_eq!(s.plan().chosen.decode_on, WorkerId(0));
    // Before any decode lifetime is observed, the term is 0 and changes nothing.
    s.weights.rho = Weights::default().rho;
    for w in &mut s.workers {
        w.decode_lifetime_s = None;
    }
    let p = s.plan();
    assert_eq!(p.chosen.decode_on, WorkerId(0));
    assert_eq!(on(&p, 1), 0.0);
}

/// A fetch copies what the artifact's owner still caches, not what the directory sealed:
/// with most of the 64K prefix evicted there, it is priced for the part that is left and
/// the prompt's rest is computed; with none left, there is nothing to fetch.
#[test]
fn a_fetch_brings_only_what_the_artifact_owner_still_caches() {
    let fetch = |held: u64| {
        let mut o = worker(0, Role::Hybrid);
        o.cached_tokens = held;
        o.queue_s = 5.0;
        let s = Scenario {
            artifact: Some((0, 64_000)),
            decode_owner: Some(0),
            fork: true,
            exhaustive: true,
            ..Scenario::new(64_100, vec![o, worker(1, Role::Hybrid)])
        };
        s.plan()
            .candidates
            .into_iter()
            .find(|c| c.action == Action::ArtifactFetch)
    };
    let all = fetch(64_000).unwrap();
    let part = fetch(16_000).unwrap();
    assert_eq!((all.reused_tokens, all.compute_tokens), (64_000, 100));
    assert_eq!((part.reused_tokens, part.compute_tokens), (16_000, 48_100));
    assert!(
        (part.network_bytes - all.network_bytes / 4.0).abs() < all.network_bytes * 0.01,
        "{} of {}",
        part.network_bytes,
        all.network_bytes
    );
    assert!(fetch(0).is_none(), "the owner holds nothing to fetch");
}

/// A fleet of `n` workers, a quarter prefill-only, each with random load and a random
/// cached share of a 100K-token prompt (`ownerserve bench planner`'s fleet).
fn loaded_fleet(n: u32, rng: &mut SplitMix64) -> Vec<PlanWorker> {
    let tokens = 100_000;
    (0..n)
        .map(|i| {
            let role = if i % 4 == 0 {
                Role::Prefill
            } else {
                Role::Decode
            };
            PlanWorker {
                queue_s: (rng.next_u64() % 1000) as f64 / 1e4,
                decoding: rng.next_u64() % 64,
                queued: rng.next_u64() % 8,
                cached_tokens: rng.next_u64() % tokens / 16 * 16,
                kv_room_tokens: Some(rng.next_u64() % (2 * tokens)),
                kv_free_tokens: Some(rng.next_u64() % (4 * tokens)),
                kv_capacity_tokens: Some(4 * tokens + rng.next_u64() % (4 * tokens)),
                waiting_tokens: rng.next_u64() % tokens,
                decode_lifetime_s: Some((rng.next_u64() % 1000) as f64 / 1e2),
                ..worker(i, role)
            }
        })
        .collect()
}

/// What a step prices in full does not grow with the fleet: every worker costs a floor
/// (a comparison), and only those whose floor is under the cheapest candidate so far are
/// admitted (`admission.rs`) and priced, a few dozen whatever the size; the choice is the
/// explain plan's.
#[test]
fn a_step_admits_and_prices_a_few_dozen_workers_whatever_the_fleet_size() {
    use super::admission::ADMISSIONS;
    let mut rng = SplitMix64::new(65);
    for owner in [None, Some(3)] {
        let counted: Vec<(usize, usize)> = [64, 256, 1024]
            .into_iter()
            .map(|n| {
                let mut s = Scenario::new(100_000, loaded_fleet(n, &mut rng));
                s.decode_owner = owner;
                s.artifact = Some((1, 90_000));
                let (pruned, all) = pruned_and_exhaustive(&mut s).unwrap();
                assert_eq!(
                    (pruned.chosen.action, pruned.chosen.decode_on),
                    (all.chosen.action, all.chosen.decode_on),
                    "{n} workers"
                );
                s.exhaustive = false;
                ADMISSIONS.with(|a| a.set(0));
                let priced = s.plan().candidates.len();
                (ADMISSIONS.with(std::cell::Cell::get), priced)
            })
            .collect();
        assert!(
            counted.iter().all(|&(a, c)| a <= 100 && c <= 100),
            "owner {owner:?}: (admitted, priced) {counted:?} on 64, 256 and 1,024 workers"
        );
    }
}

/// A move's answer is held for the router's read lease: a session leaves an owner a little
/// busier than a peer only when the hold is not set, and the hold costs a move nothing
/// that its own queue and compute outlast. A fork's branch is a new session and moves
/// nothing.
#[test]
fn a_move_pays_the_wait_for_its_answer_s_hold_beyond_its_own_work() {
    let mut owner = worker(0, Role::Hybrid);
    owner.cached_tokens = 1_792;
    let scenario = |hold_s: f64, queue_s: f64| {
        let mut o = owner.clone();
        o.queue_s = queue_s;
        let mut s = Scenario::new(2_000, vec![o, worker(1, Role::Hybrid)]);
        s.decode_owner = Some(0);
        s.move_hold_s = hold_s;
        s
    };
    let free = scenario(0.0, 0.08).plan();
    assert_eq!(free.chosen.decode_on, WorkerId(1), "{free:#?}");
    assert_eq!(free.chosen.cost.move_hold_s, 0.0);

    let held = scenario(0.1, 0.08).plan();
    assert_chosen(&held, Action::Colocate, 0);
    let moved = held
        .candidates
        .iter()
        .find(|c| c.decode_on == WorkerId(1))
        .unwrap();
    let c = moved.cost;
    let own_work = c.queue_s + c.compute_s + c.network_s + c.restore_s;
    assert!((c.move_hold_s - (0.1 - own_work)).abs() < 1e-12, "{c:#?}");

    // A swamped owner loses the session all the same; behind a peer's own queue longer
    // than the hold, the move waits for nothing more.
    let mut swamped = scenario(0.1, 2.0);
    swamped.workers[1].queue_s = 0.5;
    let p = swamped.plan();
    assert_eq!(p.chosen.decode_on, WorkerId(1), "{p:#?}");
    assert_eq!(p.chosen.cost.move_hold_s, 0.0);

    let mut fork = scenario(0.1, 0.08);
    fork.fork = true;
    let p = fork.plan();
    assert!(
        p.candidates.iter().all(|c| c.cost.move_hold_s == 0.0),
        "{p:#?}"
    );
}
