//! What a step's decode costs where it decodes: the decode phase the placement commits to.
//!
//! Every other term prices the step up to its first token; a session's time is mostly its
//! decodes (SWE-smith on 8h: ~2 s of TTFT against ~150 s of decode per session). A decode
//! step is memory-bound: it reads the weights once and every running sequence's KV
//! (`roofline.rs`), so a sequence decodes slower where more context runs beside it, and
//! while it decodes it slows each of the others by the time its own KV takes to read:
//!
//! `D = S × (t(n + 1, C + L) + n × (t(n + 1, C + L) − t(n, C)))`
//!
//! with `n` sequences holding `C` KV tokens running on the decoder, a prompt of `L` tokens,
//! `t` the decode step time and `S` the decode steps a sequence is expected to run: each
//! decoder's observed decode lifetime over its decode step time now, averaged over the
//! decoders that have one. Until a lifetime is observed the term is 0 and changes no
//! choice. A step sampling `n > 1` choices is priced as one sequence, an approximation:
//! each of its sequences reads the context.
//!
//! What this prices is placing a new session on the decoder with the least running
//! context; a count of sequences (`least_loaded`) ignores that a sequence's cost is its
//! context.

use crate::roofline::StepFigures;

use super::PlanWorker;

/// Seconds of one decode step on `w` with `extra_seqs` more sequences holding
/// `extra_tokens` more KV than run there now; 0 for a worker that does not decode.
#[inline]
pub fn decode_step_s(
    w: &PlanWorker,
    f: &StepFigures<'_>,
    extra_seqs: u64,
    extra_tokens: u64,
) -> f64 {
    let seqs = w.stalled_decodes() + extra_seqs;
    w.roofline
        .decode_step_s(f, seqs, w.running_kv_tokens() + extra_tokens)
}

/// Decode steps one sequence is expected to run: over the decoders with an observed
/// decode lifetime, the mean of lifetime over their decode step time now. `None` before
/// any lifetime is observed.
pub fn expected_decode_steps(workers: &[PlanWorker], f: &StepFigures<'_>) -> Option<f64> {
    let (sum, n) = workers
        .iter()
        .filter_map(|w| {
            let lifetime = w.decode_lifetime_s?;
            let step = decode_step_s(w, f, 1, 0);
            (step > 0.0).then(|| lifetime / step)
        })
        .fold((0.0, 0u32), |(s, n), steps| (s + steps, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

/// Decode-seconds of a sequence of `prompt_tokens` decoding `steps` steps on `w`: its own
/// decode time plus what it adds to the steps of every sequence running there.
pub fn marginal_decode_s(
    w: &PlanWorker,
    f: &StepFigures<'_>,
    prompt_tokens: u64,
    steps: f64,
) -> f64 {
    let before = decode_step_s(w, f, 0, 0);
    let after = decode_step_s(w, f, 1, prompt_tokens);
    let others = w.stalled_decodes() as f64;
    steps * (after + others * (after - before).max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Role;
    use crate::spec::ModelSpec;

    fn worker(decoding: u64, running_tokens: u64, lifetime: Option<f64>) -> PlanWorker {
        let mut w = super::super::tests::worker(0, Role::Hybrid);
        w.decoding = decoding;
        w.kv_free_tokens = Some(400_000 - running_tokens);
        w.kv_capacity_tokens = Some(400_000);
        w.decode_lifetime_s = lifetime;
        w
    }

    #[test]
    fn a_decoder_with_more_running_context_costs_more() {
        let model = ModelSpec::preset("llama-3.1-8b").unwrap();
        let m = StepFigures::of(&model);
        let light = marginal_decode_s(&worker(10, 50_000, None), &m, 10_000, 200.0);
        let heavy = marginal_decode_s(&worker(10, 250_000, None), &m, 10_000, 200.0);
        let crowded = marginal_decode_s(&worker(30, 50_000, None), &m, 10_000, 200.0);
        assert!(
            heavy > light && crowded > light,
            "{light} {heavy} {crowded}"
        );
    }

    #[test]
    fn the_sequence_slows_each_running_one_by_its_own_kv_read() {
        let model = ModelSpec::preset("llama-3.1-8b").unwrap();
        let m = StepFigures::of(&model);
        let w = worker(20, 100_000, None);
        let own = decode_step_s(&w, &m, 1, 10_000);
        let added = own - decode_step_s(&w, &m, 0, 0);
        let kv_read = model.kv_bytes_per_token() * 10_001.0 / w.roofline.bytes_per_s();
        assert!((added - kv_read).abs() < 1e-9, "{added} {kv_read}");
        let d = marginal_decode_s(&w, &m, 10_000, 1.0);
        assert!((d - (own + 20.0 * added)).abs() < 1e-12);
    }

    #[test]
    fn steps_come_from_observed_lifetimes_and_are_unknown_before() {
        let model = ModelSpec::preset("llama-3.1-8b").unwrap();
        let m = StepFigures::of(&model);
        assert_eq!(expected_decode_steps(&[worker(5, 10_000, None)], &m), None);
        let w = worker(5, 10_000, Some(2.0));
        let step = decode_step_s(&w, &m, 1, 0);
        let steps = expected_decode_steps(&[w, worker(3, 0, None)], &m).unwrap();
        assert!((steps - 2.0 / step).abs() < 1e-9);
    }
}
