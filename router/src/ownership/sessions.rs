//! Idle tracking of agent sessions: when each went idle, its predicted tool-call gap (an
//! EWMA of the gaps seen) and the idle lease that follows from it. A session idle past
//! its lease is handed to the demotion sweep, which demotes it in the directory and has
//! its owner drop the unsealed tail (the sealed prefix stays for a cheap resume). The
//! rates at which each worker's parked sessions are expected to come back are kept
//! alongside, for the cost planner.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ownerserve_planner::ewma::GapLease;
use ownerserve_planner::ids::WorkerId;
use ownerserve_planner::policy::WorkerView;

/// Most sessions tracked; the longest idle ones are forgotten beyond it.
const MAX_SESSIONS: usize = 200_000;

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
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    tracked: HashMap<String, Tracked>,
    /// Per worker, the steps per second its parked sessions are expected to send: the
    /// sum of their `returns_per_s`.
    parked: HashMap<WorkerId, f64>,
}

impl Inner {
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

    fn remove(&mut self, session: &str) -> Option<Tracked> {
        self.unpark(session);
        self.tracked.remove(session)
    }
}

impl Sessions {
    /// Tracks sessions with leases shaped like `template`.
    pub fn new(template: GapLease) -> Arc<Self> {
        Arc::new(Self {
            template,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// A request of `session` starts on `owner` at `now_ms`; `tail` are the prompt's block
    /// hashes past its sealed prefix. Returns the predicted tool gap, once one was seen.
    pub fn start(
        self: &Arc<Self>,
        session: &str,
        owner: WorkerId,
        tail: Vec<u64>,
        now_ms: u64,
    ) -> (Option<u64>, Activity) {
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
            });
        if let Some(idle) = t.idle_since_ms.take() {
            t.lease.observe_gap(now_ms.saturating_sub(idle));
        }
        t.in_flight += 1;
        t.owner = owner;
        t.tail = tail;
        let predicted = t.lease.predicted_gap_ms().map(|g| g as u64);
        drop(inner);
        (
            predicted,
            Activity {
                sessions: self.clone(),
                session: session.to_owned(),
            },
        )
    }

    fn end(&self, session: &str, now_ms: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { tracked, parked } = &mut *inner;
        if let Some(t) = tracked.get_mut(session) {
            t.in_flight = t.in_flight.saturating_sub(1);
            if t.in_flight == 0 {
                t.idle_since_ms = Some(now_ms);
                // Replaces what it added if it was already idle (an end without a start).
                let before = t.returns_per_s;
                t.returns_per_s = t.lease.return_rate_per_s().unwrap_or(0.0);
                let sum = parked.entry(t.owner).or_default();
                *sum = (*sum + t.returns_per_s - before).max(0.0);
            }
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
                t.idle_since_ms
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
/// session's idle clock.
#[derive(Debug)]
pub struct Activity {
    sessions: Arc<Sessions>,
    session: String,
}

impl Drop for Activity {
    fn drop(&mut self) {
        self.sessions.end(&self.session, now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions() -> Arc<Sessions> {
        Sessions::new(GapLease::new(2.0, 100, 1_000))
    }

    #[test]
    fn a_session_lapses_after_its_lease_and_only_when_idle() {
        let s = sessions();
        let (_, a) = s.start("s", WorkerId(1), vec![7], 0);
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
        let (_, a) = s.start("s", WorkerId(0), vec![], 0);
        drop(a);
        assert_eq!(parked(&s), [0.0, 0.0], "no gap seen yet: no rate");
        let idle = now_ms();
        let (_, b) = s.start("s", WorkerId(0), vec![], idle + 250);
        assert_eq!(parked(&s), [0.0, 0.0], "in flight");
        drop(b);
        assert_eq!(parked(&s), [4.0, 0.0], "one step per 250 ms gap");
        let idle = now_ms();
        // It comes back and moves to worker 1: worker 0 no longer expects it.
        let (_, c) = s.start("s", WorkerId(1), vec![], idle + 250);
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
        let (_, a) = s.start("s", WorkerId(0), vec![], 0);
        drop(a);
        let idle = now_ms();
        let (predicted, b) = s.start("s", WorkerId(0), vec![], idle + 60);
        assert_eq!(predicted, Some(60));
        drop(b);
        let idle = now_ms();
        // Lease is now max(2 × 60, 100) = 120 ms.
        assert!(s.lapsed(idle + 110).is_empty());
        assert_eq!(s.lapsed(idle + 130).len(), 1);
    }
}
