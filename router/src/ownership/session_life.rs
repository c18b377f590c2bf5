//! One session's KV lifecycle on its owner, beside its idle clock ([`super::sessions`]): the
//! planner's record of it (`ownerserve_planner::lifecycle::SessionLife`, shared with the
//! simulator) and what this router re-sends for it (its last prompt). The sweep that
//! decides and acts is [`super::lifecycle`].

use std::sync::Arc;

use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::lifecycle::{Effect, Hold, Returned, SessionLife};
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

/// A session's lifecycle and its last step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Life {
    pub life: SessionLife,
    step: StepKv,
}

/// A touch or bring-back due now.
#[derive(Debug, Clone)]
pub struct Due {
    pub effect: Effect,
    pub prompt: Arc<HashedPrompt>,
    pub model: Arc<str>,
}

impl Life {
    /// A step of the session arrives: what its return found, and the pin it no longer
    /// needs.
    pub fn returned(&mut self, step: StepKv) -> (Option<(Hold, Returned)>, Vec<Effect>) {
        let out = self.life.returned(step.prompt.is_some());
        self.step = step;
        out
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

    /// The touch or bring-back due at `now_ms`, with what it re-sends.
    pub fn due(&mut self, now_ms: u64) -> Option<Due> {
        let prompt = self.step.prompt.clone()?;
        let effect = self.life.due(now_ms)?;
        Some(Due {
            effect,
            prompt,
            model: self.step.model.clone(),
        })
    }

    /// The session ended: its pin to undo.
    pub fn end(&mut self) -> Vec<Effect> {
        self.step.prompt = None;
        self.life.end()
    }
}
