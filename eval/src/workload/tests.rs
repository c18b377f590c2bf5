//! Cross-cutting checks: block-id invariants over every reader and generator, prompt
//! tokens, stats, and reading speed.

use std::collections::HashMap;

use super::*;

/// Same id means same content at the same position: an id sits at one position only and
/// always follows the same predecessor.
pub(super) fn assert_chained(w: &Workload) {
    let mut at: HashMap<u64, (usize, Option<u64>)> = HashMap::new();
    for (si, step) in w.steps() {
        for (j, &id) in step.hash_ids.iter().enumerate() {
            let prev = j.checked_sub(1).and_then(|p| step.hash_ids.get(p)).copied();
            let first = *at.entry(id).or_insert((j, prev));
            assert_eq!(first, (j, prev), "id {id} of session {si} breaks the chain");
        }
    }
}

/// A partial last block's id names content that later grows, so it never names a full block.
pub(super) fn assert_fresh_partials(w: &Workload) {
    let mut full = std::collections::HashSet::new();
    let mut partial = Vec::new();
    for (_, step) in w.steps() {
        let n = step.hash_ids.len();
        let has_partial = !step.input_tokens.is_multiple_of(w.hash_block);
        for (j, &id) in step.hash_ids.iter().enumerate() {
            if has_partial && j + 1 == n {
                partial.push(id);
            } else {
                full.insert(id);
            }
        }
    }
    assert!(partial.iter().all(|id| !full.contains(id)));
}

fn step(input_tokens: u32, hash_ids: Vec<u64>) -> Step {
    Step::of(input_tokens, hash_ids)
}

#[test]
fn prompt_tokens_are_a_function_of_the_ids() {
    let a = step(40, vec![10, 11, 12]);
    let b = step(45, vec![10, 11, 99]);
    let ta = prompt_tokens(&a, 16);
    let tb = prompt_tokens(&b, 16);
    assert_eq!(ta.len(), 40);
    assert_eq!(tb.len(), 45);
    assert_eq!(ta, prompt_tokens(&a, 16));
    let common = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
    assert_eq!(common, 32);
    assert!(ta.iter().chain(&tb).all(|t| (1000..=60_000).contains(t)));
    // A partial block's tokens are a prefix of the same id's full block.
    let full = prompt_tokens(&step(48, vec![10, 11, 12]), 16);
    assert_eq!(full[..40], ta[..]);
    assert!(prompt_tokens(&a, 0).is_empty());
}

#[test]
fn prompt_tokens_differ_for_different_ids() {
    let a = prompt_tokens(&step(16, vec![1]), 16);
    let b = prompt_tokens(&step(16, vec![2]), 16);
    assert_ne!(a, b);
    assert!(a.iter().zip(&b).filter(|(x, y)| x == y).count() < 2);
}

#[test]
fn readers_and_generators_keep_the_block_invariants() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/");
    let gaps =
        gaps::swe_smith_gaps(format!("{dir}continuum_swesmith_derived.jsonl")).expect("gaps");
    let agent = agentic::read(format!("{dir}continuum_swesmith_derived.jsonl")).expect("swe");
    let mooncake =
        mooncake::read(format!("{dir}mooncake_synthetic_trace.jsonl")).expect("mooncake");
    let azure = azure::read_arrivals(format!("{dir}azure_llm_inference_trace_code_2023.csv"))
        .expect("azure");
    let coding = coding_agent::generate(
        &coding_agent::CodingAgentParams {
            sessions: 8,
            tool_gaps_ms: gaps,
            arrivals: Arrivals::azure(&azure, Some(2.0)),
            ..Default::default()
        },
        3,
    );
    let scaled = scale::scale_sessions(&agent, 12, &Arrivals::AllAtZero, 1024, 3);
    let workloads = [
        scale::scale_sessions(&mooncake, 100, &Arrivals::Poisson { rate_per_s: 1.0 }, 0, 1),
        scaled,
        coding,
        forked::generate(&forked::ForkedParams::default(), 3),
        long_doc::generate(&long_doc::LongDocParams::default(), 3),
        agent,
        mooncake,
    ];
    for w in &workloads {
        w.check().unwrap_or_else(|v| panic!("{}: {v}", w.name));
        assert_chained(w);
        for (_, s) in w.steps() {
            assert_eq!(
                prompt_tokens(s, w.hash_block).len(),
                s.input_tokens as usize
            );
        }
    }
}

#[test]
fn scaled_agent_copies_share_only_the_system_prompt() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/traces/");
    let agent = agentic::read(format!("{dir}continuum_swesmith_derived.jsonl")).expect("swe");
    let w = scale::scale_sessions(&agent, 10, &Arrivals::AllAtZero, 512, 0);
    // Sessions 0 and 5 are copies 0 and 1 of the same base session.
    let ids = |k: usize| -> std::collections::HashSet<u64> {
        w.sessions[k]
            .steps
            .iter()
            .flat_map(|s| s.hash_ids.iter().copied())
            .collect()
    };
    assert_eq!(ids(0).intersection(&ids(5)).count(), 512 / 16);
    let first = |k: usize| w.sessions[k].steps[0].clone();
    let (t0, t5) = (prompt_tokens(&first(0), 16), prompt_tokens(&first(5), 16));
    let common = t0.iter().zip(&t5).take_while(|(x, y)| x == y).count();
    assert_eq!(common, 512);
    // Same reuse inside each copy as in the base, plus the shared prefix across copies.
    assert!(w.stats().reuse_ratio > agent.stats().reuse_ratio);
}

#[test]
fn stats_summarise_sizes_and_reuse() {
    let w = Workload {
        name: "t".into(),
        hash_block: 16,
        looping: Loop::Closed,
        sessions: vec![Session {
            id: "s".into(),
            start_ms: 0.0,
            fork_of: None,
            steps: vec![step(32, vec![1, 2]), step(48, vec![1, 2, 3])],
        }],
    };
    let s = w.stats();
    assert_eq!(
        (s.sessions, s.requests, s.input_p50, s.input_p99),
        (1, 2, 48, 48)
    );
    assert!((s.reuse_ratio - 0.4).abs() < 1e-12);
    assert_eq!(
        s.to_string(),
        "1 sessions, 2 requests, input mean/p50/p99 40/48/48, output mean/p50/p99 1/1/1, reuse 0.400"
    );
}

#[test]
fn check_rejects_broken_workloads() {
    let good = Workload {
        name: "t".into(),
        hash_block: 16,
        looping: Loop::Closed,
        sessions: vec![Session {
            id: "s".into(),
            start_ms: 0.0,
            fork_of: None,
            steps: vec![step(32, vec![1, 2])],
        }],
    };
    good.check().expect("good");
    let mut short = good.clone();
    short.sessions[0].steps[0].input_tokens = 33;
    assert!(matches!(
        short.check(),
        Err(Violation::HashIdsLength { expected: 3, .. })
    ));
    let mut open = good.clone();
    open.looping = Loop::Open;
    assert!(matches!(open.check(), Err(Violation::Arrival { .. })));
    let mut twice = good.clone();
    twice.sessions.push(good.sessions[0].clone());
    assert!(matches!(
        twice.check(),
        Err(Violation::DuplicateSessionId { .. })
    ));
    let mut fork = good.clone();
    fork.sessions[0].fork_of = Some(ForkOf {
        session: 3,
        step: 0,
        after_gap: true,
    });
    assert!(matches!(
        fork.check(),
        Err(Violation::ForkOutOfRange { .. })
    ));
}
