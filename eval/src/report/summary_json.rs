//! A run's headline figures as JSON (`simulate --summary-json`, `replay --summary-json`),
//! for scripts that compare runs: the calibration against real engines reads them.

use serde_json::{json, Value};

use crate::sim::{mean, percentile, RunResult};

/// Prompt tokens, cached tokens, preemptions and TTFT of `r`'s completed steps.
pub fn summary_json(r: &RunResult) -> Value {
    let done = r.steps.iter().filter(|s| !s.rejected);
    let (mut prompt, mut cached, mut steps) = (0u64, 0u64, 0u64);
    for s in done {
        prompt += u64::from(s.prompt_tokens);
        cached += u64::from(s.cached_tokens);
        steps += 1;
    }
    let ttft = r.ttfts();
    json!({
        "policy": r.policy,
        "steps": steps,
        "rejected": r.steps.len() as u64 - steps,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_tokens": prompt - cached.min(prompt),
        "preemptions": r.preemptions,
        "ttft_p50_s": percentile(&ttft, 0.5),
        "ttft_p99_s": percentile(&ttft, 0.99),
        "session_e2e_mean_s": mean(&r.session_e2e_s),
    })
}
