//! View: the planner's input for one step, built in one place from the directory (the
//! session's owner and epoch, the prompt's longest owned prefix), the KV index (each
//! worker's cached prefix) and the workers' health and load. The proxy and
//! `POST /admin/v1/plan/explain` both build it here, so explain shows what routing sees.
//! The request and the views are assembled by the planner's canonical step helpers
//! (`ownerserve_planner::step`), the ones the trace simulator runs too; this file only
//! supplies the router's sources (`RouterSources`).

use std::sync::Arc;

use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::{RouteRequest, WorkerView};
use ownerserve_planner::step::{self, Owned, StepInput, ViewSources};

use super::identity::Identity;
use crate::fleet::kv::KvRouting;
use crate::fleet::registry::{Registry, Worker};
use crate::ownership::sessions::Sessions;
use ownerserve_ownership::node::{DirectoryClient, Lookup};

/// Which sources a policy reads (the planner's canonical [`step::Needs`]).
pub use ownerserve_planner::step::Needs;

/// What one step's view is read from.
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub registry: &'a Registry,
    pub kv: &'a KvRouting,
    pub directory: Option<&'a dyn DirectoryClient>,
    /// The sessions this router saw, for the returns each worker's parked ones will send.
    pub sessions: Option<&'a Sessions>,
    /// Planner seconds per wall-clock second (`planner_time_scale`): decode ages are
    /// counted in the planner's time, like the lifetimes it observes.
    pub time_scale: f64,
    /// How long a worker just up warms up (`health.warmup_s`; zero: off).
    pub warmup: std::time::Duration,
}

/// The planner's request for a step, and what the directory said about it.
#[derive(Debug, Clone)]
pub struct StepView<'a> {
    pub route: RouteRequest<'a>,
    pub lookup: Lookup,
}

impl<'a> Sources<'a> {
    /// The step's request to the policy, with the directory read if `needs` says so.
    pub fn step(
        &self,
        model: &'a str,
        id: &'a Identity<'a>,
        samples: u32,
        needs: Needs,
    ) -> StepView<'a> {
        let block = self.kv.block_size() as u64;
        let lookup = match self.directory.filter(|_| needs.directory) {
            Some(d) => d.lookup(id.session, id.hashes(), block),
            None => Lookup::default(),
        };
        let input = StepInput {
            model,
            prompt_tokens: id.prompt_tokens(),
            block_size: block as u32,
            session: id.session,
            now_ms: self.kv.now_ms(),
            samples,
            fork: id.fork,
        };
        let owned = Owned {
            owner: lookup.owner,
            artifact: lookup.artifact,
        };
        StepView {
            route: step::route_request(input, owned, needs),
            lookup,
        }
    }

    /// The healthy workers serving `model` but `excluded`, with their load and, if
    /// `needs` says so, the prompt's cached prefix on each and the returns its parked
    /// sessions will send.
    pub fn candidates(
        &self,
        model: &str,
        hashes: &[u64],
        excluded: &[WorkerId],
        needs: Needs,
    ) -> Vec<WorkerView> {
        let fleet = self.registry.all();
        let workers = Registry::serving(&fleet, model, excluded);
        let mut views: Vec<WorkerView> = workers.iter().map(|w| w.view()).collect();
        let block = self.kv.block_size() as u64;
        for (v, w) in views.iter_mut().zip(&workers) {
            // The KV capacity folded into the scraped load (`step::predict_kv_usage`).
            if let Some(capacity) = w.kv_capacity_tokens().filter(|_| v.load.is_some()) {
                step::predict_kv_usage(v, block, capacity, self.kv.worker_gpu_tokens(v.id));
            }
        }
        let mut sources = RouterSources {
            sources: self,
            workers: &workers,
            hashes,
        };
        step::complete_views(&mut views, needs, &mut sources);
        let warmed: Vec<f64> = workers.iter().map(|w| w.warmed(self.warmup)).collect();
        step::hold_back_warming(&mut views, &warmed);
        views
    }
}

/// The router's sources for [`step::complete_views`]: its workers' decodes, the KV index,
/// the sessions it tracks.
struct RouterSources<'s, 'a> {
    sources: &'s Sources<'a>,
    /// The workers of the views, in their order.
    workers: &'s [&'s Arc<Worker>],
    hashes: &'s [u64],
}

impl ViewSources for RouterSources<'_, '_> {
    fn decode_ages(&mut self, at: usize, _: &WorkerView) -> DecodeAges {
        self.workers
            .get(at)
            .map(|w| w.decode_ages(self.sources.time_scale))
            .unwrap_or_default()
    }

    fn fill_cached(&mut self, views: &mut [WorkerView]) {
        self.sources.kv.fill_cached(self.hashes, views);
    }

    fn fill_parked_returns(&mut self, views: &mut [WorkerView]) {
        if let Some(sessions) = self.sources.sessions {
            sessions.fill_parked_returns(views, self.sources.time_scale);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ownerserve_ownership::ids::Epoch;
    use ownerserve_ownership::{Command, Outcome};
    use ownerserve_planner::hash::HashedPrompt;
    use ownerserve_planner::ids::{EngineKind, Role};
    use ownerserve_planner::kv_index::KvIndexConfig;
    use ownerserve_planner::plan::ArtifactView;
    use ownerserve_planner::tokenized::Tokenized;

    use super::*;
    use crate::config::WorkerSpec;
    use ownerserve_ownership::node::{BoxFuture, DirectoryError};

    /// A directory that answers every lookup with `answer`.
    struct FixedDirectory(Lookup);

    impl DirectoryClient for FixedDirectory {
        fn fresh(&self) -> bool {
            true
        }

        fn catch_up(&self) -> ownerserve_ownership::node::BoxFuture<'_, bool> {
            Box::pin(async { true })
        }

        fn read_local(&self, _: &mut dyn FnMut(&ownerserve_ownership::Directory)) {}

        fn write(&self, _: Command) -> BoxFuture<'_, Result<Outcome, DirectoryError>> {
            Box::pin(async { Err(DirectoryError::Protocol("read-only fake".into())) })
        }

        fn lookup(&self, _: Option<&str>, _: &[u64], _: u64) -> Lookup {
            self.0
        }
    }

    fn identity(tokens: usize) -> Identity<'static> {
        let tokens: Vec<u32> = (0..tokens as u32).collect();
        let hashes = ownerserve_planner::hash::prompt_hashes(
            &tokens,
            16,
            ownerserve_planner::hash::XXH3_SEED,
        );
        Identity {
            session: Some("s1"),
            root: Some("s1"),
            parent: None,
            side: false,
            fork: true,
            child: None,
            prompt: Arc::new(HashedPrompt {
                tokenized: Tokenized::from_tokens(tokens),
                hashes,
            }),
            exact_tokens: true,
            control: None,
        }
    }

    /// 16-token blocks, approximate entries kept a minute.
    fn kv_routing(registry: &Registry) -> KvRouting {
        let cfg = KvIndexConfig {
            block_size: 16,
            ..KvIndexConfig::default()
        };
        KvRouting::new(cfg, Duration::from_secs(60), registry)
    }

    #[test]
    fn the_step_reads_the_directory_only_for_policies_that_use_it() {
        let registry = Registry::new(vec![WorkerSpec::new(
            "d",
            "http://127.0.0.1:1",
            Role::Decode,
            EngineKind::Sim,
        )]);
        let kv = kv_routing(&registry);
        let owned = Lookup {
            owner: Some(WorkerId(0)),
            epoch: Some(Epoch(9)),
            artifact: Some(ArtifactView {
                owner: WorkerId(0),
                tokens: 32,
            }),
            artifact_key: None,
            consulted: true,
        };
        let directory = FixedDirectory(owned);
        let sources = Sources {
            registry: &registry,
            kv: &kv,
            directory: Some(&directory),
            sessions: None,
            time_scale: 1.0,
            warmup: std::time::Duration::ZERO,
        };
        let id = identity(40);
        let step = sources.step("m", &id, 2, Needs::ALL);
        assert_eq!(step.lookup, owned);
        let r = step.route;
        assert_eq!(
            (r.model, r.prompt_tokens, r.block_size, r.session),
            ("m", 40, 16, Some("s1"))
        );
        assert_eq!(
            (r.decode_owner, r.artifact, r.samples, r.fork),
            (owned.owner, owned.artifact, 2, true)
        );
        let blind = sources.step(
            "m",
            &id,
            1,
            Needs {
                prefix_match: true,
                directory: false,
                decode_ages: false,
            },
        );
        assert_eq!(blind.lookup, Lookup::default());
        assert_eq!(
            (blind.route.decode_owner, blind.route.artifact),
            (None, None)
        );
    }

    /// Hybrid sim workers `a` and `b`, healthy, serving model `m`.
    fn two_healthy_hybrids() -> Registry {
        let registry = Registry::new(vec![
            WorkerSpec::new("a", "http://127.0.0.1:1", Role::Hybrid, EngineKind::Sim),
            WorkerSpec::new("b", "http://127.0.0.1:2", Role::Hybrid, EngineKind::Sim),
        ]);
        for w in registry.all().iter() {
            w.mark_healthy(vec!["m".into()]);
        }
        registry
    }

    #[test]
    fn candidates_carry_parked_returns_in_planner_time_only_for_policies_that_read_owners() {
        let registry = two_healthy_hybrids();
        let kv = kv_routing(&registry);
        let sessions = crate::ownership::sessions::Sessions::new(
            ownerserve_planner::ewma::GapLease::new(2.0, 60_000, 600_000),
            ownerserve_planner::lifecycle::GapEstimate::from_median_p90(5.0, 60.0),
        );
        let start = |at| sessions.start("s", WorkerId(1), vec![], at, Default::default());
        drop(start(0).activity);
        let idle = crate::ownership::sessions::now_ms();
        drop(start(idle + 500).activity);
        let sources = Sources {
            registry: &registry,
            kv: &kv,
            directory: None,
            sessions: Some(&sessions),
            time_scale: 2.0,
            warmup: std::time::Duration::ZERO,
        };
        let returns = |needs| -> Vec<f64> {
            sources
                .candidates("m", &[], &[], needs)
                .iter()
                .map(|c| (c.parked_returns_per_s * 10.0).round() / 10.0)
                .collect()
        };
        // One return per 0.5 s of wall clock: per planner second at 2× speed, one per 1 s.
        assert_eq!(returns(Needs::ALL), [0.0, 1.0]);
        let blind = Needs {
            prefix_match: true,
            directory: false,
            decode_ages: true,
        };
        assert_eq!(returns(blind), [0.0, 0.0]);
    }

    #[test]
    fn candidates_carry_the_cached_prefix_only_for_policies_that_match() {
        let registry = two_healthy_hybrids();
        let kv = kv_routing(&registry);
        let id = identity(64);
        let b = registry.get(WorkerId(1)).unwrap();
        kv.record_routed(&b, &id.hashes()[..3]);
        let sources = Sources {
            registry: &registry,
            kv: &kv,
            directory: None,
            sessions: None,
            time_scale: 1.0,
            warmup: std::time::Duration::ZERO,
        };
        let cached = |needs, excluded: &[WorkerId]| -> Vec<(WorkerId, u32)> {
            sources
                .candidates("m", id.hashes(), excluded, needs)
                .iter()
                .map(|c| (c.id, c.cached_blocks))
                .collect()
        };
        assert_eq!(
            cached(Needs::ALL, &[]),
            [(WorkerId(0), 0), (WorkerId(1), 3)]
        );
        assert_eq!(
            cached(
                Needs {
                    prefix_match: false,
                    directory: true,
                    decode_ages: false,
                },
                &[]
            ),
            [(WorkerId(0), 0), (WorkerId(1), 0)]
        );
        assert_eq!(cached(Needs::ALL, &[WorkerId(1)]), [(WorkerId(0), 0)]);
        assert!(sources
            .candidates("other", id.hashes(), &[], Needs::ALL)
            .is_empty());
    }
}
