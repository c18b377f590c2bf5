//! The pooled relaxation: a fleet of identical workers fused into one engine that has all
//! of their memory in one KV pool, one prefix cache and one queue, and all of their
//! compute and bandwidth in every step.
//!
//! What it answers: whether a row's target is out of reach because of what the fleet
//! *has* (HBM for the running sequences, FLOP/s, bandwidth) or because of how a router
//! *splits* it across workers. A router can only split work across the workers; the pooled
//! engine never has to:
//! - **KV**: one pool of the fleet's total blocks. No prefix is held twice, no worker's
//!   pool fills while another's has room, no KV is moved.
//! - **Steps**: N× the FLOP/s and bandwidth, N× the token budget and sequence limit, so a
//!   step does what N workers' steps do side by side, in the time one of them takes at an
//!   even split. A step reads the weights N times (N replicas, one per GPU of the fleet);
//!   without that it would decode faster than any fleet only because it reads them once.
//! - **Balance**: every decode shares its step with every other, so load is always even.
//!
//! It is not a proof that no router does better. Its queue is one FCFS queue, so a
//! prefill can wait behind another that a fleet would have sent elsewhere; its prefills
//! run N× faster than any fleet's, so its TTFT is a relaxation, but a fleet may place
//! prefills beside fewer decodes than the average its even split gives. For an MoE model
//! its weight reads are the fleet's only at large batches: N replicas are modelled as
//! N×E experts with the same active count, which touches fewer bytes than N workers at
//! small batches (`a_pooled_moe_reads_no_more_weights_than_the_fleet`).

use ownerserve_planner::roofline::{Efficiency, Roofline};
use ownerserve_shim::sim::config::{SimConfig, SimSettings};

/// One worker's engine `c` (built from `settings`) fused with `n - 1` copies of itself.
pub fn fuse(c: SimConfig, settings: &SimSettings, n: u32) -> SimConfig {
    let mut model = c.model.clone();
    model.params_total *= f64::from(n);
    if let Some(moe) = &mut model.moe {
        moe.experts *= n;
    }
    let roofline = Roofline::new(
        &c.gpu,
        c.gpus * n,
        Efficiency {
            compute: settings.compute_efficiency,
            memory: settings.memory_efficiency,
            step_overhead_s: settings.step_overhead_s,
        },
    );
    let mut scheduler = c.scheduler.clone();
    scheduler.num_blocks = scheduler.num_blocks.saturating_mul(n);
    scheduler.host_blocks = scheduler.host_blocks.saturating_mul(n);
    scheduler.max_num_seqs = scheduler.max_num_seqs.saturating_mul(n);
    scheduler.max_num_batched_tokens = scheduler.max_num_batched_tokens.saturating_mul(n);
    // A request's share of a step scales with the step: N capped chunks on N workers take
    // one capped chunk's time, as one N-times chunk does here.
    scheduler.long_prefill_token_threshold =
        scheduler.long_prefill_token_threshold.saturating_mul(n);
    SimConfig {
        model,
        roofline,
        scheduler,
        ..c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_planner::roofline::StepFigures;

    fn one(model: &str) -> (SimConfig, SimSettings) {
        let s = SimSettings {
            model: model.to_owned(),
            ..SimSettings::default()
        };
        (s.build().expect("builds"), s)
    }

    /// Eight workers each decoding `b` sequences over `ctx` KV tokens take one step time;
    /// the pooled engine decoding all of them takes the same (dense: the weights read
    /// eight times at eight times the bandwidth), and holds eight pools.
    #[test]
    fn a_pooled_decode_step_is_the_fleets_at_an_even_split() {
        let (c, s) = one("llama-3.1-8b");
        let p = fuse(c.clone(), &s, 8);
        assert_eq!(p.scheduler.num_blocks, 8 * c.scheduler.num_blocks);
        assert_eq!(
            p.scheduler.max_num_batched_tokens,
            8 * c.scheduler.max_num_batched_tokens
        );
        assert_eq!(p.scheduler.max_num_seqs, 8 * c.scheduler.max_num_seqs);
        let capped = SimSettings {
            long_prefill_token_threshold: 512,
            ..s.clone()
        };
        let pc = fuse(capped.build().expect("builds"), &capped, 8);
        assert_eq!(pc.scheduler.long_prefill_token_threshold, 8 * 512);
        let (fc, fp) = (StepFigures::of(&c.model), StepFigures::of(&p.model));
        for (b, ctx) in [(1, 1_000), (25, 300_000), (200, 400_000)] {
            let fleet = c.roofline.decode_step_s(&fc, b, ctx);
            let pooled = p.roofline.decode_step_s(&fp, 8 * b, 8 * ctx);
            assert!(
                (pooled - fleet).abs() < 1e-9 * fleet.max(1.0),
                "{b}: {pooled} {fleet}"
            );
        }
        // A prefill's compute is the fleet's: eight chunks at once take one chunk's time.
        let fleet = c.roofline.prefill_step_s(&fc, 8_192, 8_192 * 4_096, 0);
        let pooled = p
            .roofline
            .prefill_step_s(&fp, 8 * 8_192, 8 * 8_192 * 4_096, 0);
        assert!((pooled - fleet).abs() < 1e-3 * fleet, "{pooled} {fleet}");
    }

    #[test]
    fn a_pooled_moe_reads_no_more_weights_than_the_fleet() {
        let (c, s) = one("qwen3-30b-a3b");
        let p = fuse(c.clone(), &s, 8);
        for b in [1u64, 2, 8, 32, 256, 4_096] {
            let fleet = 8.0 * c.model.weight_bytes_touched(b);
            let pooled = p.model.weight_bytes_touched(8 * b);
            assert!(pooled <= fleet * (1.0 + 1e-12), "{b}: {pooled} {fleet}");
        }
        let all = p.model.weight_bytes_touched(1 << 20);
        assert!((all - 8.0 * c.model.weight_bytes()).abs() < 1e-6 * all);
    }
}
