//! The lifecycle decision's tests: each course wins where it should.

use super::*;

fn levers(retention: Retention, host_tier: bool) -> Levers {
    Levers {
        priority: true,
        retention,
        host_tier,
    }
}

fn owner(usage: f64, churn: f64, levers: Levers) -> OwnerKv {
    OwnerKv {
        levers,
        capacity_tokens: 1_000_000,
        usage,
        churn_tokens_per_s: churn,
        host_free_tokens: if levers.host_tier { 10_000_000 } else { 0 },
        kept_tokens: 0,
    }
}

/// An 80K-token coding session: 4 s to prefill, 0.2 s over PCIe.
fn prices() -> Prices {
    Prices {
        recompute_s: 4.0,
        restore_s: 0.2,
        offload_s: 0.2,
        touch_s: 0.02,
    }
}

fn parked(median_s: f64, p90_s: f64) -> Parked {
    Parked {
        context_tokens: 80_000,
        gap: GapEstimate::from_median_p90(median_s, p90_s),
        idle_s: 0.0,
        p_return: 0.95,
        resident: true,
    }
}

fn decide_for(p: Parked, kv: OwnerKv) -> Lifecycle {
    decide(&p, &kv, &prices(), &LifecycleWeights::default())
}

#[test]
fn an_idle_fleet_lets_the_lru_keep_it() {
    // Nothing written: nothing will evict it.
    let l = decide_for(
        parked(40.0, 120.0),
        owner(0.2, 0.0, levers(Retention::Touch, true)),
    );
    assert_eq!(l.hold, Hold::LetGo, "{l:?}");
    assert_eq!(l.costs[3], 0.0);
}

#[test]
fn a_short_tool_call_is_back_before_the_lru_turns_over() {
    // 20K tokens/s of churn on 800K evictable: a 40 s horizon; a 1 s `ls` returns first.
    let l = decide_for(
        parked(1.0, 3.0),
        owner(0.2, 20_000.0, levers(Retention::Touch, false)),
    );
    assert_eq!(l.hold, Hold::LetGo, "{l:?}");
}

#[test]
fn a_test_run_under_a_flood_is_offloaded_and_restored_before_it_returns() {
    // 100K tokens/s of churn on 200K evictable: the LRU turns over in 2 s; the test run
    // takes 40 s, give or take a few.
    let kv = owner(0.8, 100_000.0, levers(Retention::Touch, true));
    let l = decide_for(parked(40.0, 45.0), kv);
    assert_eq!(l.hold, Hold::Offload, "{l:?}");
    let at = l.bring_back_in_s.unwrap();
    let gap = GapEstimate::from_median_p90(40.0, 45.0);
    assert!(
        at > 30.0 && at + prices().restore_s < gap.quantile_s(0.2),
        "{at}"
    );
}

#[test]
fn an_unpredictable_gap_is_brought_back_early_and_kept_warm_from_there() {
    // The same flood, a gap anywhere from seconds to minutes: to beat the soonest returns
    // a restore must land within seconds, so nearly all of keep's cost remains.
    let kv = owner(0.8, 100_000.0, levers(Retention::Touch, true));
    let l = decide_for(parked(40.0, 300.0), kv);
    assert!(l.costs[1] > 0.9 * l.costs[0], "{l:?}");
    assert!(l.bring_back_in_s.is_none_or(|s| s < 10.0), "{l:?}");
    assert!(
        l.hold == Hold::LetGo || l.touch_every_s.is_some(),
        "kept warm once back: {l:?}"
    );
}

#[test]
fn without_a_host_tier_it_is_kept_or_prefetched_never_let_go_under_a_flood() {
    for retention in [Retention::Touch, Retention::Hold] {
        let kv = owner(0.8, 100_000.0, levers(retention, false));
        let l = decide_for(parked(40.0, 90.0), kv);
        assert!(
            matches!(l.hold, Hold::Keep | Hold::Prefetch),
            "{retention:?}: {l:?}"
        );
        assert!(l.costs[1].is_infinite(), "no host tier: no offload");
        assert!(l.costs[3] > 3.0, "let go pays the prefill: {l:?}");
        if l.hold == Hold::Keep && retention == Retention::Touch {
            let every = l.touch_every_s.unwrap();
            assert!(
                (every - 0.5).abs() < 1e-9,
                "a quarter of the 2 s horizon: {every}"
            );
        }
    }
}

#[test]
fn what_the_kept_share_has_no_room_for_is_offloaded_or_let_go() {
    // The same flood: 0.5 × 20% of 1M tokens = 100K of room for kept sessions. With 30K
    // kept already this 80K-token one is neither kept nor brought back into HBM.
    for host_tier in [false, true] {
        let mut kv = owner(0.8, 100_000.0, levers(Retention::Touch, host_tier));
        kv.kept_tokens = 10_000;
        let fits = decide_for(parked(40.0, 90.0), kv);
        assert!(
            fits.costs[0].is_finite() && fits.costs[2].is_finite(),
            "{fits:?}"
        );
        kv.kept_tokens = 30_000;
        let full = decide_for(parked(40.0, 90.0), kv);
        assert!(
            full.costs[0].is_infinite() && full.costs[2].is_infinite(),
            "{full:?}"
        );
        let want = if host_tier {
            Hold::Offload
        } else {
            Hold::LetGo
        };
        assert_eq!(full.hold, want, "{full:?}");
    }
}

#[test]
fn a_session_unlikely_to_return_is_let_go() {
    let mut p = parked(40.0, 90.0);
    p.p_return = 0.0;
    let l = decide_for(p, owner(0.95, 100_000.0, levers(Retention::Hold, true)));
    assert_eq!(l.hold, Hold::LetGo, "{l:?}");
}

#[test]
fn the_more_pressure_the_dearer_keeping_is() {
    let p = parked(40.0, 90.0);
    let at =
        |usage| decide_for(p, owner(usage, 100_000.0, levers(Retention::Hold, false))).costs[0];
    assert_eq!(at(0.4), 0.0, "free blocks: holding displaces nothing");
    assert!(at(0.7) < at(0.9), "{} {}", at(0.7), at(0.9));
}

#[test]
fn a_session_already_evicted_is_brought_back_or_let_go_never_kept() {
    let mut p = parked(40.0, 45.0);
    p.resident = false;
    let l = decide_for(p, owner(0.8, 100_000.0, levers(Retention::Touch, false)));
    assert!(l.costs[0].is_infinite(), "{l:?}");
    assert_ne!(l.hold, Hold::Keep);
    assert!(
        (l.costs[3] - 0.95 * 4.0).abs() < 1e-9,
        "let go pays the prefill: {l:?}"
    );
}

#[test]
fn the_horizon_is_the_evictable_pool_over_the_churn() {
    let kv = owner(0.75, 50_000.0, levers(Retention::Touch, false));
    assert!((eviction_horizon_s(&kv) - 5.0).abs() < 1e-9);
    assert!(eviction_horizon_s(&owner(0.5, 0.0, kv.levers)).is_infinite());
}

#[test]
fn prices_come_from_the_roofline_and_the_host_link() {
    let model = ModelSpec::preset("llama-3.1-8b").unwrap();
    let gpu = crate::spec::GpuSpec::preset("h100").unwrap();
    let r = Roofline::new(&gpu, 1, crate::roofline::Efficiency::default());
    let p = Prices::of(&r, &model, 80_000, 8_192, gpu.pcie_gbs * 1e9);
    // An 80K prefill takes seconds; its 10 GB of KV crosses PCIe in a fraction of that;
    // a touch is one step.
    assert!(p.recompute_s > 1.0 && p.recompute_s < 30.0, "{p:?}");
    assert!(p.restore_s < p.recompute_s / 3.0, "{p:?}");
    assert!(p.touch_s < 0.1, "{p:?}");
    assert!(Prices::of(&r, &model, 80_000, 8_192, 0.0)
        .restore_s
        .is_infinite());
}

#[test]
fn churn_is_a_smoothed_rate_seeded_by_its_first_interval() {
    let mut c = Churn::default();
    assert_eq!(c.sample(1_000, 0.0), 0.0, "no interval yet");
    assert_eq!(c.sample(1_010, 0.01), 0.0, "too short to sample");
    assert!((c.sample(5_000, 1.0) - 4_000.0).abs() < 1e-9);
    // A second interval at 14,000/s moves the rate a fifth of the way.
    assert!((c.sample(19_000, 2.0) - 6_000.0).abs() < 1e-9);
    assert_eq!(p_return(0, 0), 0.5);
    assert!((p_return(3, 1) - 4.0 / 6.0).abs() < 1e-12);
}
