//! Idle tracking of agent sessions: when each went idle, its predicted tool-call gap (an
//! EWMA of the gaps seen) and the idle lease that follows from it. A session idle past
//! its lease is handed to the demotion sweep, which demotes it in the directory and has
//! its owner drop the unsealed tail (the sealed prefix stays for a cheap resume). The
//! rates at which each worker's parked sessions are expected to come back are kept
//! alongside, for the cost planner, and each session's KV lifecycle
//! ([`super::session_life`]: its gaps as a lognormal, where its KV is, what was decided
//! when it parked), which the lifecycle sweep ([`super::lifecycle`]) reads and drives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::hash::HashedPrompt;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::lifecycle::{
    self, Effect, Ending, EndingGaps, GapEstimate, Hold, Lifecycle, Retention, Returned, REVISE_MS,
};
use ownerserve_planner::policy::WorkerView;

use ownerserve_shim::openai::SessionAction;

use super::session_life::{Due, Life, StepKv};

/// Most sessions tracked; the longest idle ones are forgotten beyond it.
const MAX_SESSIONS: usize = 200_000;
/// A session admitted counts as live this long before its first step is tracked (a step
/// that never starts, refused or failed, stops counting then).
const ADMITTED_FOR_MS: u64 = 60_000;

#[derive(Debug, Clone)]
struct Tracked {
    lease: GapLease,
    in_flight: u32,
    /// When the last request ended (ms), while none is in flight.
    idle_since_ms: Option<u64>,
    /// The worker that decoded it last and the block hashes past its sealed prefix.
    owner: WorkerId,
    tail: Vec<u64>,
    /// What it adds to its owner's parked returns while idle (`GapLease::return_rate_per_s`);
    /// 0 while in flight or before a gap was seen.
    returns_per_s: f64,
    life: Life,
    /// The client asked to keep it alive until then (ms): it does not lapse before, and
    /// its KV is kept as for a session sure to return.
    keep_alive_until_ms: u64,
    /// The client asked to close it once its step ends.
    close_after: bool,
}

/// A session whose idle lease lapsed.
#[derive(Debug, Clone, PartialEq)]
pub struct Lapsed {
    pub session: String,
    pub owner: WorkerId,
    pub tail: Vec<u64>,
    /// The lease it lapsed past, ms.
    pub lease_ms: u64,
}

/// Every session's idle clock.
#[derive(Debug)]
pub struct Sessions {
    template: GapLease,
    /// The gap assumed before any was seen (`[router.sessions]` `gap_prior_*`).
    prior: GapEstimate,
    inner: Mutex<Inner>,
}

/// A session's step, started.
#[derive(Debug)]
pub struct Started {
    /// The predicted tool gap, once one was seen.
    pub predicted_gap_ms: Option<u64>,
    pub activity: Activity,
    /// What it found, if it returned to a lifecycle decision.
    pub returned: Option<(Hold, Returned)>,
}

/// A tracked session as `GET /admin/v1/lifecycle` lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SessionKv {
    pub session: String,
    pub owner: WorkerId,
    pub model: Arc<str>,
    /// Its context: its last step's prompt, tokens.
    pub tokens: u64,
    pub in_flight: u32,
    /// Idle since its last response ended, ms (None while a step runs).
    pub idle_ms: Option<u64>,
    /// The lifecycle's course for it while parked (`keep`, `offload`, `prefetch`,
    /// `let_go`), once decided.
    pub hold: Option<&'static str>,
    /// Where the lifecycle counts its KV: `hbm`, `host` or `gone`.
    pub kv: &'static str,
    /// How its last response ended (`tool_call`, `answer`, `unknown`): what its gap is
    /// predicted by.
    pub ending: &'static str,
}

/// What session admission counts now: per served model, the tracked sessions' contexts and
/// the tokens admitted but not started.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LiveTokens {
    pub live: std::collections::BTreeMap<String, u64>,
    pub admitted: std::collections::BTreeMap<String, u64>,
}

/// A parked session awaiting its lifecycle decision.
#[derive(Debug, Clone)]
pub struct Undecided {
    pub session: String,
    pub owner: WorkerId,
    pub model: Arc<str>,
    pub tokens: u64,
    pub gap: GapEstimate,
    pub idle_s: f64,
    pub p_return: f64,
    /// Its KV is still in its owner's HBM, as far as the lifecycle knows.
    pub resident: bool,
    /// Tokens of its owner's other parked sessions kept (or to be brought back) there.
    pub kept_tokens: u64,
}

#[derive(Debug, Default)]
struct Inner {
    tracked: HashMap<String, Tracked>,
    /// Per worker, the steps per second its parked sessions are expected to send: the
    /// sum of their `returns_per_s`.
    parked: HashMap<WorkerId, f64>,
    /// Every session's gaps by how the response before each ended: the prior of a session
    /// with few of its own.
    fleet_gaps: EndingGaps,
    /// Parked sessions that came back, and that lapsed or were closed instead.
    came_back: u64,
    ended: u64,
    /// Engine effects of the lifecycle to carry out: (owner, session, effect).
    outbox: Vec<(WorkerId, String, Effect)>,
    /// Sessions their clients closed, for the demotion sweep to release.
    closed: Vec<Lapsed>,
    /// The tracked sessions' contexts per served model, tokens (`Life::tokens` summed).
    live_tokens: HashMap<Arc<str>, u64>,
    /// Sessions admitted whose first step has not started yet: (model, tokens, admitted
    /// at ms).
    admitted: HashMap<String, (Arc<str>, u64, u64)>,
}

impl Inner {
    /// Moves `before` (model, tokens) of a session's context out of the live sum and `after`
    /// into it.
    fn relive(&mut self, before: (Arc<str>, u64), after: Option<(Arc<str>, u64)>) {
        if let Some(sum) = self.live_tokens.get_mut(&before.0) {
            *sum = sum.saturating_sub(before.1);
        }
        if let Some((model, tokens)) = after {
            *self.live_tokens.entry(model).or_default() += tokens;
        }
    }

    /// Takes the session's contribution off its owner's parked returns.
    fn unpark(&mut self, session: &str) {
        let Some(t) = self.tracked.get_mut(session) else {
            return;
        };
        let rate = std::mem::take(&mut t.returns_per_s);
        if rate > 0.0 {
            if let Some(sum) = self.parked.get_mut(&t.owner) {
                *sum = (*sum - rate).max(0.0);
            }
        }
    }

    /// Forgets a session: its lifecycle ends (its pin undone).
    fn remove(&mut self, session: &str) -> Option<Tracked> {
        self.unpark(session);
        let mut t = self.tracked.remove(session)?;
        self.relive((t.life.model(), t.life.tokens()), None);
        self.ended += 1;
        for e in t.life.end() {
            self.outbox.push((t.owner, session.to_owned(), e));
        }
        Some(t)
    }
}

impl Sessions {
    /// Tracks sessions with leases shaped like `template`, gaps expected like `prior`
    /// before any is seen.
    pub fn new(template: GapLease, prior: GapEstimate) -> Arc<Self> {
        Arc::new(Self {
            template,
            prior,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Whether `session`'s next step would be a return from a tool: it is tracked and
    /// idle (its last step ended).
    pub fn is_returning(&self, session: &str) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .tracked
            .get(session)
            .is_some_and(|t| t.in_flight == 0 && t.idle_since_ms.is_some())
    }

    /// A request of `session` starts on `owner` at `now_ms`; `tail` are the prompt's block
    /// hashes past its sealed prefix, `step` what its lifecycle keeps of it.
    pub fn start(
        self: &Arc<Self>,
        session: &str,
        owner: WorkerId,
        tail: Vec<u64>,
        now_ms: u64,
        step: StepKv,
    ) -> Started {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if inner.tracked.len() >= MAX_SESSIONS && !inner.tracked.contains_key(session) {
            let oldest = inner
                .tracked
                .iter()
                .filter_map(|(k, t)| t.idle_since_ms.map(|i| (i, k.clone())))
                .min();
            if let Some((_, k)) = oldest {
                inner.remove(&k);
            }
        }
        inner.unpark(session);
        inner.admitted.remove(session);
        let t = inner
            .tracked
            .entry(session.to_owned())
            .or_insert_with(|| Tracked {
                lease: self.template,
                in_flight: 0,
                idle_since_ms: None,
                owner,
                tail: Vec::new(),
                returns_per_s: 0.0,
                life: Life::default(),
                keep_alive_until_ms: 0,
                close_after: false,
            });
        match step.control {
            Some((SessionAction::KeepAlive, timeout_s)) => {
                t.keep_alive_until_ms = now_ms.saturating_add(timeout_s.saturating_mul(1000));
            }
            Some((SessionAction::Close, _)) => t.close_after = true,
            Some((SessionAction::Continue, _)) | None => {}
        }
        let mut gap = None;
        if let Some(idle) = t.idle_since_ms.take() {
            let g = now_ms.saturating_sub(idle);
            t.lease.observe_gap(g);
            t.life.life.observe_gap(g);
            gap = Some((t.life.life.ending, g));
        }
        let moved = t.owner != owner;
        let before = (t.life.model(), t.life.tokens());
        let (returned, effects) = t.life.returned(step);
        let after = (t.life.model(), t.life.tokens());
        let old_owner = std::mem::replace(&mut t.owner, owner);
        t.in_flight += 1;
        t.tail = tail;
        let predicted = t.lease.predicted_gap_ms().map(|g| g as u64);
        inner.relive(before, Some(after));
        let Inner {
            fleet_gaps,
            came_back,
            outbox,
            ..
        } = &mut *inner;
        if let Some((ending, g)) = gap {
            fleet_gaps.observe(ending, g);
            *came_back += 1;
        }
        // A pin is undone where it was taken (the old owner, if the step moved).
        let at = if moved { old_owner } else { owner };
        outbox.extend(effects.into_iter().map(|e| (at, session.to_owned(), e)));
        drop(inner);
        Started {
            predicted_gap_ms: predicted,
            activity: Activity {
                sessions: self.clone(),
                session: session.to_owned(),
                ending: Ending::Unknown,
            },
            returned,
        }
    }

    /// At most `most` tracked sessions (by id), with the count of all, and what admission
    /// counts: the operator's view of the lifecycle.
    pub fn lifecycle_view(&self, most: usize, now_ms: u64) -> (Vec<SessionKv>, usize, LiveTokens) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids: Vec<&String> = inner.tracked.keys().collect();
        ids.sort();
        let rows = ids
            .into_iter()
            .take(most)
            .filter_map(|k| {
                let t = inner.tracked.get(k)?;
                Some(SessionKv {
                    session: k.clone(),
                    owner: t.owner,
                    model: t.life.model(),
                    tokens: t.life.tokens(),
                    in_flight: t.in_flight,
                    idle_ms: t.idle_since_ms.map(|i| now_ms.saturating_sub(i)),
                    hold: t.life.life.hold().map(Hold::name),
                    kv: t.life.life.place().name(),
                    ending: t.life.life.ending.name(),
                })
            })
            .collect();
        let mut counts = LiveTokens::default();
        for (m, &t) in inner.live_tokens.iter().filter(|(_, &t)| t > 0) {
            counts.live.insert(m.to_string(), t);
        }
        for (m, t, _) in inner.admitted.values() {
            *counts.admitted.entry(m.to_string()).or_default() += t;
        }
        (rows, inner.tracked.len(), counts)
    }

    /// Whether `session` is tracked: it started and has neither lapsed nor been closed.
    pub fn tracks(&self, session: &str) -> bool {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.tracked.contains_key(session)
    }

    /// Admits new `session` of `model`, its first prompt `tokens`, if `ownerserve_planner::
    /// lifecycle::admits` finds room for it in `capacity_tokens` (the KV of the workers
    /// serving `model`) beside the contexts of that model's tracked sessions and of those
    /// admitted at most `ADMITTED_FOR_MS` ago whose first step has not started (so waiters
    /// admitted together do not overshoot).
    pub fn admit(
        &self,
        session: &str,
        model: &str,
        tokens: u64,
        capacity_tokens: u64,
        now_ms: u64,
    ) -> bool {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .admitted
            .retain(|_, (_, _, at)| now_ms.saturating_sub(*at) < ADMITTED_FOR_MS);
        let pending: u64 = inner
            .admitted
            .iter()
            .filter(|(k, (m, _, _))| k.as_str() != session && &**m == model)
            .map(|(_, (_, t, _))| *t)
            .sum();
        let live = inner
            .live_tokens
            .get(model)
            .copied()
            .unwrap_or(0)
            .saturating_add(pending);
        if !lifecycle::admits(live, tokens, capacity_tokens) {
            return false;
        }
        if inner.admitted.len() < MAX_SESSIONS {
            inner
                .admitted
                .insert(session.to_owned(), (model.into(), tokens, now_ms));
        }
        true
    }

    /// The gap prior now for a gap after `ending`: the fleet's gaps after such endings,
    /// shrunk toward all its gaps and the configured prior.
    fn prior(&self, inner: &Inner, ending: Ending) -> GapEstimate {
        inner.fleet_gaps.estimate(ending, self.prior)
    }

    /// The parked sessions awaiting a lifecycle decision at `now_ms`, or its revision.
    pub fn undecided(&self, now_ms: u64) -> Vec<Undecided> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let p_return = lifecycle::p_return(inner.came_back, inner.ended);
        // Per owner, the parked sessions kept (or to be brought back) in its HBM.
        let kept_of = |t: &Tracked| {
            let kept =
                t.in_flight == 0 && matches!(t.life.life.hold(), Some(Hold::Keep | Hold::Prefetch));
            if kept {
                t.life.tokens()
            } else {
                0
            }
        };
        let mut kept: HashMap<WorkerId, u64> = HashMap::new();
        for t in inner.tracked.values() {
            *kept.entry(t.owner).or_default() += kept_of(t);
        }
        inner
            .tracked
            .iter()
            .filter(|(_, t)| t.in_flight == 0 && t.life.life.due_for_decision(now_ms, REVISE_MS))
            .filter_map(|(k, t)| {
                let idle = t.idle_since_ms?;
                let kept_alive = t.keep_alive_until_ms > now_ms;
                Some(Undecided {
                    session: k.clone(),
                    owner: t.owner,
                    model: t.life.model(),
                    tokens: t.life.tokens(),
                    gap: t.life.life.gap(self.prior(&inner, t.life.life.ending)),
                    idle_s: now_ms.saturating_sub(idle) as f64 / 1e3,
                    p_return: if kept_alive { 1.0 } else { p_return },
                    resident: t.life.life.resident(),
                    kept_tokens: kept
                        .get(&t.owner)
                        .copied()
                        .unwrap_or(0)
                        .saturating_sub(kept_of(t)),
                })
            })
            .collect()
    }

    /// Takes (or revises) `decision` for parked `session` at `now_ms` on an engine with
    /// `retention`; its effects go to the outbox. Whether its course changed; `None` if it
    /// is no longer parked.
    pub fn decide(
        &self,
        session: &str,
        decision: Lifecycle,
        retention: Retention,
        now_ms: u64,
    ) -> Option<bool> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner {
            tracked, outbox, ..
        } = &mut *inner;
        let t = tracked.get_mut(session).filter(|t| t.in_flight == 0)?;
        let (changed, effects) = t.life.life.decide(decision, retention, now_ms);
        outbox.extend(
            effects
                .into_iter()
                .map(|e| (t.owner, session.to_owned(), e)),
        );
        Some(changed)
    }

    /// At most `most` of the touches and bring-backs due at `now_ms`: (owner, session,
    /// what). Those not taken stay due.
    pub fn due(&self, now_ms: u64, most: usize) -> Vec<(WorkerId, String, Due)> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .tracked
            .iter_mut()
            .filter(|(_, t)| t.in_flight == 0)
            .filter_map(|(k, t)| Some((t.owner, k.clone(), t.life.due(now_ms)?)))
            .take(most)
            .collect()
    }

    /// Parked, decided sessions whose KV the lifecycle counts in HBM, with their prompt:
    /// (owner, session, prompt), for the sweep to check against the KV index.
    pub fn resident(&self) -> Vec<(WorkerId, String, Arc<HashedPrompt>)> {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .tracked
            .iter()
            .filter(|(_, t)| t.in_flight == 0 && t.life.life.resident() && t.life.life.decided())
            .filter_map(|(k, t)| Some((t.owner, k.clone(), t.life.prompt()?)))
            .collect()
    }

    /// The session's prefix is no longer in its owner's HBM.
    pub fn evicted(&self, session: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = inner.tracked.get_mut(session) {
            t.life.life.evicted();
        }
    }

    /// A restore or recompute of the session landed.
    pub fn brought_back(&self, session: &str) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = inner.tracked.get_mut(session) {
            t.life.life.brought_back();
        }
    }

    /// The sessions their clients closed since the last call, for release.
    pub fn take_closed(&self) -> Vec<Lapsed> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut inner.closed)
    }

    /// The lifecycle's engine effects waiting to be carried out.
    pub fn take_effects(&self) -> Vec<(WorkerId, String, Effect)> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut inner.outbox)
    }

    /// The client ended `session` (an explicit close): it is forgotten at once, its pin
    /// undone, and returned for release like a lapsed session. `None` if unknown.
    pub fn close(&self, session: &str) -> Option<Lapsed> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let t = inner.remove(session)?;
        Some(Lapsed {
            session: session.to_owned(),
            owner: t.owner,
            tail: t.tail,
            lease_ms: 0,
        })
    }

    fn end(&self, session: &str, ending: Ending, now_ms: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let closing = match inner.tracked.get_mut(session) {
            Some(t) => {
                t.in_flight = t.in_flight.saturating_sub(1);
                t.in_flight == 0 && t.close_after
            }
            None => return,
        };
        if closing {
            if let Some(t) = inner.remove(session) {
                inner.closed.push(Lapsed {
                    session: session.to_owned(),
                    owner: t.owner,
                    tail: t.tail,
                    lease_ms: 0,
                });
            }
            return;
        }
        let Inner {
            tracked, parked, ..
        } = &mut *inner;
        if let Some(t) = tracked.get_mut(session).filter(|t| t.in_flight == 0) {
            t.idle_since_ms = Some(now_ms);
            t.life.life.ending = ending;
            // Replaces what it added if it was already idle (an end without a start).
            let before = t.returns_per_s;
            t.returns_per_s = t.lease.return_rate_per_s().unwrap_or(0.0);
            let sum = parked.entry(t.owner).or_default();
            *sum = (*sum + t.returns_per_s - before).max(0.0);
        }
    }

    /// Sets each view's `parked_returns_per_s`: the steps the sessions parked on that
    /// worker (idle within their lease, a gap seen) are expected to send per second of
    /// the planner's time (`time_scale` planner seconds per wall-clock second, validated
    /// positive), like the decode ages it reads.
    pub fn fill_parked_returns(&self, views: &mut [WorkerView], time_scale: f64) {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for v in views {
            let per_wall_s = inner.parked.get(&v.id).copied().unwrap_or(0.0);
            v.parked_returns_per_s = per_wall_s / time_scale;
        }
    }

    /// Removes and returns the sessions idle past their lease at `now_ms`.
    pub fn lapsed(&self, now_ms: u64) -> Vec<Lapsed> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let gone: Vec<String> = inner
            .tracked
            .iter()
            .filter(|(_, t)| {
                t.keep_alive_until_ms <= now_ms
                    && t.idle_since_ms
                        .is_some_and(|i| now_ms.saturating_sub(i) > t.lease.ttl_ms())
            })
            .map(|(k, _)| k.clone())
            .collect();
        gone.into_iter()
            .filter_map(|k| {
                let t = inner.remove(&k)?;
                Some(Lapsed {
                    session: k,
                    owner: t.owner,
                    tail: t.tail,
                    lease_ms: t.lease.ttl_ms(),
                })
            })
            .collect()
    }
}

/// Wall-clock milliseconds since the Unix epoch (the sweep's and requests' common clock).
pub fn now_ms() -> u64 {
    ownerserve_ownership::node::unix_ms()
}

/// A request of a session in flight; dropping it (response done or abandoned) starts the
/// session's idle clock, with how its response ended ([`Activity::saw`]).
#[derive(Debug)]
pub struct Activity {
    sessions: Arc<Sessions>,
    session: String,
    ending: Ending,
}

impl Activity {
    /// Reads a piece of the response on its way to the client for how it ended: a tool
    /// call (OpenAI's `"finish_reason":"tool_calls"`, Anthropic's `"stop_reason":"tool_use"`)
    /// or an answer (`stop`, `length`, `end_turn`, `max_tokens`). A tool call is kept once
    /// seen. A marker split across two pieces is missed (engines send one event per piece).
    pub fn saw(&mut self, piece: &[u8]) {
        if self.ending != Ending::ToolCall {
            if let Some(e) = ending_in(piece) {
                self.ending = e;
            }
        }
    }
}

/// How a response ended, if `piece` says: the last `finish_reason` or `stop_reason` in it
/// (JSON with or without a space after the colon).
pub fn ending_in(piece: &[u8]) -> Option<Ending> {
    const KEYS: [&[u8]; 2] = [b"\"finish_reason\":", b"\"stop_reason\":"];
    let mut found = None;
    for key in KEYS {
        for at in memchr::memmem::find_iter(piece, key) {
            let rest = &piece[at + key.len()..];
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            let Some(value) = rest.strip_prefix(b"\"") else {
                continue; // null: not ended yet
            };
            let end = memchr::memchr(b'"', value).unwrap_or(value.len());
            found = Some(match &value[..end] {
                b"tool_calls" | b"tool_use" | b"function_call" => Ending::ToolCall,
                _ => Ending::Answer,
            });
        }
    }
    found
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.sessions.end(&self.session, self.ending, now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Arc<Sessions> {
        Sessions::new(
            GapLease::new(2.0, 100, 1_000),
            GapEstimate::from_median_p90(5.0, 60.0),
        )
    }

    /// Starts a step of `session` on `owner`: (predicted gap, activity).
    fn start(
        s: &Arc<Sessions>,
        session: &str,
        owner: u32,
        tail: Vec<u64>,
        at: u64,
    ) -> (Option<u64>, Activity) {
        let st = s.start(session, WorkerId(owner), tail, at, StepKv::default());
        (st.predicted_gap_ms, st.activity)
    }

    #[test]
    fn a_response_ends_in_a_tool_call_or_an_answer() {
        let cases: [(&[u8], Option<Ending>); 7] = [
            (
                br#"data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
                Some(Ending::ToolCall),
            ),
            (
                br#"{"choices":[{"finish_reason": "stop"}]}"#,
                Some(Ending::Answer),
            ),
            (
                br#"event: message_delta
data: {"delta":{"stop_reason":"tool_use"}}"#,
                Some(Ending::ToolCall),
            ),
            (
                br#"data: {"delta":{"stop_reason":"end_turn"}}"#,
                Some(Ending::Answer),
            ),
            (
                br#"data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}"#,
                None,
            ),
            (
                br#"data: {"choices":[{"finish_reason":"length"}]}"#,
                Some(Ending::Answer),
            ),
            (b"data: [DONE]", None),
        ];
        for (piece, want) in cases {
            assert_eq!(ending_in(piece), want, "{}", String::from_utf8_lossy(piece));
        }
    }

    #[test]
    fn a_parked_session_waits_on_how_its_last_response_ended() {
        let s = sessions();
        let ending = |s: &Arc<Sessions>, name: &str| {
            let (rows, _, _) = s.lifecycle_view(10, now_ms());
            rows.into_iter()
                .find(|r| r.session == name)
                .map(|r| r.ending)
        };
        let (_, mut a) = start(&s, "t", 0, vec![], now_ms());
        a.saw(br#"data: {"choices":[{"finish_reason":"tool_calls"}]}"#);
        // A tool call is kept once seen; the stream's end says nothing more.
        a.saw(br#"data: {"choices":[{"finish_reason":"stop"}]}"#);
        drop(a);
        assert_eq!(ending(&s, "t"), Some("tool_call"));
        let (_, mut b) = start(&s, "t", 0, vec![], now_ms());
        b.saw(br#"data: {"delta":{"stop_reason":"end_turn"}}"#);
        drop(b);
        assert_eq!(ending(&s, "t"), Some("answer"));
        drop(start(&s, "u", 0, vec![], now_ms()).1);
        assert_eq!(ending(&s, "u"), Some("unknown"));
    }

    #[test]
    fn a_session_lapses_after_its_lease_and_only_when_idle() {
        let s = sessions();
        let (_, a) = start(&s, "s", 1, vec![7], 0);
        assert!(s.lapsed(10_000).is_empty(), "in flight: never lapses");
        drop(a);
        let idle = now_ms();
        assert!(s.lapsed(idle + 500).is_empty(), "max_ms before any gap");
        let gone = s.lapsed(idle + 1_001);
        assert_eq!(
            gone,
            vec![Lapsed {
                session: "s".into(),
                owner: WorkerId(1),
                tail: vec![7],
                lease_ms: 1_000,
            }]
        );
        assert!(s.lapsed(idle + 5_000).is_empty(), "reported once");
    }

    fn step_of(tokens: u64) -> StepKv {
        StepKv {
            tokens,
            model: "m".into(),
            ..StepKv::default()
        }
    }

    #[test]
    fn admission_counts_live_contexts_and_sessions_admitted_but_not_started() {
        let s = sessions();
        assert!(s.admit("a", "m", 700, 1_000, 0), "nothing live: admitted");
        // A admitted, its step not started yet: it counts.
        assert!(!s.admit("b", "m", 400, 1_000, 10));
        let a = s.start("a", WorkerId(0), vec![], 20, step_of(700)).activity;
        assert!(!s.admit("b", "m", 400, 1_000, 30), "A live");
        assert!(s.admit("c", "m", 300, 1_000, 30), "700 + 300 fit");
        // C's step never started: it stops counting after a minute.
        assert!(!s.admit("b", "m", 100, 1_000, 40));
        assert!(s.admit("b", "m", 100, 1_000, 30 + ADMITTED_FOR_MS));
        // A's context grows with its next step; closing it frees it all.
        drop(a);
        drop(s.start("a", WorkerId(0), vec![], 50, step_of(900)).activity);
        assert!(!s.admit("d", "m", 200, 1_000, 30 + ADMITTED_FOR_MS));
        assert!(s.close("a").is_some());
        assert!(s.admit("d", "m", 200, 1_000, 30 + ADMITTED_FOR_MS));
        assert!(!s.tracks("a") && !s.tracks("d"));
        // Another model's sessions take none of this model's room.
        assert!(s.admit("e", "other", 1_000, 1_000, 30 + ADMITTED_FOR_MS));
        assert!(s.admit("f", "m", 700, 1_000, 30 + ADMITTED_FOR_MS));
    }

    #[test]
    fn an_undecided_session_sees_what_its_owner_keeps_for_the_others() {
        let s = sessions();
        for (name, owner, tokens) in [("x", 0, 300), ("y", 0, 500), ("z", 1, 700)] {
            drop(
                s.start(name, WorkerId(owner), vec![], 0, step_of(tokens))
                    .activity,
            );
        }
        let keep = Lifecycle {
            hold: Hold::Keep,
            bring_back_in_s: None,
            touch_every_s: None,
            costs: [0.0; 4],
        };
        assert_eq!(s.decide("x", keep, Retention::Hold, now_ms()), Some(true));
        assert_eq!(s.decide("z", keep, Retention::Hold, now_ms()), Some(true));
        // Revisions are due a second on; y is undecided now.
        let later = now_ms() + 2 * REVISE_MS;
        let kept: HashMap<String, u64> = s
            .undecided(later)
            .into_iter()
            .map(|u| (u.session, u.kept_tokens))
            .collect();
        assert_eq!(kept["x"], 0, "its own tokens are not the others'");
        assert_eq!(kept["y"], 300, "x is kept on its owner");
        assert_eq!(kept["z"], 0, "nothing else kept on worker 1");
    }

    fn parked(s: &Sessions) -> Vec<f64> {
        let mut views = vec![
            WorkerView::idle(WorkerId(0), ownerserve_planner::ids::Role::Hybrid),
            WorkerView::idle(WorkerId(1), ownerserve_planner::ids::Role::Hybrid),
        ];
        s.fill_parked_returns(&mut views, 1.0);
        // Rounded: the gap is measured from the wall clock the guard's drop reads.
        views
            .iter()
            .map(|v| (v.parked_returns_per_s * 10.0).round() / 10.0)
            .collect()
    }

    #[test]
    fn parked_sessions_count_toward_their_owner_until_they_return_or_lapse() {
        let s = sessions();
        let (_, a) = start(&s, "s", 0, vec![], 0);
        drop(a);
        assert_eq!(parked(&s), [0.0, 0.0], "no gap seen yet: no rate");
        let idle = now_ms();
        let (_, b) = start(&s, "s", 0, vec![], idle + 250);
        assert_eq!(parked(&s), [0.0, 0.0], "in flight");
        drop(b);
        assert_eq!(parked(&s), [4.0, 0.0], "one step per 250 ms gap");
        let idle = now_ms();
        // It comes back and moves to worker 1: worker 0 no longer expects it.
        let (_, c) = start(&s, "s", 1, vec![], idle + 250);
        assert_eq!(parked(&s), [0.0, 0.0]);
        drop(c);
        assert_eq!(parked(&s), [0.0, 4.0]);
        let idle = now_ms();
        assert_eq!(s.lapsed(idle + 1_001).len(), 1);
        assert_eq!(parked(&s), [0.0, 0.0], "lapsed: demoted, not expected back");
    }

    #[test]
    fn observed_gaps_shorten_the_lease() {
        let s = sessions();
        let (_, a) = start(&s, "s", 0, vec![], 0);
        drop(a);
        let idle = now_ms();
        let (predicted, b) = start(&s, "s", 0, vec![], idle + 60);
        assert_eq!(predicted, Some(60));
        drop(b);
        let idle = now_ms();
        // Lease is now max(2 × 60, 100) = 120 ms.
        assert!(s.lapsed(idle + 110).is_empty());
        assert_eq!(s.lapsed(idle + 130).len(), 1);
    }

    fn kept_step(tokens: usize) -> StepKv {
        StepKv {
            tokens: tokens as u64,
            prompt: Some(Arc::new(HashedPrompt {
                tokenized: ownerserve_planner::tokenized::Tokenized::default(),
                hashes: vec![1, 2, 3],
            })),
            model: "m".into(),
            control: None,
        }
    }

    fn decision(hold: Hold, touch_every_s: Option<f64>, bring_back_in_s: Option<f64>) -> Lifecycle {
        Lifecycle {
            hold,
            bring_back_in_s,
            touch_every_s,
            costs: [0.0; 4],
        }
    }

    #[test]
    fn a_parked_session_is_decided_once_touched_on_time_and_counted_at_its_return() {
        let s = sessions();
        let st = s.start("s", WorkerId(0), vec![], 0, kept_step(80_000));
        assert!(st.returned.is_none(), "a first step returns from nothing");
        assert!(s.undecided(0).is_empty(), "in flight: not parked");
        drop(st.activity);
        let idle = now_ms();
        let u = s.undecided(idle + 1_000);
        assert_eq!(u.len(), 1);
        assert_eq!((u[0].tokens, &*u[0].model, u[0].idle_s), (80_000, "m", 1.0));
        assert!(
            (u[0].p_return - 0.5).abs() < 1e-9,
            "nothing seen: even odds"
        );
        assert!((u[0].gap.median_s() - 5.0).abs() < 1e-6, "the prior");
        assert_eq!(
            s.decide(
                "s",
                decision(Hold::Keep, Some(2.0), None),
                Retention::Touch,
                idle
            ),
            Some(true)
        );
        assert!(s.undecided(idle + 500).is_empty(), "decided");
        assert_eq!(
            s.undecided(idle + 1_000).len(),
            1,
            "revised as the load changes"
        );
        let same = decision(Hold::Keep, Some(2.0), None);
        assert_eq!(
            s.decide("s", same, Retention::Touch, idle + 1_000),
            Some(false),
            "the same course: its touches stay scheduled"
        );
        assert!(s.take_effects().is_empty(), "a touch engine takes no pin");
        assert!(s.due(idle + 1_000, usize::MAX).is_empty());
        let due = s.due(idle + 2_000, usize::MAX);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].2.effect, Effect::Touch);
        assert!(
            s.due(idle + 2_500, usize::MAX).is_empty(),
            "rescheduled 2 s on"
        );
        assert!(s.is_returning("s"));
        let back = s.start("s", WorkerId(0), vec![], idle + 3_000, kept_step(81_000));
        assert_eq!(back.returned.map(|r| r.0), Some(Hold::Keep));
        assert_eq!(
            back.returned.map(|r| r.1.found),
            Some(ownerserve_planner::lifecycle::KvPlace::Hbm)
        );
        assert!(!s.is_returning("s"), "in flight");
        drop(back.activity);
        let idle = now_ms();
        let u = s.undecided(idle);
        assert!(u[0].p_return > 0.5, "one came back");
        assert!(
            u[0].gap.median_s() > 2.0,
            "its own 3 s gap, shrunk toward the prior"
        );
    }

    #[test]
    fn a_pinned_session_that_ends_unpins_and_a_let_go_one_is_evicted_and_prefetched() {
        let s = sessions();
        drop(
            s.start("pinned", WorkerId(0), vec![], 0, kept_step(10))
                .activity,
        );
        assert_eq!(
            s.decide(
                "pinned",
                decision(Hold::Keep, None, None),
                Retention::Hold,
                0
            ),
            Some(true)
        );
        let pins: Vec<_> = s.take_effects().into_iter().map(|e| e.2).collect();
        assert_eq!(pins, [Effect::Pin]);
        assert!(s.close("pinned").is_some());
        let unpins: Vec<_> = s.take_effects().into_iter().map(|e| e.2).collect();
        assert_eq!(unpins, [Effect::Unpin], "a closed session holds no pin");
        assert!(s.close("pinned").is_none(), "forgotten");

        drop(
            s.start("far", WorkerId(1), vec![], 0, kept_step(10))
                .activity,
        );
        let t0 = now_ms();
        assert_eq!(
            s.decide(
                "far",
                decision(Hold::Prefetch, None, Some(1.0)),
                Retention::Touch,
                t0
            ),
            Some(true)
        );
        assert_eq!(s.resident().len(), 1);
        s.evicted("far");
        assert!(s.resident().is_empty());
        let due = s.due(t0 + 1_000, usize::MAX);
        assert_eq!(due[0].2.effect, Effect::Recompute);
        s.brought_back("far");
        assert_eq!(s.resident().len(), 1, "back in HBM before its return");
    }

    #[test]
    fn a_closed_session_is_released_when_its_step_ends_and_a_kept_alive_one_does_not_lapse() {
        let s = sessions();
        let close = StepKv {
            control: Some((SessionAction::Close, 0)),
            ..kept_step(10)
        };
        let st = s.start("c", WorkerId(3), vec![9], 0, close);
        assert!(s.take_closed().is_empty(), "closed once its step ends");
        drop(st.activity);
        let closed = s.take_closed();
        assert_eq!(
            closed
                .iter()
                .map(|l| (l.session.as_str(), l.owner))
                .collect::<Vec<_>>(),
            [("c", WorkerId(3))]
        );
        assert!(!s.is_returning("c"), "forgotten");

        let keep = StepKv {
            control: Some((SessionAction::KeepAlive, 60)),
            ..kept_step(10)
        };
        let now = now_ms();
        drop(s.start("k", WorkerId(0), vec![], now, keep).activity);
        assert!(
            s.lapsed(now + 30_000).is_empty(),
            "kept alive past its 1 s lease"
        );
        assert_eq!(s.undecided(now + 30_000)[0].p_return, 1.0, "sure to return");
        assert_eq!(s.lapsed(now + 61_000).len(), 1, "its keep-alive ran out");
    }
}
