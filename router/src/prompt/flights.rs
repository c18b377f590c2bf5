//! Long prompts' computations in flight (tokenizing and hashing a prompt of many KB):
//!
//! - **Single flight.** Requests whose input digest is the same (the same prompt sent by
//!   many clients at once, a retry) share one computation: the first starts it, the others
//!   wait for its result.
//! - **Bounded.** Computations run on at most `threads` blocking threads; at most `max`
//!   are in flight (running or waiting for a thread), and one more is refused at once, so a
//!   burst of cold long prompts cannot queue without end.
//! - **Waited for within a limit.** A request waits at most `timeout` for its result.
//! - **Kept whatever the waiters do.** A computation runs to its end and hands its result
//!   to `done` (the prompt cache) even when every request waiting for it has gone (a
//!   client that gave up): the next request with that input finds it computed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Semaphore};
use tokio_util::task::TaskTracker;

/// How computations run.
#[derive(Debug, Clone, Copy)]
pub struct FlightSettings {
    /// Blocking threads computing at once.
    pub threads: usize,
    /// Computations in flight (running or waiting for a thread) at most.
    pub max: usize,
    /// Longest a request waits for its computation.
    pub timeout: Duration,
}

impl Default for FlightSettings {
    /// One thread per core, 256 in flight, 10 s.
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, usize::from),
            max: 256,
            timeout: Duration::from_secs(10),
        }
    }
}

/// Why a request got no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlightError<E> {
    #[error("{max} prompts are already being tokenized or waiting to be")]
    Full { max: usize },
    #[error("tokenizing the prompt did not finish within {after:?}")]
    TimedOut { after: Duration },
    #[error("the tokenizing task failed: {0}")]
    Lost(String),
    /// The computation's own error.
    #[error("{0}")]
    Work(E),
}

/// What waiters of one computation see: nothing yet, then its outcome.
type Outcome<T, E> = Option<Result<Arc<T>, FlightError<E>>>;

/// Computations of `T` (failing with `E`) keyed by input digest.
pub struct PromptFlights<T, E> {
    settings: FlightSettings,
    threads: Arc<Semaphore>,
    state: Arc<Mutex<State<T, E>>>,
    /// The computations' tasks (they outlive the requests that started them).
    tasks: TaskTracker,
}

struct State<T, E> {
    /// Digest → the outcome of its computation in flight (digest 0: never shared).
    by_digest: HashMap<u128, watch::Receiver<Outcome<T, E>>>,
    /// Computations in flight, shared or not.
    in_flight: usize,
}

impl<T, E> PromptFlights<T, E>
where
    T: Send + Sync + 'static,
    E: std::fmt::Display + Clone + Send + Sync + 'static,
{
    pub fn new(settings: FlightSettings) -> Self {
        Self {
            settings,
            threads: Arc::new(Semaphore::new(settings.threads.max(1))),
            state: Arc::new(Mutex::new(State {
                by_digest: HashMap::new(),
                in_flight: 0,
            })),
            tasks: TaskTracker::new(),
        }
    }

    /// Computations in flight now.
    pub fn in_flight(&self) -> usize {
        self.lock().in_flight
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State<T, E>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The result of `work` for input `digest`: joins the computation of that digest in
    /// flight, else starts `work` on the blocking pool, handing its result to `done` when
    /// it ends (whether or not anyone still waits). `digest` 0 is never shared.
    pub async fn run<W, D>(&self, digest: u128, work: W, done: D) -> Result<Arc<T>, FlightError<E>>
    where
        W: FnOnce() -> Result<T, E> + Send + 'static,
        D: FnOnce(&Arc<T>) + Send + 'static,
    {
        let mut outcome = {
            let mut st = self.lock();
            match st.by_digest.get(&digest).filter(|_| digest != 0) {
                Some(flight) => flight.clone(),
                None => {
                    if st.in_flight >= self.settings.max.max(1) {
                        return Err(FlightError::Full {
                            max: self.settings.max.max(1),
                        });
                    }
                    st.in_flight += 1;
                    let (tx, rx) = watch::channel(None);
                    if digest != 0 {
                        st.by_digest.insert(digest, rx.clone());
                    }
                    self.start(digest, tx, work, done);
                    rx
                }
            }
        };
        let after = self.settings.timeout;
        let seen = match tokio::time::timeout(after, outcome.wait_for(Option::is_some)).await {
            Ok(Ok(seen)) => seen.clone(),
            Ok(Err(_)) => None,
            Err(_) => return Err(FlightError::TimedOut { after }),
        };
        seen.unwrap_or_else(|| Err(FlightError::Lost("ended without an outcome".into())))
    }

    /// Runs `work` once a thread is free, then publishes its outcome.
    fn start<W, D>(&self, digest: u128, tx: watch::Sender<Outcome<T, E>>, work: W, done: D)
    where
        W: FnOnce() -> Result<T, E> + Send + 'static,
        D: FnOnce(&Arc<T>) + Send + 'static,
    {
        let (threads, state) = (self.threads.clone(), self.state.clone());
        self.tasks.spawn(async move {
            let outcome = match threads.acquire_owned().await {
                Ok(permit) => match tokio::task::spawn_blocking(move || {
                    let out = work();
                    drop(permit);
                    out
                })
                .await
                {
                    Ok(Ok(value)) => {
                        let value = Arc::new(value);
                        done(&value);
                        Ok(value)
                    }
                    Ok(Err(e)) => Err(FlightError::Work(e)),
                    Err(e) => Err(FlightError::Lost(e.to_string())),
                },
                Err(_) => Err(FlightError::Lost("the tokenizing pool is closed".into())),
            };
            {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                st.in_flight -= 1;
                if digest != 0 {
                    st.by_digest.remove(&digest);
                }
            }
            let _ = tx.send(Some(outcome));
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    use super::*;

    fn flights(threads: usize, max: usize, timeout_ms: u64) -> Arc<PromptFlights<u64, String>> {
        Arc::new(PromptFlights::new(FlightSettings {
            threads,
            max,
            timeout: Duration::from_millis(timeout_ms),
        }))
    }

    /// Work that takes `ms` and counts its runs.
    fn slow(
        runs: &Arc<AtomicUsize>,
        ms: u64,
        value: u64,
    ) -> impl FnOnce() -> Result<u64, String> + Send + 'static {
        let runs = runs.clone();
        move || {
            runs.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(ms));
            Ok(value)
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn concurrent_requests_with_one_digest_share_one_computation() {
        let f = flights(1, 64, 5_000);
        let runs = Arc::new(AtomicUsize::new(0));
        let kept = Arc::new(AtomicUsize::new(0));
        let mut waiting = Vec::new();
        for _ in 0..16 {
            let (f, runs, kept) = (f.clone(), runs.clone(), kept.clone());
            waiting.push(TaskTracker::new().spawn(async move {
                let done = move |_: &Arc<u64>| {
                    kept.fetch_add(1, Ordering::SeqCst);
                };
                f.run(7, slow(&runs, 50, 42), done).await
            }));
        }
        let started = Instant::now();
        for w in waiting {
            assert_eq!(*w.await.unwrap().unwrap(), 42);
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "one computation for one digest"
        );
        assert_eq!(kept.load(Ordering::SeqCst), 1);
        assert!(started.elapsed() < Duration::from_millis(500));
        assert_eq!(f.in_flight(), 0);
        // Done: the next request computes again (the cache, not this, keeps results).
        let runs2 = Arc::new(AtomicUsize::new(0));
        f.run(7, slow(&runs2, 1, 43), |_| ()).await.unwrap();
        assert_eq!(runs2.load(Ordering::SeqCst), 1);
        // Digest 0 is never shared.
        let zero = Arc::new(AtomicUsize::new(0));
        let (a, b) = tokio::join!(
            f.run(0, slow(&zero, 10, 1), |_| ()),
            f.run(0, slow(&zero, 10, 1), |_| ())
        );
        assert!(a.is_ok() && b.is_ok());
        assert_eq!(zero.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_computation_ends_and_is_kept_when_its_waiter_gives_up() {
        let f = flights(1, 64, 20);
        let runs = Arc::new(AtomicUsize::new(0));
        let kept = Arc::new(AtomicUsize::new(0));
        let k = kept.clone();
        let err = f
            .run(9, slow(&runs, 200, 5), move |v: &Arc<u64>| {
                k.store(usize::try_from(**v).unwrap(), Ordering::SeqCst);
            })
            .await
            .unwrap_err();
        assert_eq!(
            err,
            FlightError::TimedOut {
                after: Duration::from_millis(20)
            }
        );
        assert!(err.to_string().contains("did not finish within 20ms"));
        // The computation goes on without its waiter and hands its result over.
        let deadline = Instant::now() + Duration::from_secs(5);
        while kept.load(Ordering::SeqCst) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(kept.load(Ordering::SeqCst), 5);
        assert_eq!(f.in_flight(), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn beyond_its_bound_a_computation_is_refused_at_once_and_errors_reach_every_waiter() {
        let f = flights(1, 2, 5_000);
        let runs = Arc::new(AtomicUsize::new(0));
        let (fa, fb, ra, rb) = (f.clone(), f.clone(), runs.clone(), runs.clone());
        let tasks = TaskTracker::new();
        let a = tasks.spawn(async move { fa.run(1, slow(&ra, 100, 1), |_| ()).await });
        let b = tasks.spawn(async move { fb.run(2, slow(&rb, 100, 2), |_| ()).await });
        tokio::task::yield_now().await;
        assert_eq!(f.in_flight(), 2);
        let started = Instant::now();
        let refused = f.run(3, slow(&runs, 100, 3), |_| ()).await.unwrap_err();
        assert_eq!(refused, FlightError::Full { max: 2 });
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "refused at once"
        );
        // A third request for a digest in flight joins it: no new computation.
        assert_eq!(*f.run(2, slow(&runs, 100, 9), |_| ()).await.unwrap(), 2);
        assert_eq!(*a.await.unwrap().unwrap(), 1);
        assert_eq!(*b.await.unwrap().unwrap(), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // The work's own error reaches every waiter of the flight.
        let failing = || Err::<u64, String>("bad template".into());
        let (x, y) = tokio::join!(f.run(4, failing, |_| ()), f.run(4, failing, |_| ()));
        assert_eq!(x.unwrap_err(), FlightError::Work("bad template".into()));
        assert_eq!(y.unwrap_err(), FlightError::Work("bad template".into()));
    }
}
