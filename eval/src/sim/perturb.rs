//! Engines that differ from the cost planner's model of them (`simulate --perturb-seed`,
//! `--additive-steps`): each worker's compute and memory efficiency drawn within ±`spread`
//! of its preset (seeded), and/or every step taking its compute plus its memory time, while
//! the planner keeps the presets (`Cluster::build_believed`) and learns only what a live
//! router would observe (its prefill calibration, the engines' load). A win that holds only
//! when the engine is the planner's own model is not one.

use ownerserve_planner::policy::SplitMix64;

use super::Cluster;

/// How the simulated engines differ from the planner's model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Perturbation {
    /// Seed of the efficiency draws; `None`: the presets' efficiencies.
    pub seed: Option<u64>,
    /// Each efficiency is drawn uniformly within ± this share of its preset (at most 1).
    pub spread: f64,
    pub additive_steps: bool,
}

/// The spread: ±30%.
pub const SPREAD: f64 = 0.3;

impl Cluster {
    /// This cluster with its engines perturbed by `p`; the planner is told the presets.
    pub fn perturbed(mut self, p: Perturbation) -> Self {
        let mut rng = p.seed.map(SplitMix64::new);
        for w in &mut self.workers {
            w.believed.get_or_insert_with(|| w.settings.clone());
            w.additive_steps |= p.additive_steps;
            if let Some(rng) = rng.as_mut() {
                let mut draw =
                    |v: f64| (v * (1.0 + p.spread * (2.0 * rng.next_f64() - 1.0))).min(1.0);
                w.settings.compute_efficiency = draw(w.settings.compute_efficiency);
                w.settings.memory_efficiency = draw(w.settings.memory_efficiency);
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ownerserve_shim::sim::config::SimSettings;

    #[test]
    fn the_engines_change_and_the_planner_keeps_the_presets() {
        let c = Cluster::parse("4h", &SimSettings::default()).expect("cluster");
        let presets = c.build().expect("builds");
        let p = c.clone().perturbed(Perturbation {
            seed: Some(7),
            spread: SPREAD,
            additive_steps: true,
        });
        let engines = p.build().expect("builds");
        let believed = p.build_believed().expect("builds");
        assert_eq!(
            believed.iter().map(|c| &c.roofline).collect::<Vec<_>>(),
            presets.iter().map(|c| &c.roofline).collect::<Vec<_>>()
        );
        let effs: Vec<_> = p
            .workers
            .iter()
            .map(|w| (w.settings.compute_efficiency, w.settings.memory_efficiency))
            .collect();
        for (c, m) in &effs {
            assert!(
                (0.35..=0.65).contains(c) && (0.49..=0.91).contains(m),
                "{effs:?}"
            );
        }
        assert!(
            effs.windows(2).any(|w| w[0] != w[1]),
            "drawn per worker: {effs:?}"
        );
        // The additive engine's mixed step is longer than the preset's: a prefill chunk no
        // longer hides the decodes' reads.
        let model = ownerserve_planner::spec::ModelSpec::preset("llama-3.1-8b").expect("preset");
        let work = ownerserve_planner::roofline::StepWork {
            prefill_tokens: 2048,
            prefill_attention_pairs: 2048 * 1024,
            prefill_context_tokens: 0,
            decode_seqs: 32,
            decode_context_tokens: 32 * 4096,
        };
        let b = &believed[0].roofline;
        let additive = b.clone().with_additive_steps();
        assert!(additive.step_time(&model, &work).total_s > b.step_time(&model, &work).total_s);
        assert_ne!(&engines[0].roofline, b);
        // Same seed, same draws.
        let again = c.perturbed(Perturbation {
            seed: Some(7),
            spread: SPREAD,
            additive_steps: true,
        });
        assert_eq!(
            again.build().expect("builds")[0].roofline,
            engines[0].roofline
        );
    }
}
