//! One parked session's lifecycle, as its owner's router (or the simulator) keeps it
//! between steps: the gaps it showed, where its KV is ([`ParkedKv`]), the course decided
//! (and revised) while it waits, and when its next touch or bring-back is due. Pure: the
//! caller passes the time (ms) and carries out the [`Effect`]s; what a touch re-sends (the
//! prompt) is the caller's, `resends` says whether there is one.

use serde::Serialize;

use super::{
    Effect, Ending, EndingGaps, GapEstimate, Hold, Lifecycle, ParkedKv, Retention, Returned,
};

/// A parked session's decision is revised this often while it waits (ms): its owner's load,
/// and so its LRU's horizon, changes under it.
pub const REVISE_MS: u64 = 1_000;
/// Below this share of its prompt's blocks still cached on its owner, a kept session counts
/// as evicted.
pub const EVICTED_BELOW: f64 = 0.5;

/// A session's lifecycle record.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SessionLife {
    pub gaps: EndingGaps,
    /// How its last response ended: what its gap now waits on.
    pub ending: Ending,
    kv: ParkedKv,
    decided: Option<Lifecycle>,
    /// When it was decided or last revised (ms).
    decided_at_ms: u64,
    /// Its last prompt can be re-sent (a touch, a prefetch).
    resends: bool,
    next_touch_ms: Option<u64>,
    bring_back_ms: Option<u64>,
}

impl SessionLife {
    /// A step of the session arrives (`resends`: its prompt can be re-sent while it waits
    /// next): what its return found, if it was parked with a decision, and the pin it no
    /// longer needs. The KV is the running step's from here.
    pub fn returned(&mut self, resends: bool) -> (Option<(Hold, Returned)>, Vec<Effect>) {
        let hold = self.decided.take().map(|d| d.hold);
        let (found, effects) = self.kv.returned();
        self.resends = resends;
        self.next_touch_ms = None;
        self.bring_back_ms = None;
        (hold.map(|h| (h, found)), effects)
    }

    /// Whether a decision is due at `now_ms`: none taken yet, or the last older than
    /// `revise_ms` (the owner's load changes while it waits).
    pub fn due_for_decision(&self, now_ms: u64, revise_ms: u64) -> bool {
        !self.kv.released()
            && self
                .decided
                .is_none_or(|_| now_ms >= self.decided_at_ms.saturating_add(revise_ms))
    }

    /// The course decided since it parked, if any.
    pub fn hold(&self) -> Option<Hold> {
        self.decided.map(|d| d.hold)
    }

    /// Whether a decision was taken since it parked.
    pub fn decided(&self) -> bool {
        self.decided.is_some()
    }

    /// Takes `decision` at `now_ms` (or revises the last): whether the course changed, and
    /// the engine effects to carry out now; touches and bring-back are scheduled when the
    /// course changes. Without a prompt to re-send, a decision that needs one is let go.
    pub fn decide(
        &mut self,
        mut decision: Lifecycle,
        retention: Retention,
        now_ms: u64,
    ) -> (bool, Vec<Effect>) {
        let needs_resend = matches!(decision.hold, Hold::Prefetch | Hold::Offload)
            || (decision.hold == Hold::Keep && retention == Retention::Touch);
        if needs_resend && !self.resends {
            decision.hold = Hold::LetGo;
            decision.bring_back_in_s = None;
            decision.touch_every_s = None;
        }
        let ms = |s: f64| now_ms.saturating_add((s.max(0.0) * 1e3).min(1e12) as u64);
        let revised = self.decided.is_some();
        let changed = self.decided.is_none_or(|d| d.hold != decision.hold);
        if changed {
            // Revised to keep it, its KV may be near the LRU's old end already: touched
            // at once.
            self.next_touch_ms =
                decision
                    .touch_every_s
                    .map(|every| if revised { now_ms } else { ms(every) });
            self.bring_back_ms = decision.bring_back_in_s.map(ms);
        } else if self.next_touch_ms.is_none() {
            self.next_touch_ms = decision.touch_every_s.map(ms);
        }
        self.decided = Some(decision);
        self.decided_at_ms = now_ms;
        (changed, self.kv.park(&decision, retention))
    }

    /// The engine no longer holds the session's prefix in HBM.
    pub fn evicted(&mut self) {
        self.kv.evicted();
    }

    /// The engine moved the session's KV from HBM to its host tier.
    pub fn offloaded(&mut self) {
        self.kv.offload_landed();
    }

    /// Where the lifecycle counts its KV now.
    pub fn place(&self) -> super::KvPlace {
        self.kv.place()
    }

    /// Whether the lifecycle counts its KV in HBM.
    pub fn resident(&self) -> bool {
        self.kv.resident()
    }

    /// The touch or bring-back due at `now_ms`, rescheduling touches.
    pub fn due(&mut self, now_ms: u64) -> Option<Effect> {
        if !self.resends {
            return None;
        }
        let due = |at: Option<u64>| at.is_some_and(|t| t <= now_ms);
        if due(self.bring_back_ms) {
            self.bring_back_ms = None;
            // Still in HBM at the bring-back: a touch refreshes it all the same (the
            // index may have missed an eviction).
            self.kv.bring_back().or(Some(Effect::Touch))
        } else if due(self.next_touch_ms) {
            let every = self.decided.and_then(|d| d.touch_every_s).unwrap_or(0.0);
            self.next_touch_ms = Some(now_ms + (every * 1e3).max(100.0) as u64);
            self.kv.touch()
        } else {
            None
        }
    }

    /// A restore or recompute answered: the KV is back in HBM.
    pub fn brought_back(&mut self) {
        self.kv.brought_back();
    }

    /// The session ended: its pin to undo, nothing more to do for it.
    pub fn end(&mut self) -> Vec<Effect> {
        self.next_touch_ms = None;
        self.bring_back_ms = None;
        self.resends = false;
        self.kv.end()
    }

    /// Its estimate of the gap it waits in now (after its last response's ending), from its
    /// own gaps and `prior` (the fleet's gaps after that ending).
    pub fn gap(&self, prior: GapEstimate) -> GapEstimate {
        self.gaps.estimate(self.ending, prior)
    }

    /// A gap of `gap_ms` ended (the session's next step arrived): learned under the ending
    /// it waited after.
    pub fn observe_gap(&mut self, gap_ms: u64) {
        self.gaps.observe(self.ending, gap_ms);
    }
}
