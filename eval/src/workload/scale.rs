//! Multiplies a base workload into many independent closed-loop sessions.
//!
//! Output session `k` is a copy of base session `k % n` in copy `k / n`, where `n` is the
//! base's session count: copy `c` is the `c`-th replica of the whole base workload. Within
//! one copy the base's sessions keep whatever content they shared; across copies nothing is
//! shared except the *shared prefix*. That prefix is the ids covering the first
//! `shared_prefix_tokens` tokens of any base session's first step: a common agent system
//! prompt and tool schema, which every replica of the agent sends.

use std::collections::{HashMap, HashSet};

use super::tokens::IdAlloc;
use super::{Arrivals, ForkOf, Loop, Session, Step, Workload};

/// Salt tag for the id allocator, so scaled ids differ from generated ones for one seed.
const SCALE_TAG: u64 = 0x7363_616c_6500_0000;

/// `count` closed-loop sessions cycling through `base`'s sessions, each copy with its own
/// content except the shared prefix, session ids `<base id>#<k>` and start times from
/// `arrivals`.
///
/// Every id is remapped, the shared ones included, so that the output's ids come from one
/// allocator and cannot collide. The remapped id depends only on the original id and, for
/// ids outside the shared prefix, the copy, so prefix chains survive. An open-loop base
/// becomes closed loop: each step's `gap_after_ms` is the gap to the session's next arrival,
/// which over-states think time by the original response time (the trace has nothing
/// better). A fork whose parent's copy falls beyond `count` loses its `fork_of` and starts
/// at its arrival time.
pub fn scale_sessions(
    base: &Workload,
    count: usize,
    arrivals: &Arrivals,
    shared_prefix_tokens: u32,
    seed: u64,
) -> Workload {
    let shared = shared_ids(base, shared_prefix_tokens);
    let starts = arrivals.times_ms(count, seed);
    let mut alloc = IdAlloc::new(seed ^ SCALE_TAG);
    let mut remap: HashMap<(u64, Option<usize>), u64> = HashMap::new();
    let n = base.sessions.len();
    let mut sessions = Vec::with_capacity(count);
    for k in 0..count {
        let (Some(src), copy) = (base.sessions.get(k % n.max(1)), k / n.max(1)) else {
            break;
        };
        let fork_of = src.fork_of.and_then(|f| {
            let session = copy * n + f.session;
            (session < count).then_some(ForkOf {
                session,
                step: f.step,
                after_gap: true,
            })
        });
        let steps = src
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| {
                let hash_ids = st
                    .hash_ids
                    .iter()
                    .map(|&id| {
                        let key = (id, (!shared.contains(&id)).then_some(copy));
                        *remap.entry(key).or_insert_with(|| alloc.fresh())
                    })
                    .collect();
                let gap_after_ms = match (base.looping, st.arrival_ms) {
                    (Loop::Open, Some(t)) => src
                        .steps
                        .get(i + 1)
                        .and_then(|next| next.arrival_ms)
                        .map_or(0.0, |next| (next - t).max(0.0)),
                    _ => st.gap_after_ms,
                };
                Step {
                    hash_ids,
                    arrival_ms: None,
                    gap_after_ms,
                    ..st.clone()
                }
            })
            .collect();
        sessions.push(Session {
            id: format!("{}#{k}", src.id),
            start_ms: starts.get(k).copied().unwrap_or(0.0),
            fork_of,
            steps,
        });
    }
    Workload {
        name: format!("{}x{count}", base.name),
        hash_block: base.hash_block,
        looping: Loop::Closed,
        sessions,
    }
}

/// The ids covering the first `tokens` tokens of each base session's first step: its full
/// blocks within the prefix, or all its ids if the whole prompt is within it.
fn shared_ids(base: &Workload, tokens: u32) -> HashSet<u64> {
    let mut shared = HashSet::new();
    if base.hash_block == 0 || tokens == 0 {
        return shared;
    }
    for first in base.sessions.iter().filter_map(|s| s.steps.first()) {
        let blocks = if tokens >= first.input_tokens {
            first.hash_ids.len()
        } else {
            (tokens / base.hash_block) as usize
        };
        shared.extend(first.hash_ids.iter().take(blocks).copied());
    }
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(input: u32, ids: &[u64]) -> Step {
        Step {
            gap_after_ms: 5.0,
            ..Step::of(input, ids.to_vec())
        }
    }

    fn base() -> Workload {
        // Two sessions sharing a 2-block system prompt (ids 1, 2); the second forks off the
        // first's step 0 and shares its whole prompt.
        let a = Session {
            id: "a".into(),
            start_ms: 0.0,
            fork_of: None,
            steps: vec![step(40, &[1, 2, 3]), step(70, &[1, 2, 4, 5, 6])],
        };
        let b = Session {
            id: "b".into(),
            start_ms: 0.0,
            fork_of: Some(ForkOf {
                session: 0,
                step: 0,
                after_gap: true,
            }),
            steps: vec![step(60, &[1, 2, 7, 8])],
        };
        Workload {
            name: "base".into(),
            hash_block: 16,
            looping: Loop::Closed,
            sessions: vec![a, b],
        }
    }

    #[test]
    fn copies_share_only_the_prefix_and_keep_their_own_chains() {
        let w = scale_sessions(&base(), 5, &Arrivals::Poisson { rate_per_s: 1.0 }, 32, 3);
        w.check().expect("contract holds");
        let ids: Vec<&str> = w.sessions.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, vec!["a#0", "b#1", "a#2", "b#3", "a#4"]);
        let first = |k: usize| w.sessions[k].steps[0].hash_ids.clone();
        let (a0, a2, b1) = (first(0), first(2), first(1));
        // The 32-token prefix (two blocks) is shared across copies, the rest is not.
        assert_eq!(a0[..2], a2[..2]);
        assert_ne!(a0[2], a2[2]);
        // Within a copy, the fork still shares its parent's blocks; across copies, not.
        assert_eq!(b1[..2], a0[..2]);
        let all_a0: HashSet<u64> = w.sessions[0]
            .steps
            .iter()
            .flat_map(|s| s.hash_ids.clone())
            .collect();
        let all_a2: HashSet<u64> = w.sessions[2]
            .steps
            .iter()
            .flat_map(|s| s.hash_ids.clone())
            .collect();
        assert_eq!(all_a0.intersection(&all_a2).count(), 2);
        // A session's later step keeps the chain of its first.
        assert_eq!(w.sessions[0].steps[1].hash_ids[..2], a0[..2]);
        // Forks point at the parent in their own copy; the last copy's parent is a#2.
        let forks: Vec<Option<ForkOf>> = w.sessions.iter().map(|s| s.fork_of).collect();
        let f = |session| {
            Some(ForkOf {
                session,
                step: 0,
                after_gap: true,
            })
        };
        assert_eq!(forks, vec![None, f(0), None, f(2), None]);
        assert!(w
            .sessions
            .windows(2)
            .all(|p| p[0].start_ms <= p[1].start_ms));
    }

    #[test]
    fn without_a_shared_prefix_copies_share_nothing() {
        let w = scale_sessions(&base(), 4, &Arrivals::AllAtZero, 0, 3);
        let copy = |c: usize| -> HashSet<u64> {
            w.sessions[2 * c..2 * c + 2]
                .iter()
                .flat_map(|s| s.steps.iter().flat_map(|st| st.hash_ids.clone()))
                .collect()
        };
        assert_eq!(copy(0).intersection(&copy(1)).count(), 0);
        assert_eq!(copy(0).len(), 8);
    }

    #[test]
    fn open_loop_base_becomes_closed_with_arrival_gaps() {
        let mut open = base();
        open.looping = Loop::Open;
        open.sessions.truncate(1);
        for (s, t) in open.sessions[0].steps.iter_mut().zip([100.0, 350.0]) {
            s.arrival_ms = Some(t);
        }
        let w = scale_sessions(&open, 2, &Arrivals::AllAtZero, 0, 1);
        w.check().expect("contract holds");
        let gaps: Vec<f64> = w.sessions[1].steps.iter().map(|s| s.gap_after_ms).collect();
        assert_eq!(gaps, vec![250.0, 0.0]);
    }
}
