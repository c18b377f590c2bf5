//! The bound is a bound (no policy beats it on any step of several workloads and fleets),
//! it is tight where nothing else interferes, and shared prefixes count only when the step
//! that computed them may have run first.

use super::*;
use crate::report::{all_policies, run_one};
use crate::scenario::WorkloadSpec;
use crate::sim::SimOptions;
use crate::workload::{ForkOf, Session, Step};
use ownerserve_shim::sim::config::SimSettings;

fn cluster(spec: &str) -> Cluster {
    Cluster::parse(spec, &SimSettings::default()).expect("cluster")
}

fn workload(name: &str, sessions: Option<usize>, max_requests: usize) -> Workload {
    WorkloadSpec {
        workload: name.to_owned(),
        sessions,
        rate: 4.0,
        max_requests,
        ..WorkloadSpec::default()
    }
    .build()
    .expect("workload")
}

/// `actual ≥ bound`, with room for float rounding.
fn at_least(actual: f64, bound: f64) -> bool {
    actual >= bound - 1e-9 * bound.abs().max(1.0)
}

fn check_policies_against_the_bound(wl: &Workload, spec: &str) {
    let c = cluster(spec);
    let bound = lower_bound(wl, &c).expect("bound");
    assert_eq!(bound.steps.len(), wl.num_requests());
    assert_eq!(bound.rejected(), 0);
    let floor: HashMap<(usize, usize), StepRecord> = bound
        .steps
        .iter()
        .map(|s| ((s.session, s.step), *s))
        .collect();
    let mut bound_e2e = bound.session_e2e_s.clone();
    bound_e2e.sort_by(f64::total_cmp);
    for name in all_policies().into_iter().filter(|n| n != BOUND) {
        let r = run_one(&name, wl, &c, &SimOptions::default(), &|_| {}).expect("runs");
        assert_eq!(r.rejected(), 0, "{name} on {spec}");
        for s in &r.steps {
            let b = floor[&(s.session, s.step)];
            let what = format!(
                "{name} on {spec}, {} session {} step {}",
                wl.name, s.session, s.step
            );
            assert!(
                at_least(s.ttft_s, b.ttft_s),
                "{what}: ttft {} < {}",
                s.ttft_s,
                b.ttft_s
            );
            assert!(
                at_least(s.latency_s, b.latency_s),
                "{what}: latency {} < {}",
                s.latency_s,
                b.latency_s
            );
            if s.tpot_s.is_finite() {
                assert!(
                    at_least(s.tpot_s, b.tpot_s),
                    "{what}: tpot {} < {}",
                    s.tpot_s,
                    b.tpot_s
                );
            }
            assert!(s.cached_tokens <= s.prompt_tokens);
        }
        // Per-session task times dominate, so the sorted lists do too.
        let mut e2e = r.session_e2e_s.clone();
        e2e.sort_by(f64::total_cmp);
        assert_eq!(e2e.len(), bound_e2e.len(), "{name} on {spec}");
        for (a, b) in e2e.iter().zip(&bound_e2e) {
            assert!(at_least(*a, *b), "{name} on {spec}: e2e {a} < {b}");
        }
        assert!(r.duplicate_factor >= bound.duplicate_factor, "{name}");
    }
}

#[test]
fn no_policy_beats_the_bound_on_agent_sessions() {
    let wl = workload("swe-smith", Some(8), 0);
    check_policies_against_the_bound(&wl, "1p3d");
    check_policies_against_the_bound(&wl, "2h");
}

#[test]
fn no_policy_beats_the_bound_on_forks_and_open_loop_traces() {
    check_policies_against_the_bound(&workload("forked", Some(3), 0), "1p2d");
    check_policies_against_the_bound(&workload("forked-samples", Some(3), 0), "2h");
    check_policies_against_the_bound(&workload("mooncake", None, 120), "1p3d");
}

fn step(ids: &[u64], input: u32, output: u32) -> Step {
    Step {
        output_tokens: output,
        ..Step::of(input, ids.to_vec())
    }
}

fn closed(sessions: Vec<Session>) -> Workload {
    Workload {
        name: "hand-made".to_owned(),
        hash_block: 16,
        looping: Loop::Closed,
        sessions,
    }
}

fn session(id: &str, steps: Vec<Step>) -> Session {
    Session {
        id: id.to_owned(),
        start_ms: 0.0,
        fork_of: None,
        steps,
    }
}

#[test]
fn on_an_idle_worker_the_bound_is_what_the_engine_takes() {
    // One fresh prompt per session, far apart: nothing queues, nothing is cached. One fits a
    // step's token budget, the other takes three chunks.
    let ids = |base: u64, n: u64| (base..base + n).collect::<Vec<_>>();
    let mut wl = closed(vec![
        session("a", vec![step(&ids(1, 256), 4096, 64)]),
        session("b", vec![step(&ids(1000, 1250), 20_000, 32)]),
    ]);
    wl.sessions[1].start_ms = 600_000.0;
    let c = cluster("1h");
    let bound = lower_bound(&wl, &c).expect("bound");
    let r = run_one("round_robin", &wl, &c, &SimOptions::default(), &|_| {}).expect("runs");
    for (a, b) in r.steps.iter().zip(&bound.steps) {
        assert_eq!(a.cached_tokens, 0);
        assert!((a.ttft_s - b.ttft_s).abs() < 1e-9, "{a:?} vs {b:?}");
        assert!((a.latency_s - b.latency_s).abs() < 1e-9, "{a:?} vs {b:?}");
    }
    assert!(bound.steps[0].ttft_s > 0.01, "{:?}", bound.steps[0]);
}

#[test]
fn a_prefix_counts_as_cached_only_if_its_step_may_have_run_first() {
    // Session a: turn 0 = blocks 1..=4, turn 1 = blocks 1..=8 (64 + 128 tokens).
    // Session b shares a's first two blocks. Session c forks off a after turn 0.
    let a = session(
        "a",
        vec![
            step(&[1, 2, 3, 4], 64, 8),
            step(&[1, 2, 3, 4, 5, 6, 7, 8], 128, 8),
        ],
    );
    let b = session("b", vec![step(&[1, 2, 9, 10], 64, 8)]);
    let mut c = session("c", vec![step(&[1, 2, 3, 4, 11, 12], 96, 8)]);
    c.fork_of = Some(ForkOf {
        session: 0,
        step: 0,
        after_gap: true,
    });
    let wl = closed(vec![a, b, c]);
    let shared = SharedPrefixes::new(&wl);
    // a's first turn: b (another session) may have run first; its own next turn and the
    // fork may not.
    assert_eq!(shared.tokens(&wl, 0, 0), 32);
    // a's second turn extends its first.
    assert_eq!(shared.tokens(&wl, 0, 1), 64);
    // b shares two blocks with a.
    assert_eq!(shared.tokens(&wl, 1, 0), 32);
    // The fork continues a's first turn.
    assert_eq!(shared.tokens(&wl, 2, 0), 64);

    let bound = lower_bound(&wl, &cluster("1h")).expect("bound");
    let fork = bound
        .steps
        .iter()
        .find(|s| s.session == 2)
        .expect("fork step");
    let parent = bound
        .steps
        .iter()
        .find(|s| s.session == 0 && s.step == 0)
        .expect("turn 0");
    // The fork is issued when a's first turn has completed.
    assert!((fork.issued_s - (parent.issued_s + parent.latency_s)).abs() < 1e-12);
    assert_eq!(fork.cached_tokens, 64);
}
