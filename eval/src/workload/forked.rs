//! Generator of forked rollouts: a root call over a long shared prefix, then branches that
//! each continue the root's prompt with their own content (tree search, best-of-n agents).

use ownerserve_planner::policy::SplitMix64;

use super::coding_agent::GENERATED_BLOCK;
use super::context::Context;
use super::dist::uniform;
use super::tokens::IdAlloc;
use super::{Arrivals, ForkOf, Loop, Session, Step, Workload};

const TAG: u64 = 0x666f_726b_6564_0002;

/// Shape of a forked-rollout workload; every range is inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkedParams {
    /// Root sessions. Default 8.
    pub roots: usize,
    /// Root session starts. Default Poisson at 0.2/s: roots rarely overlap, so each fan-out
    /// is seen on its own.
    pub arrivals: Arrivals,
    /// Root prompt, the prefix every branch shares. Default 12K tokens: an agent's context
    /// at the point where it explores alternatives.
    pub root_prompt_tokens: u32,
    /// Root output. Default 200 tokens: a plan or a tool call.
    pub root_output_tokens: u32,
    /// Branches per root. Default 4, a common best-of-n.
    pub branches: u32,
    /// Calls per branch after the fork. Default 3: short explorations.
    pub turns_per_branch: u32,
    /// Per-turn new content in a branch (tool output or user turn). Default 50..400 tokens.
    pub turn_input_tokens: (u32, u32),
    /// Per-turn output in a branch. Default 30..300 tokens.
    pub turn_output_tokens: (u32, u32),
    /// Wait between a branch's calls, ms. Default 500: a typical bash tool run in SWE-smith.
    pub tool_gap_ms: f64,
    /// If true, the root step asks for `samples = branches` completions in one request and
    /// each branch continues from its own sample; if false, the root generates one output
    /// that every branch continues. Default false.
    pub as_samples: bool,
}

impl Default for ForkedParams {
    fn default() -> Self {
        Self {
            roots: 8,
            arrivals: Arrivals::Poisson { rate_per_s: 0.2 },
            root_prompt_tokens: 12 * 1024,
            root_output_tokens: 200,
            branches: 4,
            turns_per_branch: 3,
            turn_input_tokens: (50, 400),
            turn_output_tokens: (30, 300),
            tool_gap_ms: 500.0,
            as_samples: false,
        }
    }
}

/// A closed-loop forked workload (block 16): per root, a one-step root session followed by
/// `branches` child sessions whose `fork_of` is the root step and whose first step has
/// `fork: true`. Deterministic for a given seed.
pub fn generate(params: &ForkedParams, seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut ids = IdAlloc::new(seed ^ TAG);
    let starts = params.arrivals.times_ms(params.roots, seed);
    let mut sessions = Vec::new();
    for (r, &start_ms) in starts.iter().enumerate() {
        let mut root = Context::new(GENERATED_BLOCK);
        root.append(params.root_prompt_tokens, &mut ids);
        let samples = if params.as_samples {
            params.branches.max(1)
        } else {
            1
        };
        let root_index = sessions.len();
        sessions.push(Session {
            id: format!("fork-{r}"),
            start_ms,
            fork_of: None,
            steps: vec![Step {
                turn: 0,
                parent: None,
                input_tokens: root.tokens(),
                output_tokens: params.root_output_tokens,
                hash_ids: root.hash_ids(&mut ids),
                arrival_ms: None,
                gap_after_ms: 0.0,
                samples,
                fork: false,
                ending: crate::workload::Ending::Unknown,
            }],
        });
        // One shared output, or (as samples) one distinct output per branch, appended below.
        if !params.as_samples {
            root.append(params.root_output_tokens, &mut ids);
        }
        for b in 0..params.branches {
            let mut ctx = root.clone();
            if params.as_samples {
                ctx.append(params.root_output_tokens, &mut ids);
            }
            sessions.push(Session {
                id: format!("fork-{r}.{b}"),
                start_ms,
                fork_of: Some(ForkOf {
                    session: root_index,
                    step: 0,
                    after_gap: true,
                }),
                steps: branch_steps(params, ctx, &mut rng, &mut ids),
            });
        }
    }
    Workload {
        name: if params.as_samples {
            "forked_samples".into()
        } else {
            "forked".into()
        },
        hash_block: GENERATED_BLOCK,
        looping: Loop::Closed,
        sessions,
    }
}

fn branch_steps(
    p: &ForkedParams,
    mut ctx: Context,
    rng: &mut SplitMix64,
    ids: &mut IdAlloc,
) -> Vec<Step> {
    let mut steps = Vec::new();
    for turn in 0..p.turns_per_branch {
        let (lo, hi) = p.turn_input_tokens;
        ctx.append(uniform(rng, lo, hi), ids);
        let (lo, hi) = p.turn_output_tokens;
        let output_tokens = uniform(rng, lo, hi);
        steps.push(Step {
            turn,
            parent: turn.checked_sub(1),
            input_tokens: ctx.tokens(),
            output_tokens,
            hash_ids: ctx.hash_ids(ids),
            arrival_ms: None,
            gap_after_ms: if turn + 1 < p.turns_per_branch {
                p.tool_gap_ms
            } else {
                0.0
            },
            samples: 1,
            fork: turn == 0,
            ending: crate::workload::Ending::Unknown,
        });
        ctx.append(output_tokens, ids);
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_chained, assert_fresh_partials};
    use super::*;

    fn common(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn branches_continue_the_root_and_then_diverge() {
        for as_samples in [false, true] {
            let p = ForkedParams {
                roots: 2,
                as_samples,
                ..ForkedParams::default()
            };
            let w = generate(&p, 9);
            w.check().expect("contract holds");
            assert_chained(&w);
            assert_fresh_partials(&w);
            assert_eq!(w.sessions.len(), 2 * 5);
            let root = &w.sessions[0].steps[0];
            assert_eq!(root.samples, if as_samples { 4 } else { 1 });
            let (b0, b1) = (&w.sessions[1], &w.sessions[2]);
            assert_eq!(
                b0.fork_of,
                Some(ForkOf {
                    session: 0,
                    step: 0,
                    after_gap: true,
                })
            );
            assert!(b0.steps[0].fork && !b0.steps[1].fork);
            assert_eq!(b0.steps.len(), 3);
            let (x, y) = (&b0.steps[0].hash_ids, &b1.steps[0].hash_ids);
            // Root prompt 12,288 tokens = 768 full blocks; with a shared root output, the
            // output's 200 tokens add 12 more full blocks (12,488 / 16 = 780.5).
            let shared = if as_samples { 768 } else { 780 };
            assert_eq!(common(x, &root.hash_ids), 768);
            assert_eq!(common(x, y), shared);
            // The other root shares nothing with this one.
            assert_eq!(common(&w.sessions[5].steps[0].hash_ids, &root.hash_ids), 0);
        }
    }

    #[test]
    fn seeded() {
        let p = ForkedParams::default();
        assert_eq!(generate(&p, 1), generate(&p, 1));
        assert_ne!(generate(&p, 1), generate(&p, 2));
    }
}
