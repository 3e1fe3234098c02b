//! Per-client limits: a rate limiter (GCRA, the `governor` crate: a token bucket of `burst`
//! refilled at `rate` per second) and a counter of requests in flight.
//!
//! [`ClientLimits`] keeps one limiter and one counter per client name. Its clock is a type
//! parameter: the services use governor's default (a TSC-based monotonic clock), the tests a
//! clock they move by hand.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

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

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// A client's limiter and the (per second, burst) it was made for.
struct Bucket<C: Clock> {
    limits: (f64, u32),
    limiter: Limiter<C>,
}

impl<C: Clock + Clone> Bucket<C> {
    /// A full bucket. `rate` must be positive and finite, `burst` at least 1 (the configuration
    /// refuses anything else); a rate beyond one per nanosecond is one per nanosecond.
    fn new((rate, burst): (f64, u32), clock: &C) -> Self {
        let period = Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::with_period(Duration::from_nanos(1)).expect("positive"))
            .allow_burst(NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN));
        Self {
            limits: (rate, burst),
            limiter: RateLimiter::direct_with_clock(quota, clock.clone()),
        }
    }
}

struct ClientState<C: Clock> {
    bucket: Option<Bucket<C>>,
    in_flight: Arc<AtomicUsize>,
}

/// Limiters and in-flight counters by client name. Names come from auth files (or, on an
/// allocator, from routers that authenticated them), so the map stays as small as the files.
pub struct ClientLimits<C: Clock = DefaultClock> {
    clock: C,
    clients: Mutex<HashMap<String, ClientState<C>>>,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self::with_clock(DefaultClock::default())
    }
}

impl<C: Clock> std::fmt::Debug for ClientLimits<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientLimits").finish_non_exhaustive()
    }
}

impl<C: Clock + Clone> ClientLimits<C> {
    pub fn with_clock(clock: C) -> Self {
        Self {
            clock,
            clients: Mutex::new(HashMap::new()),
        }
    }

    /// Admit one request of `client`: a slot below `concurrency` (if set) and a token from a
    /// bucket of `rate` = (per second, burst) (if set). The slot is freed when the returned guard
    /// is dropped; a request refused for its rate gives its slot back at once. Changed limits
    /// (an auth file reload) start the client's bucket anew, full at the new burst.
    pub fn admit(
        &self,
        client: &str,
        rate: Option<(f64, u32)>,
        concurrency: Option<usize>,
    ) -> Result<InFlight, Limited> {
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !clients.contains_key(client) {
            let fresh = ClientState {
                bucket: None,
                in_flight: Arc::default(),
            };
            clients.insert(client.to_owned(), fresh);
        }
        let state = clients.get_mut(client).expect("inserted above");
        let counter = state.in_flight.clone();
        let before = counter.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(counter);
        if let Some(limit) = concurrency {
            if before >= limit {
                return Err(Limited::Concurrency { limit });
            }
        }
        let Some(limits) = rate else {
            state.bucket = None;
            return Ok(guard);
        };
        let bucket = match &mut state.bucket {
            Some(bucket) if bucket.limits == limits => bucket,
            other => other.insert(Bucket::new(limits, &self.clock)),
        };
        match bucket.limiter.check() {
            Ok(()) => Ok(guard),
            Err(not_until) => Err(Limited::Rate {
                rate: limits.0,
                retry_after: retry_after_seconds(not_until.wait_time_from(self.clock.now())),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn limits() -> (FakeRelativeClock, ClientLimits<FakeRelativeClock>) {
        let clock = FakeRelativeClock::default();
        (clock.clone(), ClientLimits::with_clock(clock))
    }

    fn retry_after(result: Result<InFlight, Limited>) -> u64 {
        match result {
            Err(Limited::Rate { retry_after, .. }) => retry_after,
            other => panic!("expected a rate refusal, got {other:?}"),
        }
    }

    #[test]
    fn a_client_gets_the_burst_then_the_rate() {
        let (clock, limits) = limits();
        let rate = Some((2.0, 3));
        for _ in 0..3 {
            limits.admit("a", rate, None).unwrap();
        }
        // Empty: the next token comes after 1 / rate = 500 ms.
        assert_eq!(retry_after(limits.admit("a", rate, None)), 1);
        clock.advance(499 * MS);
        assert!(limits.admit("a", rate, None).is_err());
        clock.advance(MS);
        limits.admit("a", rate, None).unwrap();
        assert!(limits.admit("a", rate, None).is_err());
        // A long pause refills to the burst, not beyond.
        clock.advance(60_000 * MS);
        for _ in 0..3 {
            limits.admit("a", rate, None).unwrap();
        }
        assert!(limits.admit("a", rate, None).is_err());
    }

    #[test]
    fn slow_rates_ask_to_wait_longer_than_a_second() {
        let (clock, limits) = limits();
        let rate = Some((0.25, 1));
        limits.admit("a", rate, None).unwrap();
        assert_eq!(retry_after(limits.admit("a", rate, None)), 4);
        clock.advance(2500 * MS);
        // 1.5 s left, rounded up.
        assert_eq!(retry_after(limits.admit("a", rate, None)), 2);
        clock.advance(1500 * MS);
        limits.admit("a", rate, None).unwrap();
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
    fn changed_limits_start_a_new_bucket_and_unchanged_ones_keep_theirs() {
        let (_clock, limits) = limits();
        limits.admit("a", Some((1.0, 10)), None).unwrap();
        // A reload lowered the burst: the new bucket holds two.
        limits.admit("a", Some((1.0, 2)), None).unwrap();
        limits.admit("a", Some((1.0, 2)), None).unwrap();
        assert!(limits.admit("a", Some((1.0, 2)), None).is_err());
        // The same limits again (every request passes them): still empty.
        assert!(limits.admit("a", Some((1.0, 2)), None).is_err());
    }

    #[test]
    fn limits_are_per_client() {
        let (_clock, limits) = limits();
        let rate = Some((1.0, 2));
        let _a1 = limits.admit("a", rate, None).unwrap();
        let _a2 = limits.admit("a", rate, None).unwrap();
        assert_eq!(
            limits.admit("a", rate, None).unwrap_err(),
            Limited::Rate {
                rate: 1.0,
                retry_after: 1
            }
        );
        // Another client has its own bucket, and so may a client with its own rate.
        limits.admit("b", rate, None).unwrap();
        limits.admit("fast", Some((100.0, 5)), None).unwrap();
        // Without a rate nothing is counted against the bucket.
        for _ in 0..10 {
            limits.admit("c", None, None).unwrap();
        }
    }

    #[test]
    fn concurrency_slots_are_returned_on_drop() {
        let (_clock, limits) = limits();
        let first = limits.admit("a", None, Some(2)).unwrap();
        let second = limits.admit("a", None, Some(2)).unwrap();
        assert_eq!(
            limits.admit("a", None, Some(2)).unwrap_err(),
            Limited::Concurrency { limit: 2 }
        );
        // A refused request does not keep a slot.
        assert!(limits.admit("a", None, Some(2)).is_err());
        limits.admit("b", None, Some(2)).unwrap();
        drop(first);
        let third = limits.admit("a", None, Some(2)).unwrap();
        drop((second, third));
        let _again = limits.admit("a", None, Some(2)).unwrap();
    }

    #[test]
    fn a_rate_refusal_frees_its_slot() {
        let (clock, limits) = limits();
        let _held = limits.admit("a", Some((1.0, 1)), Some(2)).unwrap();
        assert!(matches!(
            limits.admit("a", Some((1.0, 1)), Some(2)),
            Err(Limited::Rate { .. })
        ));
        // Still one slot free: the refused request gave its slot back.
        clock.advance(1000 * MS);
        assert!(limits.admit("a", Some((1.0, 1)), Some(2)).is_ok());
    }
}
