//! Per-client limits: a token bucket for the request rate and a counter of requests in flight.
//!
//! The bucket is pure arithmetic over instants the caller passes in, so it is tested with a
//! made-up clock; [`ClientLimits`] keeps one bucket and one counter per client name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token bucket: `burst` requests at once, refilled at `rate` per second.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    updated: Instant,
}

impl TokenBucket {
    /// A full bucket. `rate` must be positive and finite, `burst` at least 1 (the configuration
    /// refuses anything else).
    pub fn new(rate: f64, burst: u32, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            updated: now,
        }
    }

    /// Change the rate and burst (after an auth file reload) keeping the tokens saved so far,
    /// capped at the new burst.
    pub fn reconfigure(&mut self, rate: f64, burst: u32, now: Instant) {
        self.refill(now);
        self.rate = rate;
        self.burst = f64::from(burst);
        self.tokens = self.tokens.min(self.burst);
    }

    pub fn same_limits(&self, rate: f64, burst: u32) -> bool {
        self.rate == rate && self.burst == f64::from(burst)
    }

    fn refill(&mut self, now: Instant) {
        // An instant before the last one (callers on several threads) adds nothing.
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        if now > self.updated {
            self.updated = now;
        }
    }

    /// Take one token, or say how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }
}

/// Whole seconds for `Retry-After`: rounded up (a client that waits that long finds a token),
/// and at least 1 (0 would invite an immediate retry).
pub fn retry_after_seconds(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Why a request was refused by a limit.
#[derive(Debug, Clone, PartialEq)]
pub enum Limited {
    Rate { rate: f64, retry_after: u64 },
    Concurrency { limit: usize },
}

/// Holds one of a client's in-flight slots until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Default)]
struct ClientState {
    bucket: Option<TokenBucket>,
    in_flight: Arc<AtomicUsize>,
}

/// Buckets and in-flight counters by client name. Names come from auth files (or, on an
/// allocator, from routers that authenticated them), so the map stays as small as the files.
#[derive(Debug, Default)]
pub struct ClientLimits {
    clients: Mutex<HashMap<String, ClientState>>,
}

impl ClientLimits {
    /// Admit one request of `client`: a slot below `concurrency` (if set) and a token from a
    /// bucket of `rate` = (per second, burst) (if set). The slot is freed when the returned guard
    /// is dropped; a request refused for its rate gives its slot back at once.
    pub fn admit(
        &self,
        client: &str,
        rate: Option<(f64, u32)>,
        concurrency: Option<usize>,
        now: Instant,
    ) -> Result<InFlight, Limited> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let state = clients.entry(client.to_owned()).or_default();
        let counter = state.in_flight.clone();
        let before = counter.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(counter);
        if let Some(limit) = concurrency {
            if before >= limit {
                return Err(Limited::Concurrency { limit });
            }
        }
        match (rate, &mut state.bucket) {
            (None, bucket) => *bucket = None,
            (Some((per_sec, burst)), Some(bucket)) => {
                if !bucket.same_limits(per_sec, burst) {
                    bucket.reconfigure(per_sec, burst, now);
                }
            }
            (Some((per_sec, burst)), bucket @ None) => {
                *bucket = Some(TokenBucket::new(per_sec, burst, now))
            }
        }
        if let (Some(bucket), Some((per_sec, _))) = (&mut state.bucket, rate) {
            if let Err(wait) = bucket.take(now) {
                return Err(Limited::Rate {
                    rate: per_sec,
                    retry_after: retry_after_seconds(wait),
                });
            }
        }
        Ok(guard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn bucket_allows_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 3, t0);
        for _ in 0..3 {
            bucket.take(t0).unwrap();
        }
        // Empty: the next token comes after 1 / rate = 500 ms.
        assert_eq!(bucket.take(t0), Err(Duration::from_millis(500)));
        assert_eq!(bucket.take(at(t0, 200)), Err(Duration::from_millis(300)));
        bucket.take(at(t0, 500)).unwrap();
        assert!(bucket.take(at(t0, 500)).is_err());
        // A long pause refills to the burst, not beyond.
        let later = at(t0, 60_000);
        for _ in 0..3 {
            bucket.take(later).unwrap();
        }
        assert!(bucket.take(later).is_err());
    }

    #[test]
    fn an_earlier_instant_adds_nothing() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 1, at(t0, 1000));
        bucket.take(at(t0, 1000)).unwrap();
        assert!(bucket.take(t0).is_err());
        assert!(bucket.take(at(t0, 1500)).is_err());
        bucket.take(at(t0, 2000)).unwrap();
    }

    #[test]
    fn slow_rates_wait_longer_than_a_second() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(0.25, 1, t0);
        bucket.take(t0).unwrap();
        let wait = bucket.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_secs(4));
        assert_eq!(retry_after_seconds(wait), 4);
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_seconds(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn reconfigure_caps_saved_tokens() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(1.0, 10, t0);
        bucket.reconfigure(1.0, 2, t0);
        bucket.take(t0).unwrap();
        bucket.take(t0).unwrap();
        assert!(bucket.take(t0).is_err());
    }

    #[test]
    fn limits_are_per_client() {
        let limits = ClientLimits::default();
        let t0 = Instant::now();
        let rate = Some((1.0, 2));
        let _a1 = limits.admit("a", rate, None, t0).unwrap();
        let _a2 = limits.admit("a", rate, None, t0).unwrap();
        assert_eq!(
            limits.admit("a", rate, None, t0).unwrap_err(),
            Limited::Rate {
                rate: 1.0,
                retry_after: 1
            }
        );
        // Another client has its own bucket.
        limits.admit("b", rate, None, t0).unwrap();
        // Without a rate nothing is counted against the bucket.
        for _ in 0..10 {
            limits.admit("c", None, None, t0).unwrap();
        }
    }

    #[test]
    fn concurrency_slots_are_returned_on_drop() {
        let limits = ClientLimits::default();
        let t0 = Instant::now();
        let first = limits.admit("a", None, Some(2), t0).unwrap();
        let second = limits.admit("a", None, Some(2), t0).unwrap();
        assert_eq!(
            limits.admit("a", None, Some(2), t0).unwrap_err(),
            Limited::Concurrency { limit: 2 }
        );
        // A refused request does not keep a slot.
        assert!(limits.admit("a", None, Some(2), t0).is_err());
        limits.admit("b", None, Some(2), t0).unwrap();
        drop(first);
        let third = limits.admit("a", None, Some(2), t0).unwrap();
        drop((second, third));
        let _again = limits.admit("a", None, Some(2), t0).unwrap();
    }

    #[test]
    fn a_rate_refusal_frees_its_slot() {
        let limits = ClientLimits::default();
        let t0 = Instant::now();
        let _held = limits.admit("a", Some((1.0, 1)), Some(2), t0).unwrap();
        assert!(matches!(
            limits.admit("a", Some((1.0, 1)), Some(2), t0),
            Err(Limited::Rate { .. })
        ));
        // Still one slot free: the refused request gave its slot back.
        assert!(limits
            .admit("a", Some((1.0, 1)), Some(2), at(t0, 1000))
            .is_ok());
    }
}
