//! The simulated fleet: which workers, with which roles, GPUs and links. One spec builds
//! both the simulator's engines and the cost planner's view of them, and the same
//! settings start a live fleet of `ownerserve sim-worker`s, so both sides model one
//! cluster.

use std::collections::BTreeMap;

use ownerserve_planner::ids::{Role, WorkerId};
use ownerserve_planner::plan::{ClassThresholds, Link, Links, StepBudget, Weights};
use ownerserve_planner::policy::{OwnerServeConfig, PrefillWorkersDecode};
use ownerserve_shim::sim::config::{SimConfig, SimConfigError, SimSettings};

/// One worker of a simulated cluster.
#[derive(Debug, Clone)]
pub struct ClusterWorker {
    pub name: String,
    pub role: Role,
    /// The same settings `ownerserve sim-worker` takes.
    pub settings: SimSettings,
    /// Workers of those settings fused into this one (`pooled.rs`); 1 for a real worker.
    pub pooled: u32,
    /// What the cost planner is told of it when the engine differs from its model
    /// (`perturb.rs`); `None`: `settings`, exactly.
    pub believed: Option<SimSettings>,
    /// The engine's steps take compute plus memory time (`Roofline::with_additive_steps`);
    /// the planner is not told.
    pub additive_steps: bool,
}

/// A fleet of simulated workers.
#[derive(Debug, Clone)]
pub struct Cluster {
    /// Short name, e.g. `2p6d`.
    pub name: String,
    pub workers: Vec<ClusterWorker>,
    /// When the cost planner may decode on its prefill workers, which serve whole requests
    /// (the router's `planner_prefill_workers_decode`; the simulated engine can). The peers'
    /// routers keep their sources' roles either way.
    pub prefill_workers_decode: PrefillWorkersDecode,
    /// The cost planner's migration budget (the router's `planner_migration_budget`; its
    /// default, 0.1, unless set; infinite: none).
    pub migration_budget: f64,
    /// Its engines can pull a sealed prefix from a peer (the simulated engine's
    /// `/kv/fetch`); `false` models vLLM and SGLang here, which move KV only from a prefill
    /// leg to its decode leg: the cost planner then plans no fetch or migration.
    pub peer_pulls: bool,
}

/// A cluster spec that cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "cluster `{0}`: expected groups like `2p6d` or `8h` (count then p = prefill, \
         d = decode, h = hybrid)"
    )]
    Syntax(String),
    #[error("cluster `{0}` has no worker that serves whole requests (decode or hybrid)")]
    NoDecode(String),
    #[error(
        "cluster `{0}` cannot be pooled: the relaxation fuses hybrid workers of one kind \
         (e.g. 8h)"
    )]
    NotPoolable(String),
    #[error("worker {worker}: {source}")]
    Worker {
        worker: String,
        #[source]
        source: Box<SimConfigError>,
    },
}

impl Cluster {
    /// Parses a spec such as `2p6d` (2 prefill + 6 decode) or `8h` (8 hybrid); every worker
    /// gets `base` settings. A mixed fleet joins parts with `+`, each part's GPUs named
    /// after `@` (a preset or a spec file, as `--gpu-preset` takes): `4h@h100+4h@l40`.
    pub fn parse(spec: &str, base: &SimSettings) -> Result<Self, ClusterError> {
        let syntax = || ClusterError::Syntax(spec.to_owned());
        let mut workers = Vec::new();
        for part in spec.trim().split('+') {
            let (groups, gpu) = match part.split_once('@') {
                Some((groups, gpu)) if !gpu.trim().is_empty() => (groups, Some(gpu.trim())),
                Some(_) => return Err(syntax()),
                None => (part, None),
            };
            let mut settings = base.clone();
            if let Some(gpu) = gpu {
                settings.gpu = gpu.to_owned();
            }
            Self::parse_groups(groups, &settings, &mut workers).ok_or_else(syntax)?;
        }
        if workers.is_empty() {
            return Err(syntax());
        }
        if !workers.iter().any(|w| w.role.serves_full_requests()) {
            return Err(ClusterError::NoDecode(spec.to_owned()));
        }
        Ok(Self {
            name: spec.trim().to_ascii_lowercase(),
            workers,
            prefill_workers_decode: PrefillWorkersDecode::default(),
            migration_budget: Weights::default().migration_budget,
            peer_pulls: true,
        })
    }

    /// Appends the workers of `groups` (`2p6d`), each with `settings`, numbered after the
    /// workers of their role already in `workers`; `None` on a syntax error.
    fn parse_groups(
        groups: &str,
        settings: &SimSettings,
        workers: &mut Vec<ClusterWorker>,
    ) -> Option<()> {
        let mut digits = String::new();
        let mut any = false;
        for c in groups.trim().chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let role = match c.to_ascii_lowercase() {
                'p' => Role::Prefill,
                'd' => Role::Decode,
                'h' => Role::Hybrid,
                _ => return None,
            };
            let n: usize = digits.parse().ok()?;
            digits.clear();
            if n == 0 || n > 1024 || workers.len() + n > 1024 {
                return None;
            }
            any = true;
            let prefix = match role {
                Role::Prefill => "p",
                Role::Decode => "d",
                Role::Hybrid => "h",
            };
            let first = workers
                .iter()
                .filter(|w: &&ClusterWorker| w.role == role)
                .count();
            for i in 0..n {
                workers.push(ClusterWorker {
                    name: format!("{prefix}{}", first + i),
                    role,
                    settings: settings.clone(),
                    pooled: 1,
                    believed: None,
                    additive_steps: false,
                });
            }
        }
        (digits.is_empty() && any).then_some(())
    }

    /// The same fleet with the cost planner's migration budget set to `share`.
    pub fn with_migration_budget(self, share: f64) -> Self {
        Self {
            migration_budget: share,
            ..self
        }
    }

    /// The same fleet, its engines able to pull KV from a peer or not.
    pub fn with_peer_pulls(self, peer_pulls: bool) -> Self {
        Self { peer_pulls, ..self }
    }

    /// The same fleet with its prefill workers allowed to decode when `when` says.
    pub fn with_prefill_workers_decode(self, when: PrefillWorkersDecode) -> Self {
        Self {
            prefill_workers_decode: when,
            ..self
        }
    }

    /// The pooled relaxation of this fleet (`pooled.rs`): its workers fused into one.
    /// Only a fleet of hybrid workers of one kind pools: a prefill worker's role would
    /// be lost.
    pub fn pooled(self) -> Result<Self, ClusterError> {
        let Some(first) = self.workers.first() else {
            return Err(ClusterError::NotPoolable(self.name));
        };
        let same = self
            .workers
            .iter()
            .all(|w| w.role == Role::Hybrid && w.settings == first.settings && w.pooled == 1);
        if !same {
            return Err(ClusterError::NotPoolable(self.name));
        }
        let worker = ClusterWorker {
            name: "pooled".to_owned(),
            role: Role::Hybrid,
            settings: first.settings.clone(),
            pooled: self.workers.len() as u32,
            believed: first.believed.clone(),
            additive_steps: first.additive_steps,
        };
        Ok(Self {
            name: format!("{}-pooled", self.name),
            workers: vec![worker],
            ..self
        })
    }

    /// Every worker's engine configuration, in worker order.
    pub fn build(&self) -> Result<Vec<SimConfig>, ClusterError> {
        self.workers
            .iter()
            .map(|w| {
                let mut config = Self::build_one(w, &w.settings)?;
                if w.additive_steps {
                    config.roofline = config.roofline.with_additive_steps();
                }
                Ok(config)
            })
            .collect()
    }

    /// Every worker's engine configuration as the cost planner is told it: the same as
    /// [`Self::build`] unless the engines were perturbed.
    pub fn build_believed(&self) -> Result<Vec<SimConfig>, ClusterError> {
        self.workers
            .iter()
            .map(|w| Self::build_one(w, w.believed.as_ref().unwrap_or(&w.settings)))
            .collect()
    }

    fn build_one(w: &ClusterWorker, settings: &SimSettings) -> Result<SimConfig, ClusterError> {
        let config = settings.build().map_err(|source| ClusterError::Worker {
            worker: w.name.clone(),
            source: Box::new(source),
        })?;
        Ok(match w.pooled {
            0 | 1 => config,
            n => super::pooled::fuse(config, settings, n),
        })
    }

    /// The cost planner's figures for this fleet (`configs`, its workers' engine
    /// configurations): each worker's own roofline and step budget, the links its settings
    /// give and whether its prefill workers may decode (what an operator configures the
    /// live router with).
    pub fn planner_config(&self, configs: &[SimConfig]) -> Option<OwnerServeConfig> {
        let first = configs.first()?;
        let link_of = |c: &SimConfig| Link {
            bytes_per_s: c.transfer.link.bytes_per_s,
            latency_s: c.transfer.link.latency_s,
        };
        let mut pairs = BTreeMap::new();
        for (to, c) in configs.iter().enumerate() {
            for from in 0..configs.len() {
                if from != to && link_of(c) != link_of(first) {
                    // A pull is paced by the receiver's link.
                    pairs.insert((WorkerId(from as u32), WorkerId(to as u32)), link_of(c));
                }
            }
        }
        let rooflines = configs
            .iter()
            .enumerate()
            .map(|(i, c)| (WorkerId(i as u32), c.roofline.clone()))
            .collect();
        let step_budget = |c: &SimConfig| StepBudget {
            tokens: u64::from(c.scheduler.max_num_batched_tokens),
            long_prefill_cap: u64::from(c.scheduler.long_prefill_token_threshold),
        };
        let worker_step_budgets = configs
            .iter()
            .enumerate()
            .map(|(i, c)| (WorkerId(i as u32), step_budget(c)))
            .collect();
        Some(OwnerServeConfig {
            model: first.model.clone(),
            models: BTreeMap::new(),
            roofline: first.roofline.clone(),
            rooflines,
            step_budget: step_budget(first),
            worker_step_budgets,
            links: Links {
                default: link_of(first),
                pairs,
            },
            weights: Weights {
                migration_budget: self.migration_budget,
                ..Weights::default()
            },
            thresholds: ClassThresholds::default(),
            pcie_bytes_per_s: first.scheduler.pcie_bytes_per_s,
            prefill_workers_decode: self.prefill_workers_decode,
            // No router replica reads the simulator's directory: no move is held.
            move_hold_s: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_into_named_roles() {
        let c = Cluster::parse("2p6d", &SimSettings::default()).expect("parses");
        let names: Vec<_> = c.workers.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["p0", "p1", "d0", "d1", "d2", "d3", "d4", "d5"]);
        assert_eq!(c.workers[1].role, Role::Prefill);
        assert_eq!(c.workers[2].role, Role::Decode);
        let h = Cluster::parse("8H", &SimSettings::default()).expect("parses");
        assert!(h.workers.iter().all(|w| w.role == Role::Hybrid));
        assert_eq!(h.name, "8h");
    }

    #[test]
    fn a_mixed_fleet_names_each_parts_gpus_and_the_planner_prices_each() {
        let c = Cluster::parse("2h@h100+1p1d@l40", &SimSettings::default()).expect("parses");
        let names: Vec<_> = c.workers.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["h0", "h1", "p0", "d0"]);
        let gpus: Vec<_> = c.workers.iter().map(|w| w.settings.gpu.as_str()).collect();
        assert_eq!(gpus, ["h100", "h100", "l40", "l40"]);
        let configs = c.build().expect("builds");
        assert_ne!(configs[0].roofline, configs[2].roofline);
        assert!(configs[0].scheduler.num_blocks > configs[3].scheduler.num_blocks);
        let p = c.planner_config(&configs).expect("planner config");
        assert_eq!(p.roofline_of(WorkerId(3)), &configs[3].roofline);
        assert_eq!(p.roofline_of(WorkerId(0)), &configs[0].roofline);
        // A part without `@` keeps the base GPU; an unknown one fails when built.
        let base = Cluster::parse("1h+1h@l40", &SimSettings::default()).expect("parses");
        assert_eq!(base.workers[0].settings.gpu, SimSettings::default().gpu);
        let unknown = Cluster::parse("1h@no-such-gpu", &SimSettings::default()).expect("parses");
        assert!(unknown.build().is_err());
    }

    #[test]
    fn bad_specs_are_refused() {
        for bad in ["", "p", "2x", "0d", "2p", "3", "d2", "2h@", "+2h", "2h+"] {
            assert!(
                Cluster::parse(bad, &SimSettings::default()).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn only_a_fleet_of_hybrid_workers_pools() {
        let p = Cluster::parse("8h", &SimSettings::default())
            .and_then(Cluster::pooled)
            .expect("pools");
        assert_eq!((p.name.as_str(), p.workers.len()), ("8h-pooled", 1));
        let one = Cluster::parse("1h", &SimSettings::default()).expect("parses");
        let (fleet, pooled) = (one.build().expect("builds"), p.build().expect("builds"));
        assert_eq!(
            pooled[0].scheduler.num_blocks,
            8 * fleet[0].scheduler.num_blocks
        );
        let pd = Cluster::parse("2p6d", &SimSettings::default()).expect("parses");
        assert!(matches!(pd.pooled(), Err(ClusterError::NotPoolable(_))));
    }

    #[test]
    fn the_planner_sees_each_workers_roofline_and_step_budget() {
        let c = Cluster::parse("1p1d", &SimSettings::default()).expect("parses");
        let mut configs = c.build().expect("builds");
        configs[1].scheduler.max_num_batched_tokens = 1_024;
        configs[1].scheduler.long_prefill_token_threshold = 256;
        let p = c.planner_config(&configs).expect("a planner config");
        assert_eq!(p.rooflines.len(), 2);
        assert!((p.links.default.bytes_per_s - 50e9).abs() < 1.0);
        assert_eq!(p.step_budget_of(WorkerId(0)), StepBudget::of(8_192));
        let second = StepBudget {
            tokens: 1_024,
            long_prefill_cap: 256,
        };
        assert_eq!(p.step_budget_of(WorkerId(1)), second);
    }
}
