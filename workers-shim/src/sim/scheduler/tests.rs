use std::collections::HashMap;

use ownerserve_planner::hash::XXH3_SEED;
use ownerserve_planner::roofline::Efficiency;
use ownerserve_planner::spec::GpuSpec;

use super::*;

fn config(num_blocks: u32, budget: u32) -> SchedulerConfig {
    SchedulerConfig {
        block_size: 16,
        max_num_batched_tokens: budget,
        long_prefill_token_threshold: 0,
        max_num_seqs: 64,
        num_blocks,
        max_model_len: 131_072,
        hash_seed: XXH3_SEED,
        emit_cache_events: true,
        host_blocks: 0,
        pcie_bytes_per_s: 50e9,
        priority_scheduling: false,
    }
}

fn engine(num_blocks: u32, budget: u32) -> Scheduler {
    let model = ModelSpec::preset("llama-3.1-8b").unwrap();
    let gpu = GpuSpec::preset("h100").unwrap();
    Scheduler::new(
        config(num_blocks, budget),
        model,
        Roofline::new(&gpu, 1, Efficiency::default()),
    )
}

fn seq(id: u64, prompt: Vec<u32>, max_tokens: u32, arrival_s: f64) -> NewSeq {
    NewSeq {
        id: SeqId(id),
        prompt: prompt.into(),
        max_tokens,
        eos_after: None,
        stop: Arc::new([]),
        stream_seed: id,
        arrival_s,
        priority: 0,
    }
}

fn tokens(start: u32, len: u32) -> Vec<u32> {
    (start..start + len).collect()
}

/// What a run observed per sequence, in virtual time.
#[derive(Default, Debug)]
struct Run {
    now: f64,
    first_token_s: HashMap<SeqId, f64>,
    cached: HashMap<SeqId, u32>,
    outputs: HashMap<SeqId, Vec<TokenOut>>,
    steps: Vec<StepOutput>,
}

fn run_to_idle(s: &mut Scheduler, run: &mut Run) {
    let mut guard = 0;
    while !s.is_idle() {
        let out = s.step(run.now);
        // Nothing to compute until a restore lands: the engine waits for it.
        run.now = match (out.time, out.idle_until_s) {
            (None, Some(until)) => until,
            _ => run.now + out.duration_s(),
        };
        for a in &out.admitted {
            run.cached.insert(a.seq, a.cached_tokens);
        }
        for t in &out.tokens {
            run.first_token_s.entry(t.seq).or_insert(run.now);
            run.outputs.entry(t.seq).or_default().push(t.clone());
        }
        run.steps.push(out);
        guard += 1;
        assert!(guard < 100_000, "engine made no progress");
    }
}

#[test]
fn repeated_prefix_hits_the_cache_and_lowers_ttft() {
    let mut s = engine(10_000, 8192);
    let mut run = Run::default();
    let shared = tokens(1000, 4000);
    s.add(seq(1, shared.clone(), 4, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);

    // Same length, one with the cached 4000-token prefix, one cold.
    let mut warm = shared.clone();
    warm.extend(tokens(90_000, 500));
    let cold = tokens(50_000, 4500);
    let t0 = run.now;
    s.add(seq(2, warm, 4, t0)).unwrap();
    run_to_idle(&mut s, &mut run);
    let warm_ttft = run.first_token_s[&SeqId(2)] - t0;
    let t1 = run.now;
    s.add(seq(3, cold, 4, t1)).unwrap();
    run_to_idle(&mut s, &mut run);
    let cold_ttft = run.first_token_s[&SeqId(3)] - t1;

    assert_eq!(run.cached[&SeqId(1)], 0);
    assert_eq!(run.cached[&SeqId(2)], 4000);
    assert_eq!(run.cached[&SeqId(3)], 0);
    assert!(
        warm_ttft < cold_ttft / 3.0,
        "warm {warm_ttft} cold {cold_ttft}"
    );
}

#[test]
fn prefill_time_grows_linearly_with_new_tokens() {
    let model = ModelSpec::preset("llama-3.1-8b").unwrap();
    let gpu = GpuSpec::preset("h100").unwrap();
    let eff = Efficiency::default();
    let flops = Roofline::new(&gpu, 1, eff).flops_per_s();
    let first_step = |len: u32| {
        let mut s = engine(10_000, 16_384);
        s.add(seq(1, tokens(1, len), 1, 0.0)).unwrap();
        let out = s.step(0.0);
        assert_eq!(out.work.prefill_tokens, u64::from(len));
        let t = out.time.unwrap();
        assert!(t.compute_s > t.memory_s, "prefill is compute-bound");
        t.total_s
    };
    for len in [256, 1024, 4096, 8192] {
        // Without the attention term the cost per new token is exactly 2·params / FLOP/s.
        let attention = model.attention_flops_per_pair() * prefill_pairs(len as u64, 0) as f64;
        let linear = first_step(len) - eff.step_overhead_s - attention / flops;
        let per_token = linear / f64::from(len);
        let expected = 2.0 * model.params_active / flops;
        assert!(
            (per_token / expected - 1.0).abs() < 1e-9,
            "{len}: {per_token} vs {expected}"
        );
    }
    // And the attention term stays small at ordinary prompt lengths.
    let (t1, t2, t4) = (first_step(1024), first_step(2048), first_step(4096));
    let (m1, m2) = ((t2 - t1) / 1024.0, (t4 - t2) / 2048.0);
    assert!((m2 / m1 - 1.0).abs() < 0.1, "marginal {m1} vs {m2}");
}

#[test]
fn cached_prefix_pays_prefill_only_for_the_rest() {
    let mut s = engine(10_000, 16_384);
    let mut run = Run::default();
    let prefix = tokens(7, 3200);
    s.add(seq(1, prefix.clone(), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    let mut p = prefix;
    p.extend(tokens(70_000, 320));
    s.add(seq(2, p, 1, run.now)).unwrap();
    let out = s.step(run.now);
    assert_eq!(out.work.prefill_tokens, 320);
    assert_eq!(out.work.prefill_context_tokens, 3200);
}

#[test]
fn decode_step_time_grows_with_batch_kv_bytes() {
    // Eight sequences decode together; compare a decode-only step at two context lengths.
    let decode_step = |prompt_len: u32| {
        let mut s = engine(20_000, 65_536);
        for i in 0..8 {
            s.add(seq(i, tokens(i as u32 * 100_000 + 1, prompt_len), 64, 0.0))
                .unwrap();
        }
        let mut now = 0.0;
        loop {
            let out = s.step(now);
            now += out.duration_s();
            if out.work.prefill_tokens == 0 && out.work.decode_seqs == 8 {
                return out;
            }
        }
    };
    let short = decode_step(1000);
    let long = decode_step(5000);
    let model = ModelSpec::preset("llama-3.1-8b").unwrap();
    let gpu = GpuSpec::preset("h100").unwrap();
    let roofline = Roofline::new(&gpu, 1, Efficiency::default());
    let (ts, tl) = (short.time.unwrap(), long.time.unwrap());
    assert!(
        ts.memory_s > ts.compute_s && tl.memory_s > tl.compute_s,
        "memory-bound"
    );
    let extra_kv_bytes = model.kv_bytes_per_token()
        * (long.work.decode_context_tokens - short.work.decode_context_tokens) as f64;
    let expected = extra_kv_bytes / roofline.bytes_per_s();
    assert!(
        ((tl.total_s - ts.total_s) - expected).abs() < 1e-9,
        "Δt {} vs {}",
        tl.total_s - ts.total_s,
        expected
    );
}

#[test]
fn chunked_prefill_splits_long_prompts_over_steps() {
    let mut s = engine(10_000, 2048);
    s.add(seq(1, tokens(1, 5000), 2, 0.0)).unwrap();
    let chunks: Vec<u64> = (0..3).map(|_| s.step(0.0).work.prefill_tokens).collect();
    assert_eq!(chunks, vec![2048, 2048, 904]);
}

#[test]
fn decodes_and_prefills_share_a_step_within_the_budget() {
    let mut s = engine(10_000, 1024);
    s.add(seq(1, tokens(1, 100), 50, 0.0)).unwrap();
    s.step(0.0);
    s.add(seq(2, tokens(5000, 3000), 5, 0.0)).unwrap();
    let out = s.step(0.0);
    assert_eq!(out.work.decode_seqs, 1);
    assert_eq!(out.work.prefill_tokens, 1023);
}

/// vLLM's `long_prefill_token_threshold`: while another request runs, a long prompt
/// computes at most the threshold per step (the rest of the budget stays unused); alone, it
/// takes the whole budget.
#[test]
fn the_long_prefill_threshold_caps_a_prompt_only_while_others_run() {
    let capped = SchedulerConfig {
        long_prefill_token_threshold: 512,
        ..config(10_000, 8192)
    };
    let mut alone = engine_with(capped.clone());
    alone.add(seq(1, tokens(1, 5000), 2, 0.0)).unwrap();
    assert_eq!(alone.step(0.0).work.prefill_tokens, 5000);

    let mut shared = engine_with(capped);
    shared.add(seq(1, tokens(1, 100), 50, 0.0)).unwrap();
    shared.step(0.0);
    shared.add(seq(2, tokens(5000, 3000), 5, 0.0)).unwrap();
    let steps: Vec<(u64, u64)> = (0..7)
        .map(|_| {
            let w = shared.step(0.0).work;
            (w.decode_seqs, w.prefill_tokens)
        })
        .collect();
    assert_eq!(steps[..5], [(1, 512); 5]);
    assert_eq!(steps[5], (1, 3000 - 5 * 512));
    assert_eq!(steps[6], (2, 0));
}

#[test]
fn max_tokens_eos_and_stop_strings_end_sequences() {
    let mut s = engine(10_000, 8192);
    let mut run = Run::default();
    s.add(seq(1, tokens(1, 40), 7, 0.0)).unwrap();
    let mut eos = seq(2, tokens(1, 40), 100, 0.0);
    eos.eos_after = Some(5);
    s.add(eos).unwrap();
    // The filler passage starts "Lorem ipsum dolor"; stream 0 starts at its first piece.
    let mut stop = seq(3, tokens(1, 40), 100, 0.0);
    stop.stream_seed = 0;
    stop.stop = Arc::new(["dolor".to_owned()]);
    s.add(stop).unwrap();
    run_to_idle(&mut s, &mut run);

    let last = |id| run.outputs[&SeqId(id)].last().unwrap().clone();
    assert_eq!(run.outputs[&SeqId(1)].len(), 7);
    assert_eq!(last(1).finish, Some(FinishReason::Length));
    assert_eq!(run.outputs[&SeqId(2)].len(), 5);
    assert_eq!(last(2).finish, Some(FinishReason::Stop));
    let text: String = run.outputs[&SeqId(3)]
        .iter()
        .map(|t| t.text.as_str())
        .collect();
    assert_eq!(text, "Lorem ipsum ");
    assert_eq!(last(3).finish, Some(FinishReason::Stop));
}

#[test]
fn preemption_under_memory_pressure_still_finishes_everything() {
    // 20 blocks of 16 tokens: two 150-token sequences growing to 250 cannot both fit.
    let mut s = engine(20, 8192);
    let mut run = Run::default();
    s.add(seq(1, tokens(1, 150), 100, 0.0)).unwrap();
    s.add(seq(2, tokens(10_000, 150), 100, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    assert!(run.steps.iter().map(|o| o.preempted).sum::<u32>() > 0);
    assert_eq!(run.outputs[&SeqId(1)].len(), 100);
    assert_eq!(run.outputs[&SeqId(2)].len(), 100);
    assert_eq!(s.pool().num_free(), 20, "all blocks returned");
}

fn with_priority(mut n: NewSeq, priority: i32) -> NewSeq {
    n.priority = priority;
    n
}

#[test]
fn priority_scheduling_admits_lower_values_first_and_fcfs_ignores_them() {
    // One sequence runs at a time; all four wait at the first step. With priority, the one
    // marked -1 (a returning agent step) is admitted before the three that came earlier.
    let first_tokens = |priority_scheduling: bool| {
        let mut s = engine_with(SchedulerConfig {
            max_num_seqs: 1,
            priority_scheduling,
            ..config(400, 8192)
        });
        s.add(seq(1, tokens(1, 100), 4, 0.0)).unwrap();
        s.add(seq(2, tokens(1_000, 100), 4, 0.1)).unwrap();
        s.add(seq(3, tokens(2_000, 100), 4, 0.2)).unwrap();
        s.add(with_priority(seq(4, tokens(3_000, 100), 4, 0.3), -1))
            .unwrap();
        let mut run = Run::default();
        run_to_idle(&mut s, &mut run);
        let mut order: Vec<(u64, f64)> =
            run.first_token_s.iter().map(|(id, t)| (id.0, *t)).collect();
        order.sort_by(|a, b| a.1.total_cmp(&b.1));
        order.into_iter().map(|(id, _)| id).collect::<Vec<_>>()
    };
    assert_eq!(first_tokens(true), [4, 1, 2, 3]);
    assert_eq!(first_tokens(false), [1, 2, 3, 4]);
}

#[test]
fn under_priority_a_preemption_takes_the_largest_priority_not_the_newest() {
    // 20 blocks: two sequences growing to 250 tokens cannot both fit. Under fcfs the
    // newest (2) is preempted; under priority the one marked 5 (1), although older.
    let preempted_first = |priority_scheduling: bool| {
        let mut s = engine_with(SchedulerConfig {
            priority_scheduling,
            ..config(20, 8192)
        });
        s.add(with_priority(seq(1, tokens(1, 150), 100, 0.0), 5))
            .unwrap();
        s.add(seq(2, tokens(10_000, 150), 100, 0.1)).unwrap();
        let mut run = Run::default();
        run_to_idle(&mut s, &mut run);
        assert_eq!(run.outputs[&SeqId(1)].len(), 100);
        assert_eq!(run.outputs[&SeqId(2)].len(), 100);
        // Whoever was preempted finishes last.
        let done = |id: u64| {
            run.steps
                .iter()
                .position(|o| {
                    o.tokens
                        .iter()
                        .any(|t| t.seq == SeqId(id) && t.finish.is_some())
                })
                .unwrap()
        };
        if done(1) > done(2) {
            1
        } else {
            2
        }
    };
    assert_eq!(preempted_first(false), 2);
    assert_eq!(preempted_first(true), 1);
}

#[test]
fn abort_frees_blocks_and_oversized_requests_are_refused() {
    let mut s = engine(100, 8192);
    s.add(seq(1, tokens(1, 500), 10, 0.0)).unwrap();
    s.step(0.0);
    assert!(s.pool().num_free() < 100);
    assert!(s.abort(SeqId(1)));
    assert_eq!(s.pool().num_free(), 100);
    assert!(s.is_idle());
    assert!(matches!(
        s.add(seq(2, tokens(1, 2000), 10, 0.0)),
        Err(AdmitError::ExceedsCache { .. })
    ));
    assert!(matches!(
        s.config().check(131_000, 1000),
        Err(AdmitError::TooLong { .. })
    ));
}

#[test]
fn a_prompt_waits_until_all_of_it_fits_and_evicts_nothing_meanwhile() {
    // vLLM 0.32 (`scheduler_reserve_full_isl`): a 20-block prompt chunked 4 blocks a step is
    // admitted only once 20 blocks are free; a refused admission touches no cached block.
    let mut s = engine(24, 64);
    let mut run = Run::default();
    s.add(seq(1, tokens(1, 64), 1, 0.0)).unwrap(); // 4 cached blocks, then free
    run_to_idle(&mut s, &mut run);
    s.add(seq(2, tokens(1000, 16 * 8), 200, 0.0)).unwrap(); // holds 8 blocks, then 20
    s.step(run.now);
    s.step(run.now);
    s.add(seq(3, tokens(5000, 16 * 20), 1, 0.0)).unwrap();
    let out = s.step(run.now);
    assert!(out.admitted.is_empty(), "20 blocks do not fit beside 9");
    assert!(
        out.cache_events.is_empty(),
        "a refused admission evicts nothing: {:?}",
        out.cache_events
    );
    assert_eq!(s.pool().holding(), 4 + 8);
}

#[test]
fn cache_events_report_stored_chains_and_evictions_in_order() {
    // 8 blocks of 16 tokens: a 64-token prompt fills 4, a second unrelated one evicts.
    let mut s = engine(8, 8192);
    let mut run = Run::default();
    s.add(seq(1, tokens(1, 64), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    let events: Vec<CacheEvent> = run
        .steps
        .iter()
        .flat_map(|o| o.cache_events.clone())
        .collect();
    let hashes = ownerserve_planner::hash::prompt_hashes(&tokens(1, 64), 16, XXH3_SEED);
    assert_eq!(
        events,
        vec![CacheEvent::Stored {
            hashes: hashes.clone(),
            parent: None,
            tokens: tokens(1, 64),
        }]
    );
    let mut run2 = Run::default();
    s.add(seq(2, tokens(500, 100), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run2);
    let events: Vec<CacheEvent> = run2
        .steps
        .iter()
        .flat_map(|o| o.cache_events.clone())
        .collect();
    let CacheEvent::Removed { hashes: evicted } = &events[0] else {
        panic!("{events:?}")
    };
    assert!(!evicted.is_empty() && evicted.iter().all(|h| hashes.contains(h)));
    assert!(matches!(events[1], CacheEvent::Stored { parent: None, .. }));
    assert_eq!(s.reset_prefix_cache(), Some(CacheEvent::Cleared));
}

fn engine_with(cfg: SchedulerConfig) -> Scheduler {
    let model = ModelSpec::preset("llama-3.1-8b").unwrap();
    let gpu = GpuSpec::preset("h100").unwrap();
    Scheduler::new(cfg, model, Roofline::new(&gpu, 1, Efficiency::default()))
}

fn assert_evicts_nothing(update: &CacheUpdate) {
    assert!(
        update
            .events
            .iter()
            .all(|e| !matches!(e, CacheEvent::Removed { .. })),
        "{:?}",
        update.events
    );
}

fn hashes_of(tokens: &[u32]) -> Vec<u64> {
    ownerserve_planner::hash::prompt_hashes(tokens, 16, XXH3_SEED)
}

#[test]
fn received_blocks_are_announced_and_hit_like_computed_ones() {
    let mut s = engine(64, 8192);
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    let update = s.insert_cached(None, &hashes, &prompt);
    assert_eq!(
        update,
        CacheUpdate {
            blocks: 4,
            events: vec![CacheEvent::Stored {
                hashes: hashes.clone(),
                parent: None,
                tokens: prompt.clone(),
            }],
        }
    );
    assert_eq!(s.cached_prefix(&hashes), 4);
    assert_eq!(
        s.pool().num_free(),
        64,
        "received blocks are cached, not in use"
    );
    // Inserting again stores nothing new.
    assert_eq!(s.insert_cached(None, &hashes, &prompt).events, vec![]);

    let mut run = Run::default();
    let mut longer = prompt.clone();
    longer.push(7);
    s.add(seq(1, longer, 1, 0.0)).unwrap();
    // The whole prompt cached: the last token is still computed, so one block is redone.
    s.add(seq(2, prompt.clone(), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    assert_eq!(run.cached[&SeqId(1)], 64);
    assert_eq!(run.cached[&SeqId(2)], 48);
    let stored: Vec<&CacheEvent> = run
        .steps
        .iter()
        .flat_map(|o| &o.cache_events)
        .filter(|e| matches!(e, CacheEvent::Stored { .. }))
        .collect();
    // The recomputed last block is a second copy, announced as vLLM 0.32 announces it.
    assert_eq!(
        stored,
        vec![&CacheEvent::Stored {
            hashes: vec![hashes[3]],
            parent: Some(hashes[2]),
            tokens: prompt[48..].to_vec(),
        }],
        "only the recomputed copy is stored again"
    );
}

#[test]
fn received_blocks_chain_under_the_given_parent_and_runs_split_at_known_blocks() {
    let mut s = engine(64, 8192);
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    s.insert_cached(None, &hashes[..1], &prompt[..16]);
    s.insert_cached(Some(hashes[0]), &hashes[1..2], &prompt[16..32]);
    let update = s.insert_cached(Some(hashes[0]), &hashes[1..], &prompt[16..]);
    assert_eq!(update.blocks, 3);
    assert_eq!(
        update.events,
        vec![CacheEvent::Stored {
            hashes: hashes[2..].to_vec(),
            parent: Some(hashes[1]),
            tokens: prompt[32..].to_vec(),
        }]
    );
    let run = s.read_cached(&hashes[1..]);
    assert_eq!(
        run,
        CachedRun {
            blocks: 3,
            parent: Some(hashes[0]),
            tokens: prompt[16..].to_vec(),
        }
    );
    assert_eq!(s.read_cached(&hashes).blocks, 4);
}

#[test]
fn received_blocks_hang_only_under_a_parent_held_here_and_never_evict_it() {
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    // The parent is not cached here: nothing is, and nothing is announced under it.
    let mut s = engine(64, 8192);
    assert_eq!(
        s.insert_cached(Some(hashes[0]), &hashes[1..], &prompt[16..]),
        CacheUpdate::default()
    );
    assert_eq!(s.cached_prefix(&hashes), 0);
    // Two blocks, the parent the least recently freed: room is made elsewhere or not at
    // all, and the parent stays.
    let mut s = engine(2, 8192);
    s.insert_cached(None, &hashes[..1], &prompt[..16]);
    let update = s.insert_cached(Some(hashes[0]), &hashes[1..], &prompt[16..]);
    assert_eq!(update.blocks, 1, "one free block besides the parent");
    assert_evicts_nothing(&update);
    assert_eq!(s.cached_prefix(&hashes), 2);
}

#[test]
fn insert_stops_when_every_block_is_held_and_evicts_lru_first() {
    let mut s = engine(4, 8192);
    let old = tokens(900, 64);
    let old_hashes = hashes_of(&old);
    s.insert_cached(None, &old_hashes, &old);
    let pinned = s.pin(&old_hashes[..1]);
    let prompt = tokens(1, 96);
    let hashes = hashes_of(&prompt);
    let update = s.insert_cached(None, &hashes, &prompt);
    assert_eq!(
        update.blocks, 3,
        "one block is pinned: three fit, as a prefix"
    );
    // The tail of the old chain goes first (it was released first).
    let tail_first: Vec<u64> = old_hashes[1..].iter().rev().copied().collect();
    assert_eq!(update.events[0], CacheEvent::Removed { hashes: tail_first });
    assert_eq!(s.cached_prefix(&hashes), 3);
    s.unpin(&pinned);
    assert_eq!(s.pool().num_free(), 4);
}

#[test]
fn a_reservation_evicts_when_the_copy_starts_and_the_copy_lands_in_it() {
    let mut s = engine(4, 8192);
    let old = tokens(900, 64);
    let old_hashes = hashes_of(&old);
    s.insert_cached(None, &old_hashes, &old);
    let (reserved, events) = s.reserve(2);
    assert_eq!(reserved.len(), 2);
    // Two cached blocks go when the copy starts, the chain's tail first.
    let tail: Vec<u64> = old_hashes[2..].iter().rev().copied().collect();
    assert_eq!(events, vec![CacheEvent::Removed { hashes: tail }]);
    assert_eq!(s.pool().num_free(), 2, "held while in flight");
    assert_eq!(s.reserve(3).0.len(), 2, "no more than is free");
    let mut s = engine(4, 8192);
    s.insert_cached(None, &old_hashes, &old);
    let (reserved, _) = s.reserve(2);
    s.unreserve(&reserved);
    let prompt = tokens(1, 32);
    let hashes = hashes_of(&prompt);
    let update = s.insert_cached(None, &hashes, &prompt);
    // The copy fills the reserved blocks: nothing more is evicted.
    assert_eq!(update.blocks, 2);
    assert_evicts_nothing(&update);
    assert_eq!(s.cached_prefix(&old_hashes), 2);
}

#[test]
fn drop_evicts_only_blocks_nobody_holds() {
    let mut s = engine(64, 8192);
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    s.insert_cached(None, &hashes, &prompt);
    let pinned = s.pin(&hashes[..1]);
    assert_eq!(pinned.len(), 1);
    let update = s.drop_cached(&[hashes[0], hashes[2], hashes[3], 12345]);
    assert_eq!(
        update,
        CacheUpdate {
            blocks: 2,
            events: vec![CacheEvent::Removed {
                hashes: vec![hashes[3], hashes[2]]
            }],
        }
    );
    assert_eq!(s.cached_prefix(&hashes), 2);
    s.unpin(&pinned);
    assert_eq!(
        s.drop_cached(&hashes[..1]).blocks,
        0,
        "block 1 hangs under block 0"
    );
    assert_eq!(s.drop_cached(&hashes[..2]).blocks, 2);
    assert_eq!(s.cached_prefix(&hashes), 0);
}

#[test]
fn a_pin_keeps_blocks_through_memory_pressure() {
    let mut s = engine(8, 8192);
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    s.insert_cached(None, &hashes, &prompt);
    let pinned = s.pin(&hashes);
    assert_eq!(pinned.len(), 4);
    let mut run = Run::default();
    // Needs the 4 other blocks; would evict the received ones without the pin.
    s.add(seq(1, tokens(500, 60), 4, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    assert_eq!(s.cached_prefix(&hashes), 4);
    s.unpin(&pinned);
    s.add(seq(2, tokens(700, 100), 4, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    assert!(
        s.cached_prefix(&hashes) < 4,
        "unpinned blocks are evictable again"
    );
}

/// One sequence at a time: X1 runs and frees its blocks after the received ones, X2 then
/// needs four blocks, and Y (the receiver) is admitted last.
fn received_hits_after_newer_frees(hold: bool) -> u32 {
    let mut s = engine_with(SchedulerConfig {
        max_num_seqs: 1,
        ..config(8, 8192)
    });
    let prompt = tokens(1, 64);
    s.insert_cached(None, &hashes_of(&prompt), &prompt);
    s.add(seq(1, tokens(500, 16), 1, 0.0)).unwrap();
    s.add(seq(2, tokens(700, 16), 40, 0.0)).unwrap();
    let mut y_prompt = prompt.clone();
    y_prompt.push(99);
    let y = seq(3, y_prompt, 1, 0.0);
    if hold {
        s.add_holding_prefix(y).unwrap();
    } else {
        s.add(y).unwrap();
    }
    let mut run = Run::default();
    run_to_idle(&mut s, &mut run);
    run.cached[&SeqId(3)]
}

#[test]
fn a_held_prefix_outlives_blocks_freed_after_it() {
    assert_eq!(received_hits_after_newer_frees(true), 64);
    assert!(received_hits_after_newer_frees(false) < 64);
}

#[test]
fn held_prefixes_give_way_to_running_work_instead_of_starving_it() {
    let mut s = engine_with(SchedulerConfig {
        max_num_seqs: 1,
        ..config(8, 8192)
    });
    let prompt = tokens(1, 64);
    s.insert_cached(None, &hashes_of(&prompt), &prompt);
    // X alone needs all 8 blocks, so Y's hold (4 blocks) must be let go.
    s.add(seq(1, tokens(500, 16), 112, 0.0)).unwrap();
    let mut y_prompt = prompt.clone();
    y_prompt.push(99);
    s.add_holding_prefix(seq(2, y_prompt, 1, 0.0)).unwrap();
    let mut run = Run::default();
    run_to_idle(&mut s, &mut run);
    assert_eq!(run.outputs[&SeqId(1)].len(), 112);
    assert_eq!(run.outputs[&SeqId(2)].len(), 1);
    assert_eq!(s.pool().num_free(), 8);
}

#[test]
fn aborting_a_waiting_holder_releases_its_prefix() {
    let mut s = engine(8, 8192);
    let prompt = tokens(1, 64);
    s.insert_cached(None, &hashes_of(&prompt), &prompt);
    s.add_holding_prefix(seq(1, prompt.clone(), 1, 0.0))
        .unwrap();
    assert_eq!(s.pool().num_free(), 4);
    assert!(s.abort(SeqId(1)));
    assert_eq!(s.pool().num_free(), 8);
}

/// Prompt A (4,000 tokens) runs, prompt B (4,000 others) evicts most of it from a 300-block
/// HBM, then A plus 500 new tokens returns. Returns (A's return: TTFT, admission, its
/// step's events).
fn evicted_prefix_returns(host_blocks: u32) -> (f64, Admission, Vec<StepOutput>) {
    let mut s = engine_with(SchedulerConfig {
        host_blocks,
        ..config(300, 8192)
    });
    let mut run = Run::default();
    let a = tokens(1, 4000);
    s.add(seq(1, a.clone(), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    s.add(seq(2, tokens(100_000, 4000), 1, run.now)).unwrap();
    run_to_idle(&mut s, &mut run);
    assert!(s.cached_prefix(&hashes_of(&a)) < 100, "B evicted A");
    let mut back = a.clone();
    back.extend(tokens(200_000, 500));
    let t0 = run.now;
    let first = run.steps.len();
    s.add(seq(3, back, 1, t0)).unwrap();
    run_to_idle(&mut s, &mut run);
    let admission = run.steps[first..]
        .iter()
        .flat_map(|o| o.admitted.iter())
        .find(|x| x.seq == SeqId(3))
        .copied()
        .unwrap();
    let steps = run.steps.split_off(0);
    (run.first_token_s[&SeqId(3)] - t0, admission, steps)
}

#[test]
fn an_evicted_prefix_restores_from_the_host_tier_faster_than_it_recomputes() {
    let (restored_ttft, got, steps) = evicted_prefix_returns(1000);
    let (recompute_ttft, cold, _) = evicted_prefix_returns(0);
    assert_eq!(got.cached_tokens, 4000, "{got:?}");
    assert!(got.restored_tokens >= 3000, "{got:?}");
    assert_eq!(cold.restored_tokens, 0);
    assert!(cold.cached_tokens < 1600, "{cold:?}");
    assert!(
        restored_ttft < recompute_ttft * 0.5,
        "restore {restored_ttft} s vs recompute {recompute_ttft} s"
    );
    // The restore takes one step overhead plus its bytes over PCIe, and the request waits
    // for it; the step that admits it does not.
    let restoring = steps.iter().find(|o| o.restored_tokens > 0).unwrap();
    let bytes = restoring.restored_tokens as f64 * 131_072.0;
    let overhead = Efficiency::default().step_overhead_s;
    assert!((restoring.restore_s - (overhead + bytes / 50e9)).abs() < 1e-12);
    assert!(restoring.idle_until_s.is_some());
    assert!(
        restored_ttft >= restoring.restore_s,
        "{restored_ttft} {}",
        restoring.restore_s
    );
    // Offloads are announced before the HBM removals of the same blocks.
    let events: Vec<&CacheEvent> = steps.iter().flat_map(|o| &o.cache_events).collect();
    let host_at = events
        .iter()
        .position(|e| matches!(e, CacheEvent::HostStored { .. }))
        .unwrap();
    let removed_at = events
        .iter()
        .position(|e| matches!(e, CacheEvent::Removed { .. }))
        .unwrap();
    assert!(host_at < removed_at);
}

#[test]
fn a_restore_makes_its_request_wait_while_the_batch_decodes_on() {
    // A decode runs; a returning prompt restores 3,000+ tokens from the host tier. The
    // decode's steps keep their pace (no step carries the copy); the prompt computes only
    // once its copy has landed.
    let cfg = SchedulerConfig {
        host_blocks: 1000,
        ..config(300, 8192)
    };
    let mut s = engine_with(cfg);
    let mut run = Run::default();
    let a = tokens(1, 4000);
    s.add(seq(1, a.clone(), 1, 0.0)).unwrap();
    run_to_idle(&mut s, &mut run);
    s.add(seq(2, tokens(100_000, 4000), 1, run.now)).unwrap();
    run_to_idle(&mut s, &mut run);
    s.add(seq(9, tokens(500_000, 50), 400, run.now)).unwrap();
    let out = s.step(run.now);
    run.now += out.duration_s();
    let mut back = a.clone();
    back.extend(tokens(200_000, 100));
    s.add(seq(3, back, 1, run.now)).unwrap();
    let mut restore_s = 0.0;
    let mut longest_decode_step: f64 = 0.0;
    let mut first_compute = None;
    let t0 = run.now;
    while !s.is_idle() {
        let out = s.step(run.now);
        restore_s = f64::max(restore_s, out.restore_s);
        if out.work.decode_seqs > 0 && out.work.prefill_tokens == 0 {
            longest_decode_step = longest_decode_step.max(out.duration_s());
        }
        if first_compute.is_none() && out.tokens.iter().any(|t| t.seq == SeqId(3)) {
            first_compute = Some(run.now - t0);
        }
        run.now = match (out.time, out.idle_until_s) {
            (None, Some(until)) => until,
            _ => run.now + out.duration_s(),
        };
    }
    assert!(restore_s > 0.0, "it restored");
    assert!(
        longest_decode_step < restore_s,
        "no decode step carries the copy: {longest_decode_step} vs {restore_s}"
    );
    assert!(
        first_compute.unwrap() >= restore_s,
        "{first_compute:?} vs {restore_s}"
    );
}

#[test]
fn a_dropped_tail_goes_to_the_host_tier_and_comes_back() {
    let mut s = engine_with(SchedulerConfig {
        host_blocks: 64,
        ..config(64, 8192)
    });
    let prompt = tokens(1, 64);
    let hashes = hashes_of(&prompt);
    s.insert_cached(None, &hashes, &prompt);
    let update = s.drop_cached(&hashes[2..]);
    assert_eq!(update.blocks, 2);
    assert_eq!(
        update.events,
        vec![
            CacheEvent::HostStored {
                hashes: vec![hashes[3], hashes[2]]
            },
            CacheEvent::Removed {
                hashes: vec![hashes[3], hashes[2]]
            },
        ]
    );
    assert_eq!(s.cached_prefix(&hashes), 2);
    assert_eq!(s.host_cached_after(&hashes, 2), 2);
    let mut back = prompt.clone();
    back.push(7);
    s.add(seq(1, back, 1, 0.0)).unwrap();
    let out = s.step(0.0);
    assert_eq!(out.admitted[0].cached_tokens, 64);
    assert_eq!(out.admitted[0].restored_tokens, 32);
    // Its copy runs first; it computes its one new token once the copy has landed.
    assert_eq!(out.work.prefill_tokens, 0);
    let landed = out.idle_until_s.expect("a restore under way");
    assert_eq!(s.step(landed / 2.0).work.prefill_tokens, 0, "still copying");
    assert_eq!(s.step(landed).work.prefill_tokens, 1);
}
