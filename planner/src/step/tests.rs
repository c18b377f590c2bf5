use super::*;
use crate::policy::{Decision, Dispatch, PrefillCharge};

fn counts(l: &Ledger) -> (u32, u64, u64, u64, u32) {
    let mut v = WorkerView::idle(WorkerId(0), Role::Hybrid);
    l.fill(&mut v);
    (
        v.in_flight,
        v.active_blocks,
        v.active_prefill_tokens,
        v.active_compute_tokens,
        v.legs_heading,
    )
}

#[test]
fn the_ledger_counts_a_request_from_start_to_end() {
    let l = Ledger::default();
    // 320 tokens of KV to allocate, 120 of them to compute (the rest moved in).
    let charge = PrefillCharge {
        tokens: 320,
        computed: 120,
    };
    let mut c = l.start(10, charge);
    assert_eq!(counts(&l), (1, 10, 320, 120, 0));
    // A move that fell back computes all it lacks.
    l.recharge(&mut c, PrefillCharge::computed(320));
    assert_eq!(counts(&l), (1, 10, 320, 320, 0));
    l.prefill_done(&mut c);
    l.prefill_done(&mut c);
    assert_eq!(counts(&l), (1, 10, 0, 0, 0));
    // Heading is counted once, however many legs it passes through.
    l.heading(&mut c);
    l.heading(&mut c);
    assert_eq!(counts(&l).4, 1);
    l.arrived(&mut c);
    l.arrived(&mut c);
    assert_eq!(counts(&l).4, 0);
    l.heading(&mut c);
    l.end(c);
    assert_eq!(counts(&l), (0, 0, 0, 0, 0));
}

#[test]
fn a_request_and_its_prefill_leg_are_charged_as_the_planner_says() {
    let l = Ledger::default();
    let single = Decision::single(WorkerId(1));
    let c = l.start_request(&single, 4, 60, 16);
    assert_eq!(c.prefill(), PrefillCharge::of(&single, 60, 16));
    assert_eq!(counts(&l), (1, 4, 44, 44, 0));
    l.end(c);
    let disagg = Decision {
        worker: WorkerId(1),
        dispatch: Dispatch::Disaggregated {
            prefill: WorkerId(0),
        },
        plan: None,
    };
    // Whole blocks of KV, the prompt's own length computed.
    let leg = l.start_prefill_leg(&disagg, 4, 16, 60);
    assert_eq!(counts(&l), (1, 4, 64, 60, 0));
    l.end(leg);
    assert_eq!(counts(&l), (0, 0, 0, 0, 0));
    assert!(Ledger::heads_first(disagg.dispatch));
    assert!(!Ledger::heads_first(Dispatch::Fetch {
        source: WorkerId(0),
        tokens: 16
    }));
}

#[test]
fn decode_ages_are_counted_once_per_window_and_kept_true_as_streams_come_and_go() {
    let t0 = 100.0;
    let later = |ms: u64| t0 + ms as f64 / 1e3;
    let mut d = Decodes::new(0.05);
    let old = d.start(t0, 100);
    let at_10s = d.ages(later(10_000), 1.0);
    let mut expected = DecodeAges::default();
    expected.add(10.0, 100);
    assert_eq!(at_10s, expected);
    // Within the window the count stands, with streams that start or end since.
    let young = d.start(later(10_010), 7);
    expected.add(0.0, 7);
    assert_eq!(d.ages(later(10_020), 1.0), expected);
    d.end(old);
    d.end(old);
    expected.remove(10.0, 100);
    assert_eq!(d.ages(later(10_030), 1.0), expected);
    // After it, or in another time scale, it is counted anew.
    let mut recount = DecodeAges::default();
    recount.add(4.0 * 0.02, 7);
    assert_eq!(d.ages(later(10_030), 4.0), recount);
    let mut recount = DecodeAges::default();
    recount.add(1.0, 7);
    assert_eq!(d.ages(later(11_010), 1.0), recount);
    d.end(young);
    assert_eq!(d.ages(later(11_020), 1.0).total(), 0);
}

#[test]
fn without_a_window_decode_ages_are_counted_at_every_read() {
    let mut d = Decodes::new(0.0);
    d.start(0.0, 10);
    let mut expected = DecodeAges::default();
    expected.add(1.0, 10);
    assert_eq!(d.ages(1.0, 1.0), expected);
    let mut expected = DecodeAges::default();
    expected.add(30.0, 10);
    assert_eq!(d.ages(30.0, 1.0), expected);
}

#[test]
fn the_route_request_reads_the_directory_only_for_policies_that_use_it() {
    let step = StepInput {
        model: "m",
        prompt_tokens: 40,
        block_size: 16,
        session: Some("s1"),
        now_ms: 7,
        samples: 2,
        fork: true,
    };
    let owned = Owned {
        owner: Some(WorkerId(0)),
        artifact: Some(ArtifactView {
            owner: WorkerId(0),
            tokens: 32,
        }),
    };
    let r = route_request(step, owned, Needs::ALL);
    assert_eq!(
        (r.model, r.prompt_tokens, r.block_size, r.session, r.now_ms),
        ("m", 40, 16, Some("s1"), 7)
    );
    assert_eq!(
        (r.decode_owner, r.artifact, r.samples, r.fork),
        (owned.owner, owned.artifact, 2, true)
    );
    let blind = Needs {
        directory: false,
        ..Needs::ALL
    };
    let r = route_request(step, owned, blind);
    assert_eq!((r.decode_owner, r.artifact), (None, None));
}

/// Sources that answer with fixed values and count what was read.
struct Fixed {
    reads: Vec<&'static str>,
}

impl ViewSources for Fixed {
    fn decode_ages(&mut self, at: usize, _: &WorkerView) -> DecodeAges {
        self.reads.push("ages");
        let mut a = DecodeAges::default();
        a.add(1.0, at as u64 + 1);
        a
    }

    fn fill_cached(&mut self, views: &mut [WorkerView]) {
        self.reads.push("cached");
        for v in views {
            v.cached_blocks = 3;
        }
    }

    fn fill_parked_returns(&mut self, views: &mut [WorkerView]) {
        self.reads.push("parked");
        for v in views {
            v.parked_returns_per_s = 0.5;
        }
    }
}

#[test]
fn views_are_completed_only_with_the_sources_a_policy_reads() {
    let ledger = Ledger::default();
    let c = ledger.start(2, PrefillCharge::computed(5));
    let facts = WorkerFacts {
        id: WorkerId(4),
        role: Role::Decode,
        healthy: true,
        draining: false,
        pulls_kv: true,
        prefill_decodes: false,
        decode_leg_at_dispatch: true,
    };
    let base = worker_view(facts, None, &ledger);
    assert_eq!(
        (
            base.id,
            base.in_flight,
            base.active_blocks,
            base.active_prefill_tokens
        ),
        (WorkerId(4), 1, 2, 5)
    );
    let mut views = [base, base];
    let mut none = Fixed { reads: Vec::new() };
    let nothing = Needs {
        prefix_match: false,
        directory: false,
        decode_ages: false,
    };
    complete_views(&mut views, nothing, &mut none);
    assert!(none.reads.is_empty());
    assert_eq!(views, [base, base]);
    let mut all = Fixed { reads: Vec::new() };
    complete_views(&mut views, Needs::ALL, &mut all);
    assert_eq!(all.reads, ["ages", "ages", "cached", "parked"]);
    assert_eq!(
        views.map(|v| (
            v.decode_ages.total(),
            v.cached_blocks,
            v.parked_returns_per_s
        )),
        [(1, 3, 0.5), (2, 3, 0.5)]
    );
    ledger.end(c);
}

#[test]
fn what_is_in_flight_folds_into_the_scraped_kv_usage() {
    let mut v = WorkerView {
        active_blocks: 50,
        load: Some(EngineLoad {
            kv_usage: 0.25,
            ..EngineLoad::default()
        }),
        ..WorkerView::idle(WorkerId(0), Role::Hybrid)
    };
    predict_kv_usage(&mut v, 16, 1600, 400);
    let load = v.load.expect("load");
    assert_eq!(load.kv_usage, 0.5, "in flight: 800 of 1600 tokens");
    assert_eq!(
        (
            load.kv_room_tokens,
            load.kv_free_tokens,
            load.kv_capacity_tokens
        ),
        (Some(1200), Some(800), Some(1600))
    );
    let mut unloaded = WorkerView::idle(WorkerId(0), Role::Hybrid);
    predict_kv_usage(&mut unloaded, 16, 1600, 400);
    assert_eq!(unloaded.load, None);
}
