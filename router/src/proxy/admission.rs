//! Admission control, on for every policy: per served model, at most
//! `max_inflight_per_worker` × its healthy workers run at once; the next requests wait in a
//! bounded queue, each up to `queue_timeout`; beyond that a client gets a 429 with a
//! `Retry-After` estimated from how long requests of that model take. Overload then costs
//! some clients a fast, clear refusal instead of every client a hang.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// Admission settings.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionSettings {
    /// Requests one healthy worker may have in flight from this router.
    pub max_inflight_per_worker: u32,
    /// Requests of one model that may wait for a slot.
    pub max_queued_per_model: usize,
    /// Longest a request waits for a slot.
    pub queue_timeout: Duration,
}

/// Why a request was not admitted, with the seconds a client should wait before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The model's queue is full.
    QueueFull { retry_after_s: u64 },
    /// It waited `queue_timeout` without a slot.
    TimedOut { retry_after_s: u64 },
}

impl Refusal {
    pub fn retry_after_s(self) -> u64 {
        match self {
            Refusal::QueueFull { retry_after_s } | Refusal::TimedOut { retry_after_s } => {
                retry_after_s
            }
        }
    }

    /// The metrics label.
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::QueueFull { .. } => "queue_full",
            Refusal::TimedOut { .. } => "queue_timeout",
        }
    }
}

/// The gates of every model.
pub struct Admission {
    s: AdmissionSettings,
    gates: Mutex<HashMap<String, Arc<Gate>>>,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    freed: Notify,
}

#[derive(Default)]
struct GateState {
    in_flight: u32,
    waiting: usize,
    /// Mean seconds a request holds its slot (EWMA), for `Retry-After`.
    mean_s: Option<f64>,
}

/// A slot; freed (and the next waiter woken) when dropped, with the time it was held.
pub struct Ticket {
    gate: Arc<Gate>,
    since: Instant,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let held = self.since.elapsed().as_secs_f64();
        {
            let mut st = self.gate.state.lock().unwrap_or_else(|e| e.into_inner());
            st.in_flight = st.in_flight.saturating_sub(1);
            st.mean_s = Some(st.mean_s.map_or(held, |m| 0.9 * m + 0.1 * held));
        }
        self.gate.freed.notify_one();
    }
}

impl Admission {
    pub fn new(s: AdmissionSettings) -> Self {
        Self {
            s,
            gates: Mutex::new(HashMap::new()),
        }
    }

    fn gate(&self, model: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates.entry(model.to_owned()).or_default().clone()
    }

    /// A slot for a request of `model`, served by `healthy_workers` now: at once, after a
    /// wait in the queue, or a refusal.
    pub async fn admit(&self, model: &str, healthy_workers: usize) -> Result<Ticket, Refusal> {
        let capacity = (healthy_workers as u32).saturating_mul(self.s.max_inflight_per_worker);
        let gate = self.gate(model);
        let deadline = Instant::now() + self.s.queue_timeout;
        let mut queued = false;
        loop {
            // Registered before the check, so a slot freed in between is not missed.
            let freed = gate.freed.notified();
            {
                let mut st = gate.state.lock().unwrap_or_else(|e| e.into_inner());
                if st.in_flight < capacity.max(1) {
                    st.in_flight += 1;
                    if queued {
                        st.waiting -= 1;
                    }
                    return Ok(Ticket {
                        gate: gate.clone(),
                        since: Instant::now(),
                    });
                }
                let retry_after_s = retry_after(&st, capacity);
                if !queued {
                    if st.waiting >= self.s.max_queued_per_model {
                        return Err(Refusal::QueueFull { retry_after_s });
                    }
                    st.waiting += 1;
                    queued = true;
                }
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                let mut st = gate.state.lock().unwrap_or_else(|e| e.into_inner());
                st.waiting -= 1;
                let retry_after_s = retry_after(&st, capacity);
                drop(st);
                // Pass the wake-up on: a slot freed as this timed out goes to the next.
                gate.freed.notify_one();
                return Err(Refusal::TimedOut { retry_after_s });
            }
        }
    }
}

/// Seconds until the queue ahead has likely drained: the mean hold time × the waiting
/// requests per slot (at least 1 s, at most a minute).
fn retry_after(st: &GateState, capacity: u32) -> u64 {
    let rounds = (st.waiting as f64 + 1.0) / f64::from(capacity.max(1));
    (st.mean_s.unwrap_or(1.0) * rounds).ceil().clamp(1.0, 60.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(per_worker: u32, queued: usize, timeout_ms: u64) -> Admission {
        Admission::new(AdmissionSettings {
            max_inflight_per_worker: per_worker,
            max_queued_per_model: queued,
            queue_timeout: Duration::from_millis(timeout_ms),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn slots_then_a_bounded_queue_then_fast_refusals() {
        let a = Arc::new(admission(2, 1, 1_000));
        let one = a.admit("m", 1).await.unwrap();
        let _two = a.admit("m", 1).await.unwrap();
        // The third waits; the fourth finds the queue full at once.
        let waiting = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(matches!(
            a.admit("m", 1).await,
            Err(Refusal::QueueFull { .. })
        ));
        // Another model has its own gate.
        let _other = a.admit("other", 1).await.unwrap();
        // A slot frees: the waiter gets it.
        drop(one);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_at_its_deadline_with_a_retry_hint() {
        let a = admission(1, 4, 500);
        let _held = a.admit("m", 1).await.unwrap();
        let started = Instant::now();
        let refused = a.admit("m", 1).await.err().unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(refused, Refusal::TimedOut { retry_after_s: 1 });
        // More healthy workers, more slots.
        let _second = a.admit("m", 2).await.unwrap();
    }
}
