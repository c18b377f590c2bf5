//! Token-bucket rate limits, one bucket per client (an API key's index, or one bucket for an
//! open API): each bucket holds up to `burst` requests and refills at `per_s`. Pure: the
//! caller passes the time, so tests need no clock and memory is one bucket per client.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A sustained rate with a burst allowance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Requests per second, sustained.
    pub per_s: f64,
    /// Requests a client may send at once after being idle (at least 1).
    pub burst: f64,
}

/// One client's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Takes one token at `now`, or says how long until one is there.
    fn take(&mut self, limit: RateLimit, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limit.per_s).min(limit.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - self.tokens) / limit.per_s))
    }
}

/// The buckets of `clients` clients under one limit.
#[derive(Debug)]
pub struct RateLimiter {
    limit: RateLimit,
    buckets: Mutex<Vec<Option<Bucket>>>,
}

impl RateLimiter {
    /// Buckets for clients `0..clients`, each full when first used. `None` when `limit`
    /// allows no traffic at all or is not finite (a config error caught before).
    pub fn new(limit: RateLimit, clients: usize) -> Option<Self> {
        let ok = limit.per_s.is_finite() && limit.per_s > 0.0 && limit.burst.is_finite();
        ok.then(|| Self {
            limit: RateLimit {
                per_s: limit.per_s,
                burst: limit.burst.max(1.0),
            },
            buckets: Mutex::new(vec![None; clients.max(1)]),
        })
    }

    /// Lets one request of `client` through at `now`, or refuses it with the time until
    /// its next token. A client index out of range shares the last bucket.
    pub fn take(&self, client: usize, now: Instant) -> Result<(), Duration> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let last = buckets.len() - 1;
        let bucket = buckets[client.min(last)].get_or_insert(Bucket {
            tokens: self.limit.burst,
            at: now,
        });
        bucket.take(self.limit, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(per_s: f64, burst: f64, clients: usize) -> RateLimiter {
        RateLimiter::new(RateLimit { per_s, burst }, clients).unwrap()
    }

    #[test]
    fn a_burst_then_the_sustained_rate_per_client() {
        let l = limiter(2.0, 3.0, 2);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.take(0, t0), Ok(()));
        }
        // Empty: the next token is half a second away.
        assert_eq!(l.take(0, t0), Err(Duration::from_millis(500)));
        // The other client has its own bucket.
        assert_eq!(l.take(1, t0), Ok(()));
        // Refilled at 2/s: one token after 0.5 s, not two.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(l.take(0, t1), Ok(()));
        assert!(l.take(0, t1).is_err());
        // A long idle refills only up to the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(l.take(0, t2), Ok(()));
        }
        assert!(l.take(0, t2).is_err());
    }

    #[test]
    fn over_any_span_a_client_gets_at_most_burst_plus_rate_times_span() {
        let l = limiter(10.0, 5.0, 1);
        let t0 = Instant::now();
        let mut passed = 0;
        // A request every millisecond for 2 s.
        for ms in 0..2_000 {
            if l.take(0, t0 + Duration::from_millis(ms)).is_ok() {
                passed += 1;
            }
        }
        assert!((24..=25).contains(&passed), "{passed}");
    }

    #[test]
    fn limits_that_pass_nothing_are_refused() {
        let none = |per_s, burst| RateLimiter::new(RateLimit { per_s, burst }, 1).is_none();
        assert!(none(0.0, 1.0));
        assert!(none(-1.0, 1.0));
        assert!(none(f64::NAN, 1.0));
        assert!(none(1.0, f64::INFINITY));
        // A burst below one still lets one request through.
        assert_eq!(limiter(1.0, 0.0, 1).take(0, Instant::now()), Ok(()));
    }
}
