//! One session's KV lifecycle on its owner, beside its idle clock ([`super::sessions`]): the
//! gaps it showed (a lognormal, `ownerserve_planner::lifecycle::gap`), where its KV is
//! ([`ParkedKv`]), the decision taken when it parked, and when its next touch or
//! bring-back is due. The sweep that decides and acts is [`super::lifecycle`].

use std::sync::Arc;

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::lifecycle::{
    Effect, GapEstimate, GapStats, Hold, Lifecycle, ParkedKv, Retention, Returned,
};
use ownerserve_shim::openai::SessionAction;

/// What a step leaves for its session's lifecycle: its context, the prompt a touch or
/// prefetch re-sends (only when its tokens are the engine's own), and what its client
/// asked of the session's life (and for how many seconds).
#[derive(Debug, Clone, Default)]
pub struct StepKv {
    pub tokens: u64,
    pub prompt: Option<Arc<HashedPrompt>>,
    pub model: Arc<str>,
    pub control: Option<(SessionAction, u64)>,
}

/// A session's lifecycle record.
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionLife {
    pub gaps: GapStats,
    kv: ParkedKv,
    decided: Option<Lifecycle>,
    /// When it was decided or last revised (ms).
    decided_at_ms: u64,
    step: StepKv,
    next_touch_ms: Option<u64>,
    bring_back_ms: Option<u64>,
}

/// A touch or bring-back due now.
#[derive(Debug, Clone)]
pub struct Due {
    pub effect: Effect,
    pub prompt: Arc<HashedPrompt>,
    pub model: Arc<str>,
}

impl SessionLife {
    /// A step of the session arrives: what its return found, if it was parked with a
    /// decision. The KV is the running step's from here.
    pub fn returned(&mut self, step: StepKv) -> (Option<(Hold, Returned)>, Vec<Effect>) {
        let hold = self.decided.take().map(|d| d.hold);
        let (found, effects) = self.kv.returned();
        self.step = step;
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

    /// Whether a decision was taken since it parked.
    pub fn decided(&self) -> bool {
        self.decided.is_some()
    }

    pub fn tokens(&self) -> u64 {
        self.step.tokens
    }

    pub fn model(&self) -> Arc<str> {
        self.step.model.clone()
    }

    /// The prompt a resend would carry, if kept.
    pub fn prompt(&self) -> Option<Arc<HashedPrompt>> {
        self.step.prompt.clone()
    }

    /// Takes `decision` at `now_ms` (or revises the last): whether the course changed, and
    /// the engine effects to carry out now; touches and bring-back are scheduled when the
    /// course changes. Without the prompt's tokens nothing can be re-sent, so a decision
    /// that needs them is let go.
    pub fn decide(
        &mut self,
        mut decision: Lifecycle,
        retention: Retention,
        now_ms: u64,
    ) -> (bool, Vec<Effect>) {
        let resends = matches!(decision.hold, Hold::Prefetch | Hold::Offload)
            || (decision.hold == Hold::Keep && retention == Retention::Touch);
        if resends && self.step.prompt.is_none() {
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

    /// The engine no longer holds the session's prefix in HBM (the KV index says so).
    pub fn evicted(&mut self) {
        self.kv.evicted();
    }

    /// Whether the lifecycle counts its KV in HBM.
    pub fn resident(&self) -> bool {
        self.kv.resident()
    }

    /// The touch or bring-back due at `now_ms`, rescheduling touches.
    pub fn due(&mut self, now_ms: u64) -> Option<Due> {
        let prompt = self.step.prompt.clone()?;
        let due = |at: Option<u64>| at.is_some_and(|t| t <= now_ms);
        let effect = if due(self.bring_back_ms) {
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
        }?;
        Some(Due {
            effect,
            prompt,
            model: self.step.model.clone(),
        })
    }

    /// A restore or recompute answered: the KV is back in HBM.
    pub fn brought_back(&mut self) {
        self.kv.brought_back();
    }

    /// The session ended: its pin to undo, nothing more to do for it.
    pub fn end(&mut self) -> Vec<Effect> {
        self.next_touch_ms = None;
        self.bring_back_ms = None;
        self.step.prompt = None;
        self.kv.end()
    }

    /// Its estimate of the next gap, from its own gaps and `prior`.
    pub fn gap(&self, prior: GapEstimate) -> GapEstimate {
        self.gaps.estimate(prior)
    }
}
