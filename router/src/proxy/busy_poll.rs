//! Busy polling: for a short window after each request's activity, the runtime checks its
//! sockets without parking, so the worker's answer, and the client's next request on a
//! kept-alive connection, find the router's thread awake.
//!
//! Why: a parked thread is woken by the kernel when its socket becomes readable. On a VM
//! whose idle vCPUs halt, that wake-up costs tens to hundreds of microseconds (the
//! `bench proxy --peers` c1 case: a request through any proxy, nginx included, adds
//! 50–250 µs to `direct`'s 11–40 µs, most of it the two wake-ups per request). While a
//! task keeps yielding, tokio's scheduler polls its I/O driver with a zero timeout
//! instead of blocking in `epoll_wait`; this module's task does that for at most `window`
//! after the last [`BusyPoll::touch`], then parks until the next one.
//!
//! What it costs: at most `window` of one core's time per request when nothing else runs.
//! It polls only while at most one request is being handled: with several, their events
//! wake the thread anyway and share the wake-ups (polling between them too, the 2 KB c32
//! case ran at 22K req/s against 29K without polling). It yields the core while a prompt
//! is tokenized on the blocking pool ([`run`]'s `handing_off`): on a router given one
//! core, spinning beside that thread would slow it. `router.busy_poll_us = 0` turns it off.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// When the runtime last had request activity, and the task polling after it.
#[derive(Debug)]
pub struct BusyPoll {
    window_ns: u64,
    epoch: Instant,
    /// Nanoseconds after `epoch` of the last touch.
    last_ns: AtomicU64,
    spinning: AtomicBool,
    wake: Notify,
    /// Requests being handled now ([`BusyPoll::handling`]).
    requests: AtomicUsize,
}

/// A request being handled: counted, and a touch when it starts and when it ends.
pub struct Handling<'a>(&'a BusyPoll);

impl Drop for Handling<'_> {
    fn drop(&mut self) {
        self.0.requests.fetch_sub(1, Ordering::Relaxed);
        self.0.touch();
    }
}

impl BusyPoll {
    /// Polls for `window` after each touch (a zero window: never).
    pub fn new(window: Duration) -> Self {
        Self {
            window_ns: u64::try_from(window.as_nanos()).unwrap_or(u64::MAX),
            epoch: Instant::now(),
            last_ns: AtomicU64::new(0),
            spinning: AtomicBool::new(false),
            wake: Notify::new(),
            requests: AtomicUsize::new(0),
        }
    }

    /// A request starts being handled; its answer is relayed when the guard drops, and a
    /// kept-alive client's next request follows.
    pub fn handling(&self) -> Handling<'_> {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.touch();
        Handling(self)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Request activity now: keep polling for the window from here.
    fn touch(&self) {
        if self.window_ns == 0 {
            return;
        }
        self.last_ns.store(self.now_ns(), Ordering::Relaxed);
        // With several requests handled it would not poll: no need to wake it.
        if self.requests.load(Ordering::Relaxed) <= 1 && !self.spinning.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Inside the window of the last touch, with at most one request being handled.
    fn worth_polling(&self) -> bool {
        self.requests.load(Ordering::Relaxed) <= 1
            && self
                .now_ns()
                .saturating_sub(self.last_ns.load(Ordering::Relaxed))
                < self.window_ns
    }
}

/// Polls after every touch of `poll` until `shutdown`, while `handing_off()` says no
/// prompt is being tokenized off this thread. Spawn it on the runtime that serves requests.
pub async fn run(poll: &BusyPoll, handing_off: impl Fn() -> bool, shutdown: &CancellationToken) {
    if poll.window_ns == 0 {
        return;
    }
    let keep_polling = || poll.worth_polling() && !handing_off() && !shutdown.is_cancelled();
    loop {
        tokio::select! {
            () = poll.wake.notified() => {}
            () = shutdown.cancelled() => return,
        }
        loop {
            poll.spinning.store(true, Ordering::SeqCst);
            while keep_polling() {
                // Deferred until the scheduler has polled its driver without blocking.
                tokio::task::yield_now().await;
            }
            poll.spinning.store(false, Ordering::SeqCst);
            // A touch that still saw `spinning` set did not notify: look once more.
            if !keep_polling() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    // Real time: the window is read from the clock the router runs on.
    #[tokio::test(flavor = "current_thread")]
    async fn a_touch_keeps_the_thread_polling_for_its_window_then_it_parks() {
        let poll = Arc::new(BusyPoll::new(Duration::from_millis(30)));
        let shutdown = CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        {
            let (poll, shutdown) = (poll.clone(), shutdown.clone());
            tasks.spawn(async move { run(&poll, || false, &shutdown).await });
        }
        tasks.close();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!poll.spinning.load(Ordering::SeqCst), "no touch yet");

        poll.touch();
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(poll.spinning.load(Ordering::SeqCst), "inside the window");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(!poll.spinning.load(Ordering::SeqCst), "past the window");

        poll.touch();
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(poll.spinning.load(Ordering::SeqCst), "touched again");
        shutdown.cancel();
        tasks.wait().await;
        assert!(!poll.spinning.load(Ordering::SeqCst));
    }

    #[test]
    fn it_polls_only_while_at_most_one_request_is_handled() {
        let poll = BusyPoll::new(Duration::from_secs(60));
        let one = poll.handling();
        assert!(poll.worth_polling());
        let two = poll.handling();
        assert!(
            !poll.worth_polling(),
            "two requests: their events wake the thread"
        );
        drop(two);
        assert!(poll.worth_polling());
        drop(one);
        assert!(poll.worth_polling(), "the window after the last answer");
        assert_eq!(poll.requests.load(Ordering::Relaxed), 0);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_hand_off_stops_the_polling_and_a_zero_window_never_starts_it() {
        let poll = BusyPoll::new(Duration::from_secs(60));
        let shutdown = CancellationToken::new();
        poll.touch();
        // Handing off: the loop ends without polling and waits for the next touch.
        let waited =
            tokio::time::timeout(Duration::from_millis(20), run(&poll, || true, &shutdown)).await;
        assert!(waited.is_err(), "it parks, waiting for a touch");
        assert!(!poll.spinning.load(Ordering::SeqCst));

        let off = BusyPoll::new(Duration::ZERO);
        off.touch();
        run(&off, || false, &shutdown).await; // returns at once
    }
}
