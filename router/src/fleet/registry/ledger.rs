//! The load ledger: the requests this router has in flight at a worker, counted in the
//! planner's canonical [`Ledger`](ownerserve_planner::step::Ledger) (lock-free) from
//! dispatch until the guard a request holds ([`InFlight`]) drops, and the streams decoding
//! there ([`Decodes`](ownerserve_planner::step::Decodes)).

use std::sync::Arc;
use std::time::Duration;

use ownerserve_planner::kv_release::DecodeAges;
use ownerserve_planner::policy::PrefillCharge;
use ownerserve_planner::step::{Charged, Ledger};

use super::Worker;

/// How long a worker's decode ages, counted once, serve the views that follow: the bins
/// are a quarter second wide at the finest, and recounting every stream for every
/// candidate of every request would cost a walk over thousands of streams per request.
pub(super) const DECODE_AGES_FOR: Duration = Duration::from_millis(50);

impl Worker {
    /// The requests this router has in flight there.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Requests this router has sent there that have not finished.
    pub fn in_flight(&self) -> u32 {
        self.ledger.in_flight()
    }

    /// KV blocks of requests in flight there (the router's prediction).
    pub fn active_blocks(&self) -> u64 {
        self.ledger.active_blocks()
    }

    /// Seconds since the registry's clock started: the decodes' time.
    fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// KV held by the streams decoding there, by how long they have decoded, in the
    /// planner's time (`time_scale` times the wall clock's).
    pub fn decode_ages(&self, time_scale: f64) -> DecodeAges {
        let now_s = self.now_s();
        self.decodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ages(now_s, time_scale)
    }

    /// Counts a request of `prompt_tokens` as in flight, holding `blocks` of KV and
    /// `prefill` still to prefill, until the guard drops.
    pub fn start_request(
        self: &Arc<Self>,
        blocks: u64,
        prefill: PrefillCharge,
        prompt_tokens: u64,
    ) -> InFlight {
        self.hold(self.ledger.start(blocks, prefill), prompt_tokens)
    }

    /// Holds a request of `prompt_tokens` the ledger `charged` until the guard drops.
    pub fn hold(self: &Arc<Self>, charged: Charged, prompt_tokens: u64) -> InFlight {
        InFlight {
            worker: self.clone(),
            charged,
            prompt_tokens,
            decode: None,
        }
    }
}

/// A request in flight at a worker; undoes its accounting when dropped (response done,
/// client gone or worker failed).
#[derive(Debug)]
pub struct InFlight {
    worker: Arc<Worker>,
    charged: Charged,
    prompt_tokens: u64,
    /// Its slot among the worker's decodes, once its stream decodes.
    decode: Option<usize>,
}

impl InFlight {
    /// The first byte came back: the prefill is over (Dynamo's `mark_prefill_completed`).
    pub fn prefill_done(&mut self) {
        self.worker.ledger.prefill_done(&mut self.charged);
    }

    /// Its prefill runs on another worker, or its KV is being copied here: it reaches
    /// this worker's queue once that leg is done ([`InFlight::leg_arrived`]).
    pub fn leg_heading(&mut self) {
        self.worker.ledger.heading(&mut self.charged);
    }

    /// The prefill leg or copy is over (or there was none): the request is this worker's
    /// now.
    pub fn leg_arrived(&mut self) {
        self.worker.ledger.arrived(&mut self.charged);
    }

    /// Counts `prefill` instead of what the request was started with, before it is sent
    /// (a fetch or move that fell back computes what it was to receive).
    pub fn recharge(&mut self, prefill: PrefillCharge) {
        self.worker.ledger.recharge(&mut self.charged, prefill);
    }

    /// Its stream's first frame came: it decodes from now on, holding its prompt's KV.
    pub fn decoding(&mut self) {
        if self.decode.is_none() {
            let now_s = self.worker.now_s();
            let mut decodes = self
                .worker
                .decodes
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            self.decode = Some(decodes.start(now_s, self.prompt_tokens));
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let w = &self.worker;
        if let Some(slot) = self.decode.take() {
            w.decodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .end(slot);
        }
        w.ledger.end(std::mem::take(&mut self.charged));
    }
}

#[cfg(test)]
mod tests {
    use ownerserve_planner::ids::WorkerId;
    use ownerserve_planner::policy::PrefillCharge;

    use super::super::tests::registry;
    use super::super::Registry;

    #[test]
    fn in_flight_guard_counts_and_candidates_respect_exclusions() {
        let r = registry();
        for w in r.all().iter() {
            w.mark_healthy(vec!["m".into()]);
        }
        // 320 tokens of KV to allocate, 120 of them to compute (the rest moved in).
        let charge = PrefillCharge {
            tokens: 320,
            computed: 120,
        };
        let mut g = r.all()[1].start_request(10, charge, 400);
        let pending = |r: &Registry| {
            let v = &r.candidates("m", &[], None)[1];
            (v.active_prefill_tokens, v.active_compute_tokens)
        };
        assert_eq!(pending(&r), (320, 120));
        // A move that fell back computes all it lacks.
        g.recharge(PrefillCharge::computed(320));
        assert_eq!(pending(&r), (320, 320));
        g.prefill_done();
        assert_eq!(pending(&r), (0, 0));
        // A remote prefill's decode leg heads there until its prefill leg is done, or
        // the request ends first.
        let heading = |r: &Registry| r.candidates("m", &[], None)[1].legs_heading;
        let mut leg = r.all()[1].start_request(1, PrefillCharge::default(), 10);
        leg.leg_heading();
        leg.leg_heading();
        assert_eq!(heading(&r), 1);
        leg.leg_arrived();
        leg.leg_arrived();
        assert_eq!(heading(&r), 0);
        leg.leg_heading();
        drop(leg);
        assert_eq!(heading(&r), 0);
        assert_eq!(r.candidates("m", &[], None)[1].active_blocks, 10);
        assert_eq!(
            r.candidates("m", &[], None)
                .iter()
                .map(|v| v.in_flight)
                .collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 0);
        g.decoding();
        g.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 400);
        let mut h = r.all()[1].start_request(1, PrefillCharge::default(), 50);
        h.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 450);
        drop(g);
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 50);
        let mut k = r.all()[1].start_request(1, PrefillCharge::default(), 7);
        k.decoding();
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 57);
        drop((h, k));
        assert_eq!(r.all()[1].decode_ages(1.0).total(), 0);
        assert_eq!(r.all()[1].in_flight(), 0);
        assert_eq!(r.all()[1].active_blocks(), 0);
        assert_eq!(r.candidates("m", &[WorkerId(0)], None).len(), 1);
        assert!(r.candidates("other", &[], None).is_empty());
    }
}
