//! The in-flight ledger: what a shell has sent a worker and not seen finish. Counters are
//! atomics (relaxed: each is a count read on its own, never a lock), so the router's
//! request path shares one ledger per worker without a lock, and the simulator keeps the
//! same one in a single thread.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::policy::{Decision, Dispatch, PrefillCharge, WorkerView};

/// Per-worker counts of the requests in flight there (`WorkerView::in_flight`,
/// `active_blocks`, `active_prefill_tokens`, `active_compute_tokens`, `legs_heading`).
#[derive(Debug, Default)]
pub struct Ledger {
    in_flight: AtomicU32,
    active_blocks: AtomicU64,
    active_prefill_tokens: AtomicU64,
    /// Of those, the tokens the worker computes itself.
    active_compute_tokens: AtomicU64,
    /// Steps decoding there whose prefill leg or KV copy still runs.
    legs_heading: AtomicU32,
    /// Prompt tokens ever charged as computed there: new KV written, which turns its LRU
    /// over (`lifecycle::OwnerKv::churn_tokens_per_s`, as a rate of this).
    computed_total: AtomicU64,
}

/// What one request is counted for in its worker's [`Ledger`]; given back to the ledger
/// when the request ends ([`Ledger::end`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[must_use = "a charge is counted until it is ended"]
pub struct Charged {
    blocks: u64,
    /// Its prefill still pending there (taken at the first token).
    prefill: PrefillCharge,
    /// Counted in the worker's `legs_heading`.
    heading: bool,
}

impl Charged {
    /// The prefill still counted against the worker.
    pub fn prefill(&self) -> PrefillCharge {
        self.prefill
    }
}

impl Ledger {
    /// Requests in flight there.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// KV blocks of the requests in flight there (the shell's prediction).
    pub fn active_blocks(&self) -> u64 {
        self.active_blocks.load(Ordering::Relaxed)
    }

    /// Sets the view's in-flight counts from the ledger.
    pub fn fill(&self, v: &mut WorkerView) {
        v.in_flight = self.in_flight();
        v.active_blocks = self.active_blocks();
        v.active_prefill_tokens = self.active_prefill_tokens.load(Ordering::Relaxed);
        v.active_compute_tokens = self.active_compute_tokens.load(Ordering::Relaxed);
        v.legs_heading = self.legs_heading.load(Ordering::Relaxed);
    }

    /// Counts a request holding `blocks` of KV with `prefill` still to prefill.
    pub fn start(&self, blocks: u64, prefill: PrefillCharge) -> Charged {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.active_blocks.fetch_add(blocks, Ordering::Relaxed);
        self.charge(prefill);
        Charged {
            blocks,
            prefill,
            heading: false,
        }
    }

    /// Counts `decision`'s request on its decode worker, from dispatch: the
    /// `prompt_blocks` of KV it will take there and its prefill of `prompt_tokens`, of
    /// which the worker holds `cached_tokens` (as the view the policy chose from said).
    pub fn start_request(
        &self,
        decision: &Decision,
        prompt_blocks: u64,
        prompt_tokens: u64,
        cached_tokens: u64,
    ) -> Charged {
        self.start(
            prompt_blocks,
            PrefillCharge::of(decision, prompt_tokens, cached_tokens),
        )
    }

    /// Counts a remote prefill's leg on its prefill worker while it runs: the prompt's
    /// `hashed_blocks` whole blocks of `block` tokens of KV, of which it computes what the
    /// plan found it lacks of the `prompt_tokens`.
    pub fn start_prefill_leg(
        &self,
        decision: &Decision,
        hashed_blocks: u64,
        block: u64,
        prompt_tokens: u64,
    ) -> Charged {
        let leg = PrefillCharge {
            tokens: hashed_blocks * block,
            ..PrefillCharge::prefill_leg(decision, prompt_tokens)
        };
        self.start(hashed_blocks, leg)
    }

    /// Whether `dispatch` runs a leg or a copy before its request reaches the decode
    /// worker's queue in the router (a remote prefill's leg, a move's copy; a fetch is
    /// pulled by the engine once queued).
    pub fn heads_first(dispatch: Dispatch) -> bool {
        matches!(
            dispatch,
            Dispatch::Disaggregated { .. } | Dispatch::Migrate { .. }
        )
    }

    /// Prompt tokens charged as computed there so far (monotonic).
    pub fn computed_total(&self) -> u64 {
        self.computed_total.load(Ordering::Relaxed)
    }

    fn charge(&self, c: PrefillCharge) {
        self.computed_total.fetch_add(c.computed, Ordering::Relaxed);
        self.active_prefill_tokens
            .fetch_add(c.tokens, Ordering::Relaxed);
        self.active_compute_tokens
            .fetch_add(c.computed, Ordering::Relaxed);
    }

    fn discharge(&self, c: PrefillCharge) {
        self.active_prefill_tokens
            .fetch_sub(c.tokens, Ordering::Relaxed);
        self.active_compute_tokens
            .fetch_sub(c.computed, Ordering::Relaxed);
    }

    /// The request's prefill is over (its first token came): it stops counting as pending.
    pub fn prefill_done(&self, c: &mut Charged) {
        self.discharge(std::mem::take(&mut c.prefill));
    }

    /// Counts `prefill` instead of what the request was started with (a fetch or move
    /// that fell back computes what it was to receive).
    pub fn recharge(&self, c: &mut Charged, prefill: PrefillCharge) {
        // Added before the old is taken away, so the counts never dip below zero.
        self.charge(prefill);
        let old = std::mem::replace(&mut c.prefill, prefill);
        // Written once: what it was first charged to compute is not written as well.
        self.computed_total
            .fetch_sub(old.computed, Ordering::Relaxed);
        self.discharge(old);
    }

    /// Its prefill leg or KV copy runs elsewhere: it reaches this worker's queue once
    /// that is done ([`Ledger::arrived`]). Counted once, however many it passes through.
    pub fn heading(&self, c: &mut Charged) {
        if !std::mem::replace(&mut c.heading, true) {
            self.legs_heading.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The leg or copy is over (or there was none): the request is this worker's now.
    pub fn arrived(&self, c: &mut Charged) {
        if std::mem::take(&mut c.heading) {
            self.legs_heading.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The request ended (done, abandoned or failed): all it counted is taken back.
    pub fn end(&self, mut c: Charged) {
        self.prefill_done(&mut c);
        self.arrived(&mut c);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.active_blocks.fetch_sub(c.blocks, Ordering::Relaxed);
    }
}
