//! Admission control, on for every policy: per served model, at most
//! `max_inflight_per_worker` × its healthy workers run at once; the next requests wait in a
//! bounded queue ordered by class, then a returning agent step ahead of a new conversation,
//! then deadline. Each class ([`class`]) and the classes below it hold together at most its
//! share of the slots, so a class above finds slots free; each waits at most its own
//! deadline. A full queue makes room
//! for a request by refusing its lowest-ranked waiter (background first), or refuses the
//! request itself: a 429 with a `Retry-After` estimated from how long requests of that
//! model take. A request that waited its class's deadline gets a 503. Overload then costs
//! the lowest class a fast, clear refusal instead of every client a hang.

pub mod class;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;
use tokio::time::Instant;

pub use class::{Class, Classes};

/// Admission settings.
#[derive(Debug, Clone, Copy)]
pub struct AdmissionSettings {
    /// Requests one healthy worker may have in flight from this router.
    pub max_inflight_per_worker: u32,
    /// Requests of one model that may wait for a slot.
    pub max_queued_per_model: usize,
    /// Each class's queue deadline and share.
    pub classes: Classes,
}

/// What a request asks of admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked {
    pub class: Class,
    /// A step of a conversation that already has an answer (an agent back from a tool):
    /// ahead of new conversations of its class.
    pub returning: bool,
}

/// Why a request was not admitted, with the seconds a client should wait before retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The model's queue is full of requests ranked at or above it (a 429).
    QueueFull { retry_after_s: u64 },
    /// It waited its class's deadline without a slot (a 503).
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

struct Gate {
    state: Mutex<GateState>,
    classes: Classes,
}

/// A waiter's place in the queue: class, then a returning step first, then deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    class: Class,
    new_conversation: bool,
    deadline: Instant,
    seq: u64,
}

type Handoff = oneshot::Sender<Result<Ticket, Refusal>>;

#[derive(Default)]
struct GateState {
    /// Slots held, per class.
    in_flight: [u32; 3],
    /// Slots in all, as of the latest request (healthy workers × the per-worker limit).
    capacity: u32,
    queue: BTreeMap<Place, Handoff>,
    seq: u64,
    /// Mean seconds a request holds its slot (EWMA), for `Retry-After`.
    mean_s: Option<f64>,
}

impl GateState {
    fn held(&self) -> u32 {
        self.in_flight.iter().sum()
    }

    /// Whether a request of `c` may take a slot now: for `c` and every class above it,
    /// that class with the classes below it holds less than its share (so a lower class
    /// never takes what a class above it could not).
    fn fits(&self, classes: &Classes, c: Class) -> bool {
        self.held() < self.capacity
            && Class::ALL[..=c.index()].iter().all(|k| {
                self.in_flight[k.index()..].iter().sum::<u32>() < classes.limit(*k, self.capacity)
            })
    }

    /// Seconds until the queue ahead has likely drained: the mean hold time × the waiting
    /// requests per slot (at least 1 s, at most a minute).
    fn retry_after(&self) -> u64 {
        let rounds = (self.queue.len() as f64 + 1.0) / f64::from(self.capacity.max(1));
        (self.mean_s.unwrap_or(1.0) * rounds)
            .ceil()
            .clamp(1.0, 60.0) as u64
    }
}

/// A slot; freed (and handed to the first waiter that fits) when dropped, with the time it
/// was held.
pub struct Ticket {
    gate: Arc<Gate>,
    class: Class,
    since: Instant,
    /// Whether dropping it frees its slot (a ticket nobody received was already undone).
    armed: bool,
}

impl Ticket {
    /// The class it was admitted in.
    pub fn class(&self) -> Class {
        self.class
    }

    /// A slot of class `class` at `gate`, counted by the caller.
    fn new(gate: &Arc<Gate>, class: Class) -> Self {
        Self {
            gate: gate.clone(),
            class,
            since: Instant::now(),
            armed: true,
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let held = self.since.elapsed().as_secs_f64();
        let mut st = self.gate.lock();
        let c = self.class.index();
        st.in_flight[c] = st.in_flight[c].saturating_sub(1);
        st.mean_s = Some(st.mean_s.map_or(held, |m| 0.9 * m + 0.1 * held));
        self.gate.hand_out(&mut st);
    }
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands free slots to the waiters in queue order, each as its class's share allows.
    fn hand_out(self: &Arc<Self>, st: &mut GateState) {
        if st.held() >= st.capacity || st.queue.is_empty() {
            return;
        }
        let places: Vec<Place> = st.queue.keys().copied().collect();
        for place in places {
            if st.held() >= st.capacity {
                break;
            }
            if !st.fits(&self.classes, place.class) {
                continue;
            }
            let Some(tx) = st.queue.remove(&place) else {
                continue;
            };
            st.in_flight[place.class.index()] += 1;
            if let Err(Ok(mut unclaimed)) = tx.send(Ok(Ticket::new(self, place.class))) {
                // The waiter left: undo its slot here (dropping it would lock again).
                unclaimed.armed = false;
                st.in_flight[place.class.index()] -= 1;
            }
        }
    }
}

/// A waiter's place, taken out of the queue if it leaves before being served.
struct Waiting<'a> {
    gate: &'a Gate,
    place: Place,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.gate.lock().queue.remove(&self.place);
    }
}

impl Admission {
    pub fn new(s: AdmissionSettings) -> Self {
        Self {
            s,
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// The class of a request that names none.
    pub fn default_class(&self) -> Class {
        self.s.classes.default
    }

    fn gate(&self, model: &str) -> Arc<Gate> {
        let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        gates
            .entry(model.to_owned())
            .or_insert_with(|| {
                Arc::new(Gate {
                    state: Mutex::default(),
                    classes: self.s.classes,
                })
            })
            .clone()
    }

    /// A slot for a request of `model`, served by `healthy_workers` now: at once, after a
    /// wait in the queue, or a refusal.
    pub async fn admit(
        &self,
        model: &str,
        healthy_workers: usize,
        asked: Asked,
    ) -> Result<Ticket, Refusal> {
        let gate = self.gate(model);
        let class = asked.class;
        let deadline = Instant::now() + self.s.classes.get(class).queue_timeout;
        let (place, mut rx) = {
            let mut st = gate.lock();
            st.capacity = (healthy_workers as u32)
                .saturating_mul(self.s.max_inflight_per_worker)
                .max(1);
            // Slots freed by more workers go to the waiters first.
            gate.hand_out(&mut st);
            if st.fits(&gate.classes, class) {
                st.in_flight[class.index()] += 1;
                return Ok(Ticket::new(&gate, class));
            }
            st.seq += 1;
            let place = Place {
                class,
                new_conversation: !asked.returning,
                deadline,
                seq: st.seq,
            };
            if st.queue.len() >= self.s.max_queued_per_model {
                let retry_after_s = st.retry_after();
                // Room is made by refusing the lowest-ranked waiter, if it ranks below.
                match st.queue.last_key_value().map(|(p, _)| *p) {
                    Some(worst) if place < worst => {
                        if let Some(tx) = st.queue.remove(&worst) {
                            let _ = tx.send(Err(Refusal::QueueFull { retry_after_s }));
                        }
                    }
                    _ => return Err(Refusal::QueueFull { retry_after_s }),
                }
            }
            let (tx, rx) = oneshot::channel();
            st.queue.insert(place, tx);
            (place, rx)
        };
        let _waiting = Waiting { gate: &gate, place };
        match tokio::time::timeout_at(deadline, &mut rx).await {
            Ok(Ok(served)) => served,
            // The gate never drops a waiter's sender unanswered; count it as a timeout.
            Ok(Err(_)) => Err(Refusal::TimedOut {
                retry_after_s: gate.lock().retry_after(),
            }),
            Err(_) => {
                let mut st = gate.lock();
                let removed = st.queue.remove(&place).is_some();
                let retry_after_s = st.retry_after();
                if removed {
                    return Err(Refusal::TimedOut { retry_after_s });
                }
                drop(st);
                // Served as it timed out: the answer is in the channel.
                rx.try_recv()
                    .unwrap_or(Err(Refusal::TimedOut { retry_after_s }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::class::ClassesTable;
    use super::*;

    fn admission(per_worker: u32, queued: usize, timeout_ms: u64) -> Arc<Admission> {
        let classes = ClassesTable::default()
            .resolve(Duration::from_millis(timeout_ms), Class::Interactive)
            .unwrap();
        Arc::new(Admission::new(AdmissionSettings {
            max_inflight_per_worker: per_worker,
            max_queued_per_model: queued,
            classes,
        }))
    }

    const NEW: Asked = Asked {
        class: Class::Interactive,
        returning: false,
    };

    fn asked(class: Class, returning: bool) -> Asked {
        Asked { class, returning }
    }

    /// Starts a waiter; its answer, once served, is `(label, admitted)` on `done`.
    fn wait(
        a: &Arc<Admission>,
        who: Asked,
        label: &'static str,
        done: &tokio::sync::mpsc::UnboundedSender<(&'static str, Result<Class, Refusal>)>,
    ) -> tokio::task::JoinHandle<()> {
        let (a, done) = (a.clone(), done.clone());
        tokio_util::task::TaskTracker::new().spawn(async move {
            let r = a.admit("m", 1, who).await;
            let _ = done.send((label, r.as_ref().map(Ticket::class).map_err(|e| *e)));
            // Hold the slot until the test ends.
            std::future::pending::<()>().await;
            drop(r);
        })
    }

    #[tokio::test(start_paused = true)]
    async fn slots_then_a_bounded_queue_then_fast_refusals() {
        let a = admission(2, 1, 1_000);
        let one = a.admit("m", 1, NEW).await.unwrap();
        let _two = a.admit("m", 1, NEW).await.unwrap();
        // The third waits; the fourth finds the queue full at once.
        let waiting = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, NEW).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(matches!(
            a.admit("m", 1, NEW).await,
            Err(Refusal::QueueFull { .. })
        ));
        // Another model has its own gate.
        let _other = a.admit("other", 1, NEW).await.unwrap();
        // A slot frees: the waiter gets it.
        drop(one);
        assert_eq!(waiting.await.unwrap(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_gives_up_at_its_deadline_with_a_retry_hint() {
        let a = admission(1, 4, 500);
        let _held = a.admit("m", 1, NEW).await.unwrap();
        let started = Instant::now();
        let refused = a.admit("m", 1, NEW).await.err().unwrap();
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert_eq!(refused, Refusal::TimedOut { retry_after_s: 1 });
        // More healthy workers, more slots.
        let _second = a.admit("m", 2, NEW).await.unwrap();
        // A batch request waits a minute, its class's deadline, not interactive's 500 ms.
        let started = Instant::now();
        let refused = a
            .admit("m", 2, asked(Class::Batch, false))
            .await
            .err()
            .unwrap();
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert!(matches!(refused, Refusal::TimedOut { .. }));
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_by_class_then_returning_steps_then_arrival() {
        let a = admission(1, 8, 600_000);
        let held = a.admit("m", 1, NEW).await.unwrap();
        let (done, mut served) = tokio::sync::mpsc::unbounded_channel();
        let mut tasks = Vec::new();
        for (who, label) in [
            (asked(Class::Background, true), "background"),
            (asked(Class::Batch, false), "batch"),
            (asked(Class::Interactive, false), "new"),
            (asked(Class::Interactive, true), "returning"),
        ] {
            tasks.push(wait(&a, who, label, &done));
            tokio::task::yield_now().await;
        }
        drop(held);
        let (first, r) = served.recv().await.unwrap();
        assert_eq!((first, r), ("returning", Ok(Class::Interactive)));
        // Each next one is served only when the slot is free again: the order holds.
        tasks.remove(3).abort();
        assert_eq!(served.recv().await.unwrap().0, "new");
        tasks.remove(2).abort();
        assert_eq!(served.recv().await.unwrap().0, "batch");
        tasks.remove(1).abort();
        assert_eq!(served.recv().await.unwrap().0, "background");
    }

    #[tokio::test(start_paused = true)]
    async fn lower_classes_hold_only_their_share_so_interactive_finds_a_slot() {
        // 4 slots: background may hold 2, batch and background together 3.
        let a = admission(4, 8, 1_000);
        let (bg, batch) = (asked(Class::Background, false), asked(Class::Batch, false));
        let _b1 = a.admit("m", 1, bg).await.unwrap();
        let _b2 = a.admit("m", 1, bg).await.unwrap();
        let third = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, bg).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(!third.is_finished(), "background is at its share");
        let _batch = a.admit("m", 1, batch).await.unwrap();
        let more_batch = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, batch).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(
            !more_batch.is_finished(),
            "batch with background is at its share"
        );
        let _i1 = a.admit("m", 1, NEW).await.unwrap();
        third.abort();
        more_batch.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn background_never_takes_a_slot_batch_could_not() {
        // 4 slots: batch and background together 3, background alone 2.
        let a = admission(4, 8, 600_000);
        let (bg, batch) = (asked(Class::Background, false), asked(Class::Batch, false));
        let _b1 = a.admit("m", 1, batch).await.unwrap();
        let _b2 = a.admit("m", 1, batch).await.unwrap();
        let _g1 = a.admit("m", 1, bg).await.unwrap();
        // Background holds 1 of its 2, but batch + background are at their 3.
        let next_bg = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, bg).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        assert!(!next_bg.is_finished());
        next_bg.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_sheds_its_lowest_class_first() {
        let a = admission(1, 2, 600_000);
        let _held = a.admit("m", 1, NEW).await.unwrap();
        let (done, mut served) = tokio::sync::mpsc::unbounded_channel();
        let _bg = wait(&a, asked(Class::Background, false), "background", &done);
        let _batch = wait(&a, asked(Class::Batch, false), "batch", &done);
        tokio::task::yield_now().await;
        // An interactive request takes the background waiter's place; it is told at once.
        let _new = wait(&a, NEW, "interactive", &done);
        let (who, r) = served.recv().await.unwrap();
        assert_eq!(who, "background");
        assert!(matches!(r, Err(Refusal::QueueFull { .. })));
        // A background request finds nothing ranked below it: refused itself.
        assert!(matches!(
            a.admit("m", 1, asked(Class::Background, false)).await,
            Err(Refusal::QueueFull { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_gives_back_its_place_and_no_slot_leaks() {
        let a = admission(1, 1, 600_000);
        let held = a.admit("m", 1, NEW).await.unwrap();
        let gone = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, NEW).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        gone.abort();
        let _ = gone.await;
        // Its place is free again: another may wait, and gets the slot when it frees.
        let next = {
            let a = a.clone();
            tokio_util::task::TaskTracker::new()
                .spawn(async move { a.admit("m", 1, NEW).await.map(|_| ()) })
        };
        tokio::task::yield_now().await;
        drop(held);
        assert_eq!(next.await.unwrap(), Ok(()));
        // All slots are back.
        let _again = a.admit("m", 1, NEW).await.unwrap();
    }
}
