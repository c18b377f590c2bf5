//! Session admission in the simulator (`SimOptions::admission`, the `ownerserve` policy
//! only), as the router's front half runs it (`router/src/proxy/admission.rs`): a
//! session's first step (the router: a prompt with no assistant turn yet) waits, re-checked
//! every `RETRY_S`, while `ownerserve_planner::lifecycle::admits` says the fleet's KV memory
//! cannot hold its prompt beside the tracked sessions' contexts (a session is tracked from
//! its first step until its idle lease lapses). The step counts as sent when it first
//! arrived.

use ownerserve_planner::lifecycle::{admission_room, admits};

use super::super::events::Event;
use super::*;

/// How often a held step is checked again, virtual seconds (the router's poll).
const RETRY_S: f64 = 0.1;

#[derive(Debug)]
pub(super) struct Admission {
    on: bool,
    /// The share of the fleet's KV kept for the live sessions' growth.
    headroom: f64,
    /// Per session: when its held step first arrived (NaN if none is held).
    pub waiting_since: Vec<f64>,
    /// The fleet's HBM KV, tokens, less the headroom: what the engines report to the
    /// router (a host tier is not reported, so not counted).
    capacity_tokens: Option<u64>,
}

impl Admission {
    pub fn new(on: bool, headroom: f64, sessions: usize) -> Self {
        Self {
            on,
            headroom,
            waiting_since: vec![f64::NAN; sessions],
            capacity_tokens: None,
        }
    }
}

impl Sim<'_> {
    /// Whether `session`'s `step` of `tokens` may go now; if not it is held and re-issued.
    pub(super) fn admitted(&mut self, session: usize, step: usize, tokens: u32) -> bool {
        if !self.admission.on || step > 0 {
            return true;
        }
        let block = u64::from(self.block);
        let headroom = self.admission.headroom;
        let capacity = *self.admission.capacity_tokens.get_or_insert_with(|| {
            let kv = self
                .engines
                .iter()
                .map(|e| e.sched.pool().capacity() as u64 * block)
                .sum();
            admission_room(kv, headroom)
        });
        let live: u64 = self
            .idle
            .iter()
            .filter(|i| i.in_flight > 0 || i.idle_since_s.is_some())
            .map(|i| i.tokens)
            .sum();
        if admits(live, u64::from(tokens), capacity) {
            return true;
        }
        let since = &mut self.admission.waiting_since[session];
        if !since.is_finite() {
            *since = self.now_s;
        }
        self.queue
            .push(self.now_s + RETRY_S, Event::Issue { session, step });
        false
    }
}
