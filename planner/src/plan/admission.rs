//! When a step is admitted on a worker, and how much of its cached prefix is still there
//! then: the queue and the prefix as the engine's scheduler will really treat them.
//!
//! The engine (vLLM V1, and the simulated engine's `Scheduler`) admits waiting sequences
//! first come, first served, and only while its KV pool has free blocks for them. A
//! worker whose running sequences hold most of its KV admits nothing new until they
//! finish, however short its prefill queue: the step waits for the KV that the prompts
//! queued ahead of it and its own prompt need beyond the free blocks to be released.
//! Running sequences are preempted when their own growth runs out of blocks; a preempted
//! one goes back to the head of the queue, and its blocks to the most recently freed end
//! of the free list, so it re-admits from cache: what it costs the step is its place in
//! line, which its KV (counted as held by running sequences) carries here.
//!
//! While the step waits, every block allocated for the prompts ahead of it and for the
//! running decodes' growth takes an empty block first, then evicts the least recently
//! freed cached one. A cached prefix of the step's prompt that nobody runs on is one of
//! those; where in that order it sits is unknown, so it is taken to be anywhere in it
//! alike, and the share of it expected to survive is what the plan may count as reused.
//! A copy a migration moves there for the step is not anywhere in that order: it lands
//! as the newest content of the free pool, so the allocations ahead of the step take
//! every older free block before any of it (`Admission::copy_room_tokens`).
//! (Before this, a plan counted every cached token as reused and the compute queue alone
//! as the wait: on decoders whose KV was full the steps that set the p99 waited 3–4× the
//! predicted time and found a tenth of their prefix left.)

use crate::roofline::StepFigures;

use super::PlanWorker;

#[cfg(test)]
thread_local! {
    /// Admissions made on this thread (tests count what a plan prices).
    pub(super) static ADMISSIONS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// What a worker's KV pool means for one step placed there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    /// Seconds until the KV the step needs is free: 0 when it fits now.
    pub memory_wait_s: f64,
    /// Leading prompt tokens of the step expected to still be cached when it is admitted.
    pub surviving_tokens: u64,
    /// KV tokens of a copy landing there now for the step that are still cached when it
    /// is admitted, at most: what is free beyond what is allocated before the step
    /// (`u64::MAX` when the free KV is unknown). The copy is held for the step only while
    /// nothing running needs the blocks (the simulated engine's `add_holding_prefix`:
    /// running work comes first), and it is the newest content of the free pool, so
    /// every allocation ahead of the step evicts an older free block before any of it.
    /// (Priced as exposed as the worker's own cached prefix, anywhere in the eviction
    /// order, moves onto workers whose free KV was a few thousand tokens with 55–180K
    /// queued ahead shipped copies that were all gone at admission: on Qwen3-30B
    /// SWE-smith ×200 on `8h`, seed 7, moves that waited 5–15 s found 7% of their prompts
    /// cached, as moves that shipped nothing did, and 750 GB had been shipped.)
    pub copy_room_tokens: u64,
}

/// How the step is admitted on `w` (`prompt` tokens, `block` tokens per block): the wait
/// for KV and what survives of its cached prefix. A worker whose KV figures or decode
/// lifetime are unknown keeps the old view (no memory wait, every cached token reused).
pub fn admission(w: &PlanWorker, figures: &StepFigures<'_>, prompt: u64, block: u64) -> Admission {
    #[cfg(test)]
    ADMISSIONS.with(|n| n.set(n.get() + 1));
    let memory_wait_s = memory_wait_s(w, prompt);
    let wait_s = w.queue_s.max(memory_wait_s);
    let allocated = w.waiting_tokens + decode_growth_tokens(w, figures, wait_s);
    let surviving_share = survival(w, allocated);
    let block = block.max(1);
    let surviving_tokens = ((w.cached_tokens as f64 * surviving_share) as u64) / block * block;
    Admission {
        memory_wait_s,
        surviving_tokens: surviving_tokens.min(w.cached_tokens),
        copy_room_tokens: w
            .kv_free_tokens
            .map_or(u64::MAX, |free| free.saturating_sub(allocated)),
    }
}

/// `w` as a step of `prompt` tokens will find it at admission: its queue is the longer
/// of the compute queue and the wait for KV, and its cached prefix what survives that
/// wait (`a`, its [`admission`]).
pub fn admitted_view(w: &PlanWorker, a: &Admission) -> PlanWorker {
    // A worker with a host tier (it holds some of the prompt there) offloads what it
    // evicts meanwhile: that stays restorable, in front of what it holds there already.
    let host_cached_tokens = if w.host_cached_tokens > 0 {
        w.host_cached_tokens + (w.cached_tokens - a.surviving_tokens)
    } else {
        0
    };
    PlanWorker {
        queue_s: w.queue_s.max(a.memory_wait_s),
        cached_tokens: a.surviving_tokens,
        host_cached_tokens,
        ..w.clone()
    }
}

/// Seconds until running sequences on `w` have released the KV that the prompts queued
/// there and this step's `prompt` need beyond its free tokens. A deficit up to what they
/// hold waits for it at the rate their ages imply (`PlanWorker::kv_release_per_s`,
/// `kv_release`): a worker held by decodes that have already run long frees its KV more
/// slowly than one whose decodes just began. Without that rate, a running sequence holds
/// its KV for about the observed decode lifetime `L`, and at a random moment the ones
/// running are spread over their lifetimes, so a share `x` of their KV is released
/// within `x · L`: a deficit up to what they hold waits `deficit / held · L`. A deficit
/// beyond that waits for the sequences admitted into the released KV to finish in their
/// turn, a whole pool (`capacity`) per lifetime: `L + (deficit − held) / capacity · L`.
/// (Capping the wait at one lifetime made a worker with five pools' worth of prompts
/// queued look no busier than one with a single pool's worth: on Qwen3-30B SWE-smith
/// sessions, which overload every worker, moves herded onto one worker with 40 steps
/// waiting, planned at 13 s and admitted after 69 s.) A prefill worker's running
/// sequences are prefill legs that end with the compute queue, which `queue_s` carries.
/// The deficit is rounded up to whole running sequences ([`whole_sequences`]): a sequence
/// frees its KV only when it ends, so a step a few blocks short on a worker running two
/// long contexts waits for one of them to end, not for a few blocks' share of a lifetime.
/// (Priced as a fluid, such steps on Qwen3-30B coding-agent sessions, 30–40K-token
/// prompts beside two or three running sequences, were planned at 0.1–0.5 s and waited
/// 2.3–3.8 s for admission.)
fn memory_wait_s(w: &PlanWorker, prompt: u64) -> f64 {
    let (Some(free), Some(capacity), Some(lifetime)) =
        (w.kv_free_tokens, w.kv_capacity_tokens, w.decode_lifetime_s)
    else {
        return 0.0;
    };
    if !w.decodes() || lifetime <= 0.0 {
        return 0.0;
    }
    let deficit = (w.waiting_tokens + prompt).saturating_sub(free);
    let held = capacity.saturating_sub(free);
    if deficit == 0 || held == 0 {
        return 0.0;
    }
    // Seconds for the running decodes to release what they hold of the deficit, in whole
    // sequences: at the rate their ages imply, else what they hold over one lifetime.
    let rate = w
        .kv_release_per_s
        .filter(|r| *r > 0.0)
        .unwrap_or(held as f64 / lifetime);
    let now_running = whole_sequences(deficit.min(held), held, w.decoding) as f64 / rate;
    let later_pools = deficit.saturating_sub(held) as f64 / capacity as f64;
    now_running + later_pools * lifetime
}

/// The KV tokens released by the time `tokens` (≤ `held`) are free, when `running`
/// sequences hold `held` between them: a sequence releases its KV only when it ends, all
/// at once, so the release comes in whole sequences, `held / running` each on average.
fn whole_sequences(tokens: u64, held: u64, running: u64) -> u64 {
    if running == 0 || tokens == 0 {
        return tokens;
    }
    let each = held.div_ceil(running).max(1);
    (tokens.div_ceil(each) * each).min(held)
}

/// KV tokens the sequences decoding on `w` add over `wait_s` seconds: one per sequence
/// per decode step, at the step time of its running batch.
fn decode_growth_tokens(w: &PlanWorker, figures: &StepFigures<'_>, wait_s: f64) -> u64 {
    let running = w.stalled_decodes();
    if running == 0 || wait_s <= 0.0 {
        return 0;
    }
    let step = super::decode::decode_step_s(w, figures, 0, 0);
    if step <= 0.0 {
        return 0;
    }
    ((wait_s / step) * running as f64) as u64
}

/// Share of a cached prefix on `w` that survives `allocated` more KV tokens: they take
/// the empty blocks first (its room beyond what its cache holds), then evict the least
/// recently freed cached blocks, of which the prefix is taken to be anywhere alike.
/// Cached blocks held by running sequences are not evictable; with none evictable (or
/// the pool unknown) everything survives.
fn survival(w: &PlanWorker, allocated: u64) -> f64 {
    let (Some(free), Some(room)) = (w.kv_free_tokens, w.kv_room_tokens) else {
        return 1.0;
    };
    let empty = room.min(free);
    let evictable = free - empty;
    if evictable == 0 || allocated <= empty {
        return 1.0;
    }
    let evicted = (allocated - empty) as f64 / evictable as f64;
    (1.0 - evicted).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{Role, WorkerId};
    use crate::roofline::{Efficiency, Roofline};
    use crate::spec::{GpuSpec, ModelSpec};

    fn model() -> ModelSpec {
        ModelSpec::preset("llama-3.1-8b").unwrap_or_else(|e| panic!("{e}"))
    }

    /// A step of `prompt` tokens admitted on `w`, 16-token blocks.
    fn admit(w: &PlanWorker, prompt: u64) -> Admission {
        admission(w, &StepFigures::of(&model()), prompt, 16)
    }

    /// A decoder with 400K KV tokens, 20 sequences running, decode lifetime 10 s.
    fn decoder(free: u64, room: u64, cached: u64) -> PlanWorker {
        PlanWorker {
            id: WorkerId(1),
            role: Role::Decode,
            healthy: true,
            draining: false,
            roofline: Roofline::new(
                &GpuSpec::preset("h100").unwrap_or_else(|e| panic!("{e}")),
                1,
                Efficiency::default(),
            ),
            step_budget: crate::plan::StepBudget::of(8_192),
            queue_s: 0.0,
            decoding: 20,
            queued: 0,
            cached_tokens: cached,
            host_cached_tokens: 0,
            pulls_kv: true,
            prefill_decodes: false,
            decode_leg_at_dispatch: false,
            pcie_bytes_per_s: 50e9,
            prefill_scale: 1.0,
            kv_room_tokens: Some(room),
            kv_free_tokens: Some(free),
            kv_capacity_tokens: Some(400_000),
            waiting_tokens: 0,
            decode_lifetime_s: Some(10.0),
            kv_release_per_s: None,
            parked_returns_per_s: 0.0,
        }
    }

    #[test]
    fn a_step_that_fits_the_free_kv_waits_for_nothing_and_keeps_its_prefix() {
        let w = decoder(100_000, 50_000, 30_000);
        let a = admit(&w, 40_000);
        assert_eq!(a.memory_wait_s, 0.0);
        assert_eq!(a.surviving_tokens, 30_000);
    }

    #[test]
    fn a_full_decoder_admits_once_running_sequences_release_the_deficit() {
        // 360K held by 20 running sequences (18K each), 40K free; 20K queued ahead + 60K
        // prompt: 40K short, so three sequences must end (54K, 0.15 of the running KV),
        // which takes 0.15 of the lifetime.
        let mut w = decoder(40_000, 0, 0);
        w.waiting_tokens = 20_000;
        let a = admit(&w, 60_000);
        assert!((a.memory_wait_s - 1.5).abs() < 1e-9, "{a:?}");
        // The view the planner prices: the longer of compute queue and memory wait.
        w.queue_s = 3.0;
        let v = admitted_view(&w, &admit(&w, 60_000));
        assert_eq!(v.queue_s, 3.0);
        w.queue_s = 0.2;
        let v = admitted_view(&w, &admit(&w, 60_000));
        assert!((v.queue_s - 1.5).abs() < 1e-9);
    }

    #[test]
    fn kv_is_released_a_whole_sequence_at_a_time() {
        // Two sequences hold 360K (180K each), 40K free; a 42K prompt is 2K short. As a
        // fluid that is 2/360 of a lifetime (56 ms); one of the two must end first: half
        // a lifetime.
        let mut w = decoder(40_000, 0, 0);
        w.decoding = 2;
        let a = admit(&w, 42_000);
        assert!((a.memory_wait_s - 5.0).abs() < 1e-9, "{a:?}");
        // With many short sequences running, the rounding is small.
        w.decoding = 360;
        let a = admit(&w, 42_000);
        assert!(
            (a.memory_wait_s - 10.0 * 2_000.0 / 360_000.0).abs() < 1e-9,
            "{a:?}"
        );
        assert_eq!(whole_sequences(0, 360_000, 2), 0);
        assert_eq!(whole_sequences(2_000, 360_000, 0), 2_000);
        assert_eq!(whole_sequences(200_000, 360_000, 2), 360_000);
    }

    #[test]
    fn prompts_queued_beyond_what_runs_wait_a_lifetime_per_further_pool() {
        // 360K held, 40K free, 700K queued ahead + 60K prompt: 720K short. The running
        // sequences release 360K within a lifetime (10 s); the other 360K waits for the
        // sequences admitted into it, 0.9 of the 400K pool, so 0.9 lifetimes more.
        let mut w = decoder(40_000, 0, 0);
        w.waiting_tokens = 700_000;
        let a = admit(&w, 60_000);
        assert!((a.memory_wait_s - 19.0).abs() < 1e-9, "{a:?}");
        // The wait keeps growing with the queue: a worker with twice as much queued is
        // never priced the same (a cap at one lifetime made them equal, and moves herded
        // onto the longest queue).
        w.waiting_tokens = 1_400_000;
        assert!(admit(&w, 60_000).memory_wait_s > 1.5 * a.memory_wait_s);
    }

    #[test]
    fn without_kv_figures_or_a_lifetime_nothing_changes() {
        let mut w = decoder(1_000, 0, 30_000);
        w.decode_lifetime_s = None;
        w.kv_room_tokens = None;
        let a = admit(&w, 60_000);
        assert_eq!((a.memory_wait_s, a.surviving_tokens), (0.0, 30_000));
        let mut p = decoder(1_000, 0, 0);
        p.role = Role::Prefill;
        assert_eq!(memory_wait_s(&p, 60_000), 0.0);
    }

    #[test]
    fn a_prefix_in_the_evictable_cache_shrinks_with_what_is_allocated_before_it_runs() {
        // 100K free: 20K empty, 80K evictable cached (the step's 32K prefix among them).
        let mut w = decoder(100_000, 20_000, 32_000);
        assert_eq!(survival(&w, 20_000), 1.0);
        assert!((survival(&w, 60_000) - 0.5).abs() < 1e-12);
        assert_eq!(survival(&w, 200_000), 0.0);
        // 60K queued ahead (which fits, so no wait and no decode growth): half the
        // evictable cache goes.
        w.waiting_tokens = 60_000;
        let a = admit(&w, 40_000);
        assert_eq!(a.surviving_tokens, 16_000, "{a:?}");
        // Nothing queued, nothing waited for: all of it is there.
        w.waiting_tokens = 0;
        w.decoding = 0;
        assert_eq!(admit(&w, 40_000).surviving_tokens, 32_000);
    }

    #[test]
    fn a_copy_landing_for_the_step_keeps_what_is_free_beyond_the_queue_ahead() {
        // 100K free, 60K queued ahead (it fits: no wait, no decode growth): a copy keeps
        // at most 40K, whatever the worker's own cache holds.
        let mut w = decoder(100_000, 20_000, 32_000);
        w.waiting_tokens = 60_000;
        assert_eq!(admit(&w, 40_000).copy_room_tokens, 40_000);
        w.waiting_tokens = 150_000;
        assert_eq!(admit(&w, 40_000).copy_room_tokens, 0);
        w.kv_free_tokens = None;
        assert_eq!(admit(&w, 40_000).copy_room_tokens, u64::MAX);
    }

    #[test]
    fn a_longer_wait_lets_the_decodes_evict_more_of_the_prefix() {
        // No empty block: the decodes' growth evicts from the first token.
        let mut w = decoder(100_000, 0, 32_000);
        w.queue_s = 0.1;
        let short = admit(&w, 10_000).surviving_tokens;
        w.queue_s = 5.0;
        let long = admit(&w, 10_000).surviving_tokens;
        assert!(long < short, "{long} vs {short}");
    }
}
