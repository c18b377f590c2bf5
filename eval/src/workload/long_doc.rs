//! Generator of long-document question answering: a user loads a long document, then asks a
//! handful of questions with human think time in between.
//!
//! The prefix is large and reused across turns, but the gaps are long, so it tests how long
//! an owner keeps a session's cache warm.

use ownerserve_planner::policy::SplitMix64;

use super::coding_agent::GENERATED_BLOCK;
use super::context::Context;
use super::dist::{exponential, uniform};
use super::tokens::IdAlloc;
use super::{Arrivals, Loop, Session, Step, Workload};

const TAG: u64 = 0x6c6f_6e67_646f_0003;

/// Shape of a long-document QA workload; every range is inclusive.
#[derive(Debug, Clone, PartialEq)]
pub struct LongDocParams {
    /// Sessions, one document each. Default 16.
    pub sessions: usize,
    /// Session starts. Default Poisson at 0.1/s: users arrive slowly, and each one stays for
    /// minutes.
    pub arrivals: Arrivals,
    /// Document length. Default 20K..60K tokens: a paper, a contract, or a code file set.
    pub document_tokens: (u32, u32),
    /// Questions per document. Default 4..10.
    pub questions: (u32, u32),
    /// Question length, appended to the conversation. Default 20..80 tokens.
    pub question_tokens: (u32, u32),
    /// Answer length. Default 50..300 tokens.
    pub answer_tokens: (u32, u32),
    /// Mean of the exponential think time between an answer and the next question. Default
    /// 8,000 ms: reading an answer and typing a short question.
    pub think_time_mean_ms: f64,
}

impl Default for LongDocParams {
    fn default() -> Self {
        Self {
            sessions: 16,
            arrivals: Arrivals::Poisson { rate_per_s: 0.1 },
            document_tokens: (20 * 1024, 60 * 1024),
            questions: (4, 10),
            question_tokens: (20, 80),
            answer_tokens: (50, 300),
            think_time_mean_ms: 8000.0,
        }
    }
}

/// A closed-loop long-document QA workload (block 16), deterministic for a given seed.
pub fn generate(params: &LongDocParams, seed: u64) -> Workload {
    let mut rng = SplitMix64::new(seed);
    let mut ids = IdAlloc::new(seed ^ TAG);
    let starts = params.arrivals.times_ms(params.sessions, seed);
    let sessions = starts
        .iter()
        .enumerate()
        .map(|(i, &start_ms)| Session {
            id: format!("doc-{i}"),
            start_ms,
            fork_of: None,
            steps: session_steps(params, &mut rng, &mut ids),
        })
        .collect();
    Workload {
        name: "long_doc".into(),
        hash_block: GENERATED_BLOCK,
        looping: Loop::Closed,
        sessions,
    }
}

fn session_steps(p: &LongDocParams, rng: &mut SplitMix64, ids: &mut IdAlloc) -> Vec<Step> {
    let mut ctx = Context::new(GENERATED_BLOCK);
    let (lo, hi) = p.document_tokens;
    ctx.append(uniform(rng, lo, hi), ids);
    let questions = uniform(rng, p.questions.0, p.questions.1).max(1);
    let mut steps = Vec::new();
    for turn in 0..questions {
        let (lo, hi) = p.question_tokens;
        ctx.append(uniform(rng, lo, hi), ids);
        let (lo, hi) = p.answer_tokens;
        let output_tokens = uniform(rng, lo, hi);
        let think = exponential(rng, p.think_time_mean_ms);
        steps.push(Step {
            turn,
            parent: turn.checked_sub(1),
            input_tokens: ctx.tokens(),
            output_tokens,
            hash_ids: ctx.hash_ids(ids),
            arrival_ms: None,
            gap_after_ms: if turn + 1 < questions { think } else { 0.0 },
            samples: 1,
            fork: false,
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

    #[test]
    fn documents_are_long_and_turns_grow_by_one_exchange() {
        let p = LongDocParams {
            sessions: 64,
            ..LongDocParams::default()
        };
        let w = generate(&p, 4);
        w.check().expect("contract holds");
        assert_chained(&w);
        assert_fresh_partials(&w);
        let mut gaps = Vec::new();
        for s in &w.sessions {
            assert!((4..=10).contains(&s.steps.len()));
            let first = s.steps.first().expect("steps");
            assert!((20 * 1024 + 20..=60 * 1024 + 80).contains(&first.input_tokens));
            for pair in s.steps.windows(2) {
                let q = pair[1].input_tokens - pair[0].input_tokens - pair[0].output_tokens;
                assert!((20..=80).contains(&q), "{q}");
                gaps.push(pair[0].gap_after_ms);
            }
            assert_eq!(s.steps.last().map(|st| st.gap_after_ms), Some(0.0));
        }
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((6000.0..10_000.0).contains(&mean), "{mean}");
        // Sessions are distinct documents.
        assert_ne!(
            w.sessions[0].steps[0].hash_ids[0],
            w.sessions[1].steps[0].hash_ids[0]
        );
    }

    #[test]
    fn seeded() {
        let p = LongDocParams::default();
        assert_eq!(generate(&p, 11), generate(&p, 11));
        assert_ne!(generate(&p, 11), generate(&p, 12));
    }
}
