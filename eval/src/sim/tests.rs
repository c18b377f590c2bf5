//! The simulator end to end on small workloads: every policy completes every step, runs
//! are deterministic, and the engine model's behaviour shows through (prefix reuse, KV
//! moved only by policies that move it).

use super::*;
use crate::report::run_one;
use crate::workload::{agentic, Workload};
use ownerserve_shim::sim::config::SimSettings;

fn swe_smith() -> Workload {
    agentic::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/traces/continuum_swesmith_derived.jsonl"
    ))
    .expect("the shipped trace reads")
}

fn run(wl: &Workload, cluster: &str, name: &str) -> RunResult {
    let c = Cluster::parse(cluster, &SimSettings::default()).expect("cluster");
    run_one(name, wl, &c, &SimOptions::default(), &|_| {}).expect("runs")
}

#[test]
fn every_policy_completes_every_step_of_the_swe_smith_sessions() {
    let wl = swe_smith();
    for name in crate::report::all_policies() {
        let name = name.as_str();
        let r = run(&wl, "1p3d", name);
        assert_eq!(r.steps.len(), wl.num_requests(), "{name}");
        assert_eq!(r.rejected(), 0, "{name}");
        assert!(r.ttfts().iter().all(|t| *t > 0.0), "{name}");
        assert_eq!(r.session_e2e_s.len(), wl.sessions.len(), "{name}");
        assert!(r.makespan_s > 0.0, "{name}");
        if name != crate::bound::BOUND {
            assert!(r.gpu_busy > 0.0 && r.gpu_busy <= 1.0, "{name}");
        }
        assert!(r.duplicate_factor >= 1.0, "{name}");
    }
}

#[test]
fn runs_are_deterministic() {
    let wl = swe_smith();
    let a = run(&wl, "1p3d", "ownerserve");
    let b = run(&wl, "1p3d", "ownerserve");
    assert_eq!(a.steps, b.steps);
    assert_eq!(a.kv_bytes, b.kv_bytes);
    assert_eq!(a.actions, b.actions);
}

#[test]
fn static_pd_ships_every_prompt_and_colocated_ships_nothing() {
    let wl = swe_smith();
    let pd = run(&wl, "1p3d", "static_pd");
    let co = run(&wl, "1p3d", "colocated");
    assert!(pd.kv_bytes.prefill_to_decode > 0);
    assert_eq!(co.kv_bytes.total(), 0);
    // Agent turns share their history: a sticky policy reuses most of each prompt.
    assert!(co.reuse_ratio() > 0.5, "reuse {}", co.reuse_ratio());
    // The prefill worker keeps a copy of each prompt it prefilled: duplicates that the
    // decoders' own residency does not hold. A policy that never prefills remotely has
    // nothing there, so its two factors agree.
    assert!(
        pd.duplicate_factor > pd.duplicate_factor_decoders && pd.duplicate_factor_decoders >= 1.0,
        "{} against {} on decoders",
        pd.duplicate_factor,
        pd.duplicate_factor_decoders
    );
    assert!((co.duplicate_factor - co.duplicate_factor_decoders).abs() < 1e-9);
}

#[test]
fn each_step_records_what_its_plan_reused_and_its_decode_worker_s_kv() {
    let wl = swe_smith();
    let r = run(&wl, "1p3d", "ownerserve");
    for s in r.steps.iter().filter(|s| !s.rejected) {
        let p = &s.placement;
        assert!(p.planned_reused_tokens <= s.prompt_tokens, "{s:?}");
        assert!(p.kv_free_there > 0, "{s:?}");
    }
    // Later steps of a session reuse its history, and the plan knows it.
    assert!(r
        .steps
        .iter()
        .any(|s| s.placement.planned_reused_tokens > 0));
}

#[test]
fn a_host_tier_restores_evicted_prefixes_and_raises_reuse() {
    // A small HBM (1,200 blocks, 19.2K tokens per worker) evicts the sessions' histories;
    // with host DRAM they come back over PCIe instead of being recomputed. (At 2,000
    // blocks `ownerserve` spreads the sessions by running context so that what they reuse
    // is never evicted, and there is nothing to restore. Since its prefill worker may
    // decode too (`PrefillWorkersDecode::Auto`), at 300–800 blocks none of its steps on
    // this workload found a prefix in host memory in the runs tried; why was not
    // examined.)
    let wl = swe_smith();
    let run_with = |host_dram_gb: f64, policy: &str| {
        let settings = SimSettings {
            max_kv_blocks: 1200,
            host_dram_gb,
            ..SimSettings::default()
        };
        let c = Cluster::parse("1p3d", &settings).expect("cluster");
        run_one(policy, &wl, &c, &SimOptions::default(), &|_| {}).expect("runs")
    };
    for policy in ["ownerserve", "dynamo_kv"] {
        let off = run_with(0.0, policy);
        let on = run_with(64.0, policy);
        assert_eq!(off.host_restored_bytes, 0, "{policy}");
        assert_eq!(off.host_hit_steps(), 0, "{policy}");
        assert!(on.host_restored_bytes > 0, "{policy}");
        assert!(on.host_hit_steps() > 0, "{policy}");
        assert!(on.host_reuse_ratio() > 0.0 && on.host_reuse_ratio() <= on.reuse_ratio());
        assert!(
            on.reuse_ratio() > off.reuse_ratio(),
            "{policy}: reuse {} with the host tier, {} without",
            on.reuse_ratio(),
            off.reuse_ratio()
        );
        // Host copies are not HBM: the duplicate factor counts GPU copies only.
        assert!(on.duplicate_factor >= 1.0);
    }
}

/// Sends every step to worker 0, noting the most host-cached blocks a view showed.
struct HostSeen {
    most: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Policy for HostSeen {
    fn name(&self) -> &'static str {
        "host_seen"
    }

    fn needs_prefix_match(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        _: &ownerserve_planner::policy::RouteRequest<'_>,
        workers: &[ownerserve_planner::policy::WorkerView],
    ) -> Result<ownerserve_planner::policy::Decision, ownerserve_planner::policy::PolicyError> {
        for w in workers {
            self.most
                .fetch_max(w.host_cached_blocks, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(ownerserve_planner::policy::Decision::single(workers[0].id))
    }
}

#[test]
fn the_views_show_the_prompt_blocks_a_worker_holds_in_host_memory() {
    // As the live router's index reads the engines' `medium`: the planner prices a restore
    // only for what the view shows (without it, ownerserve moved sessions off their host
    // copies and recomputed them).
    let wl = swe_smith();
    let most_seen = |host_dram_gb: f64| {
        let most = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let settings = SimSettings {
            max_kv_blocks: 1200,
            host_dram_gb,
            ..SimSettings::default()
        };
        let c = Cluster::parse("1h", &settings).expect("cluster");
        let policy = HostSeen { most: most.clone() };
        simulate(&wl, &c, Box::new(policy), &SimOptions::default(), &|_| {}).expect("runs");
        most.load(std::sync::atomic::Ordering::Relaxed)
    };
    assert_eq!(most_seen(0.0), 0);
    assert!(most_seen(64.0) > 0);
}

/// Round robin, noting at each decision the KV its views count among decodes on each
/// worker, and the most the requests in flight there could hold.
struct AgesSeen {
    inner: ownerserve_planner::policy::RoundRobin,
    seen: std::sync::Arc<std::sync::Mutex<Vec<(u64, u64)>>>,
    longest_prompt: u64,
}

impl Policy for AgesSeen {
    fn name(&self) -> &'static str {
        "ages_seen"
    }

    fn needs_decode_ages(&self) -> bool {
        true
    }

    fn choose(
        &mut self,
        req: &ownerserve_planner::policy::RouteRequest<'_>,
        workers: &[ownerserve_planner::policy::WorkerView],
    ) -> Result<ownerserve_planner::policy::Decision, ownerserve_planner::policy::PolicyError> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        for w in workers {
            let bound = u64::from(w.in_flight) * self.longest_prompt;
            seen.push((w.decode_ages.total(), bound));
        }
        self.inner.choose(req, workers)
    }
}

#[test]
fn the_views_count_the_kv_of_the_requests_decoding_on_each_worker_until_they_end() {
    let wl = swe_smith();
    let longest_prompt = wl
        .sessions
        .iter()
        .flat_map(|s| s.steps.iter())
        .map(|st| u64::from(st.input_tokens))
        .max()
        .unwrap_or(0);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let policy = AgesSeen {
        inner: ownerserve_planner::policy::RoundRobin::default(),
        seen: seen.clone(),
        longest_prompt,
    };
    let c = Cluster::parse("2h", &SimSettings::default()).expect("cluster");
    simulate(&wl, &c, Box::new(policy), &SimOptions::default(), &|_| {}).expect("runs");
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    assert!(seen.iter().any(|(ages, _)| *ages > 0), "no decode counted");
    // A request that ended no longer counts: what is counted fits the requests in flight.
    for (ages, bound) in seen.iter() {
        assert!(
            ages <= bound,
            "{ages} counted with at most {bound} in flight"
        );
    }
}

/// Moves every step onto worker 1 from worker 0, noting at each decision how many steps
/// the views count as heading to worker 1 and how many are in flight there.
struct MovesSeen {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(u32, u32)>>>,
}

impl Policy for MovesSeen {
    fn name(&self) -> &'static str {
        "moves_seen"
    }

    fn choose(
        &mut self,
        req: &ownerserve_planner::policy::RouteRequest<'_>,
        workers: &[ownerserve_planner::policy::WorkerView],
    ) -> Result<ownerserve_planner::policy::Decision, ownerserve_planner::policy::PolicyError> {
        use ownerserve_planner::ids::WorkerId;
        use ownerserve_planner::policy::{Decision, Dispatch};
        let w = &workers[1];
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.push((w.legs_heading, w.in_flight));
        Ok(Decision {
            worker: WorkerId(1),
            dispatch: Dispatch::Migrate {
                source: WorkerId(0),
                tokens: u64::from(req.prompt_tokens),
            },
            plan: None,
        })
    }
}

/// A move reaches its worker's queue only once its copy lands; until then the views count
/// it as heading there, as a remote prefill's decode leg, so that a prefill planned there
/// meanwhile is priced for the step it will run ahead of.
#[test]
fn a_move_whose_copy_is_under_way_is_counted_as_heading_to_its_worker() {
    let wl = swe_smith();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let policy = MovesSeen { seen: seen.clone() };
    // Copies that take 2 s: steps planned meanwhile see them under way.
    let settings = SimSettings {
        link_latency_us: 2e6,
        ..SimSettings::default()
    };
    let c = Cluster::parse("2h", &settings).expect("cluster");
    simulate(&wl, &c, Box::new(policy), &SimOptions::default(), &|_| {}).expect("runs");
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        seen.iter().any(|(heading, _)| *heading > 0),
        "no move counted"
    );
    // A copy that landed no longer counts: what is counted is in flight there.
    for (heading, in_flight) in seen.iter() {
        assert!(
            heading <= in_flight,
            "{heading} heading, {in_flight} in flight"
        );
    }
}

#[test]
fn the_lifecycle_runs_for_ownerserve_only_and_keeps_parked_sessions_under_a_flood() {
    let (wl, c) = long_gap_on_two_workers();
    let on = SimOptions {
        lifecycle: true,
        ..SimOptions::default()
    };
    let run = |name: &str, opts: &SimOptions| run_one(name, &wl, &c, opts, &|_| {}).expect("runs");
    let (with, without) = (
        run("ownerserve", &on),
        run("ownerserve", &SimOptions::default()),
    );
    assert!(without.lifecycle.is_empty());
    assert!(
        run("session_affinity", &on).lifecycle.is_empty(),
        "the router's, not a peer's"
    );
    let count = |k: &str| with.lifecycle.get(k).copied().unwrap_or(0);
    assert!(
        count("decided keep") > 0 && count("sent touch") > 0,
        "{:?}",
        with.lifecycle
    );
    let returns = count("returned to hbm") + count("returned to host") + count("returned to gone");
    assert!(returns > 0, "{:?}", with.lifecycle);
    assert_eq!(with.steps.len(), wl.num_requests(), "touches are not steps");
    assert_eq!(
        with.lifecycle,
        run("ownerserve", &on).lifecycle,
        "deterministic"
    );
}

#[test]
fn admission_headroom_keeps_returns_cached() {
    // More live context than two workers hold: admission holds first steps, and with
    // half the KV kept for the live sessions' growth their returns thrash less (so they
    // also end sooner, and the first steps held wait less in all: 16 s against 100 s).
    let (wl, c) = long_gap_on_two_workers();
    let admitted = |headroom: f64| {
        let opts = SimOptions {
            admission: true,
            admission_headroom: headroom,
            ..SimOptions::default()
        };
        let r = run_one("ownerserve", &wl, &c, &opts, &|_| {}).expect("runs");
        assert_eq!(r.steps.len(), wl.num_requests());
        let waited: f64 = r.steps.iter().map(|s| s.placement.admit_wait_s).sum();
        let computed: u64 = r
            .steps
            .iter()
            .filter(|s| s.step > 0)
            .map(|s| u64::from(s.prompt_tokens - s.cached_tokens))
            .sum();
        (waited, computed)
    };
    let (none, half) = (admitted(0.0), admitted(0.5));
    assert!(none.0 > 0.0 && half.0 > 0.0, "{none:?} against {half:?}");
    assert!(
        half.1 * 2 < none.1,
        "returns computed: {none:?} against {half:?}"
    );
}

/// Long tool gaps, contexts of 30-120K tokens, more sessions than two workers hold.
fn long_gap_on_two_workers() -> (Workload, Cluster) {
    let wl = crate::scenario::WorkloadSpec {
        workload: "long-gap".into(),
        sessions: Some(12),
        ..Default::default()
    }
    .build()
    .expect("long-gap");
    let c = Cluster::parse("2h", &SimSettings::default()).expect("cluster");
    (wl, c)
}
