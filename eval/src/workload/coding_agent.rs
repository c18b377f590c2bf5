//! Generator of coding-agent sessions: a long repository prefix, then many small tool turns.
//!
//! Each turn's prompt is the previous prompt, plus the previous output, plus a tool result,
//! so a session is one growing prefix chain. That is the case session ownership is built for.
//! With [`SharedRepo`] (the `repo-swarm` workload), sessions come in groups that share one
//! repository's context after the system prompt: many agents on one repository.

use ownerserve_planner::policy::SplitMix64;

use super::context::Context;
use super::dist::{chance, pick, uniform};
use super::tokens::IdAlloc;
use super::{Arrivals, Loop, Session, Step, Workload};

/// Block size of generated workloads: the engines' paged-cache block.
pub const GENERATED_BLOCK: u32 = 16;

const TAG: u64 = 0x636f_6469_6e67_0001;

/// Shape of a coding-agent workload; every range is inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct CodingAgentParams {
    /// Number of sessions. Default 32: enough to load a few engines.
    pub sessions: usize,
    /// Session starts. Default Poisson at 0.5/s, so sessions overlap without all starting
    /// at once.
    pub arrivals: Arrivals,
    /// Agent system prompt and tool schema, shared by all sessions. Default 2,048 tokens,
    /// typical of SWE-agent-style scaffolds.
    pub system_prompt_tokens: u32,
    /// Per-session repository context and task. Default 8K..32K tokens: a repo map plus
    /// a few opened files.
    pub repo_context_tokens: (u32, u32),
    /// LLM calls per session. Default 20..40, as in the SWE-smith trace (24..32).
    pub turns: (u32, u32),
    /// Usual tool output (a command's output, a file snippet). Default 50..600 tokens.
    pub tool_output_tokens: (u32, u32),
    /// Long tool output (a whole file, a test log). Default 2K..8K tokens.
    pub long_tool_output_tokens: (u32, u32),
    /// Probability that a tool output is long. Default 0.1: the heavy tail.
    pub long_tool_output_prob: f64,
    /// Usual output (a tool call with a short thought). Default 30..400 tokens.
    pub output_tokens: (u32, u32),
    /// Long output (writing a file or a patch). Default 1K..4K tokens.
    pub long_output_tokens: (u32, u32),
    /// Probability that an output is long. Default 0.05: the SWE-smith trace's p99 output
    /// is about 3.6K tokens against a median of 79.
    pub long_output_prob: f64,
    /// Empirical tool gaps (ms), sampled uniformly. Default: the SWE-smith trace's bimodal
    /// shape (editor calls under 1 ms, bash runs about 450..600 ms). Load the real ones with
    /// [`super::gaps::swe_smith_gaps`]. Empty means no gap.
    pub tool_gaps_ms: Vec<f64>,
    /// A session ends early once its prompt would exceed this. Default 131,072 tokens: a
    /// 128K-context model.
    pub max_context_tokens: u32,
    /// Groups of sessions sharing one repository's context (then each its own
    /// `repo_context_tokens`); `None`: every session's repository is its own.
    pub shared_repo: Option<SharedRepo>,
}

/// Sessions in groups on one repository each; ranges inclusive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SharedRepo {
    /// Sessions per group (consecutive sessions; the last group may be smaller).
    pub group_sessions: (u32, u32),
    /// The repository context the group's sessions share, after the system prompt.
    pub repo_tokens: (u32, u32),
}

impl Default for CodingAgentParams {
    fn default() -> Self {
        Self {
            sessions: 32,
            arrivals: Arrivals::Poisson { rate_per_s: 0.5 },
            system_prompt_tokens: 2048,
            repo_context_tokens: (8 * 1024, 32 * 1024),
            turns: (20, 40),
            tool_output_tokens: (50, 600),
            long_tool_output_tokens: (2 * 1024, 8 * 1024),
            long_tool_output_prob: 0.1,
            output_tokens: (30, 400),
            long_output_tokens: (1024, 4 * 1024),
            long_output_prob: 0.05,
            tool_gaps_ms: vec![0.4, 0.5, 0.6, 0.8, 450.0, 470.0, 490.0, 510.0, 550.0, 600.0],
            max_context_tokens: 128 * 1024,
            shared_repo: None,
        }
    }
}

/// A closed-loop coding-agent workload (block 16), deterministic for a given seed.
pub fn generate(params: &CodingAgentParams, seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut ids = IdAlloc::new(seed ^ TAG);
    let starts = params.arrivals.times_ms(params.sessions, seed);
    let mut system = Context::new(GENERATED_BLOCK);
    system.append(params.system_prompt_tokens, &mut ids);
    // The current group's shared context and how many sessions it still takes.
    let mut group = (system.clone(), 0u32);
    let sessions = starts
        .iter()
        .enumerate()
        .map(|(i, &start_ms)| {
            let base = match params.shared_repo {
                Some(repo) => {
                    if group.1 == 0 {
                        let mut ctx = system.clone();
                        ctx.append(
                            uniform(&mut rng, repo.repo_tokens.0, repo.repo_tokens.1),
                            &mut ids,
                        );
                        let size = uniform(&mut rng, repo.group_sessions.0, repo.group_sessions.1);
                        group = (ctx, size.max(1));
                    }
                    group.1 -= 1;
                    group.0.clone()
                }
                None => system.clone(),
            };
            Session {
                id: format!("coding-{i}"),
                start_ms,
                fork_of: None,
                steps: session_steps(params, base, &mut rng, &mut ids),
            }
        })
        .collect();
    Workload {
        name: "coding_agent".into(),
        hash_block: GENERATED_BLOCK,
        looping: Loop::Closed,
        sessions,
    }
}

fn session_steps(
    p: &CodingAgentParams,
    mut ctx: Context,
    rng: &mut SplitMix64,
    ids: &mut IdAlloc,
) -> Vec<Step> {
    let (lo, hi) = p.repo_context_tokens;
    ctx.append(uniform(rng, lo, hi), ids);
    let turns = uniform(rng, p.turns.0, p.turns.1).max(1);
    let mut steps: Vec<Step> = Vec::new();
    for turn in 0..turns {
        if turn > 0 {
            let (lo, hi) = if chance(rng, p.long_tool_output_prob) {
                p.long_tool_output_tokens
            } else {
                p.tool_output_tokens
            };
            let tool = uniform(rng, lo, hi);
            if ctx.tokens().saturating_add(tool) > p.max_context_tokens {
                break;
            }
            ctx.append(tool, ids);
        }
        let (lo, hi) = if chance(rng, p.long_output_prob) {
            p.long_output_tokens
        } else {
            p.output_tokens
        };
        let output_tokens = uniform(rng, lo, hi);
        steps.push(Step {
            turn,
            parent: turn.checked_sub(1),
            input_tokens: ctx.tokens(),
            output_tokens,
            hash_ids: ctx.hash_ids(ids),
            arrival_ms: None,
            gap_after_ms: pick(rng, &p.tool_gaps_ms),
            samples: 1,
            fork: false,
            ending: crate::workload::Ending::Unknown,
        });
        ctx.append(output_tokens, ids);
    }
    if let Some(last) = steps.last_mut() {
        last.gap_after_ms = 0.0;
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_chained, assert_fresh_partials};
    use super::*;

    #[test]
    fn sessions_share_the_system_prompt_and_nothing_else() {
        let p = CodingAgentParams {
            sessions: 8,
            ..CodingAgentParams::default()
        };
        let w = generate(&p, 1);
        w.check().expect("contract holds");
        assert_chained(&w);
        assert_fresh_partials(&w);
        let firsts: Vec<&Step> = w.sessions.iter().filter_map(|s| s.steps.first()).collect();
        let (a, b) = (firsts[0], firsts[1]);
        let common = a
            .hash_ids
            .iter()
            .zip(&b.hash_ids)
            .take_while(|(x, y)| x == y)
            .count();
        assert_eq!(common, 2048 / 16);
        for s in &w.sessions {
            assert!((20..=40).contains(&s.steps.len()), "{}", s.steps.len());
            let first = s.steps.first().expect("steps");
            assert!((2048 + 8192..=2048 + 32768).contains(&first.input_tokens));
            // Each turn extends the previous prompt with its output and a tool result.
            for pair in s.steps.windows(2) {
                let grown = pair[1].input_tokens - pair[0].input_tokens - pair[0].output_tokens;
                assert!((50..=8192).contains(&grown), "{grown}");
            }
        }
    }

    #[test]
    fn seeded() {
        let p = CodingAgentParams {
            sessions: 4,
            ..CodingAgentParams::default()
        };
        assert_eq!(generate(&p, 5), generate(&p, 5));
        assert_ne!(generate(&p, 5), generate(&p, 6));
    }

    #[test]
    fn a_repo_swarm_shares_each_groups_repository_and_nothing_across_groups() {
        let p = CodingAgentParams {
            sessions: 12,
            repo_context_tokens: (1024, 2048),
            shared_repo: Some(SharedRepo {
                group_sessions: (4, 4),
                repo_tokens: (20 * 1024, 20 * 1024),
            }),
            ..CodingAgentParams::default()
        };
        let w = generate(&p, 3);
        w.check().expect("contract holds");
        assert_chained(&w);
        assert_fresh_partials(&w);
        let first = |i: usize| &w.sessions[i].steps[0].hash_ids;
        let common = |a: usize, b: usize| {
            first(a)
                .iter()
                .zip(first(b))
                .take_while(|(x, y)| x == y)
                .count()
        };
        let shared = (2048 + 20 * 1024) / 16;
        // Sessions 0-3, 4-7 and 8-11 each share the system prompt and their repository.
        assert_eq!(
            (common(0, 3), common(4, 7), common(8, 11)),
            (shared, shared, shared)
        );
        // Across groups only the system prompt.
        assert_eq!((common(3, 4), common(0, 8)), (2048 / 16, 2048 / 16));
    }
}
