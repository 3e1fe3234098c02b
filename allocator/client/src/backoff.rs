//! Waiting between attempts: capped exponential [`Backoff`] with equal jitter for reconnect and
//! retry loops, and [`jitter`] for periodic timers, so replicas that start together do not
//! campaign, retry or reconnect in lockstep.
//!
//! The one backoff of the workspace: this client's retries, the load generator's, and the
//! services' (the router's upstream retries, reconnects, campaigns; `edge` re-exports this
//! module). It lives here, in a crate without an HTTP server, so that a client does not link the
//! services' runtime to wait between attempts.

use std::time::Duration;

use rand::Rng;

/// Exponential backoff with equal jitter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay ceiling before jitter for the first retry.
    pub base: Duration,
    /// Largest delay; keeps the retry loop responsive inside the deadline.
    pub max: Duration,
}

impl Backoff {
    /// Reconnecting a background session (a Redis connection, a `LISTEN` session): soon at
    /// first, then at most every five seconds.
    pub const RECONNECT: Backoff = Backoff {
        base: Duration::from_millis(100),
        max: Duration::from_secs(5),
    };

    /// Upper bound of the delay before retry number `attempt` (0-based).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Upper bound of the delay before retry number `attempt` when the server asked for
    /// `retry_after` (`Retry-After`): the server's wait raises the ceiling, but never above
    /// [`Backoff::max`] (a `Retry-After: 1` must not idle a caller whose deadline is shorter), and
    /// never lowers it below the exponential one.
    pub fn ceiling_after(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let exponential = self.ceiling(attempt);
        retry_after.map_or(exponential, |wait| wait.min(self.max).max(exponential))
    }

    /// The delay before retry number `attempt`, given `unit` uniformly drawn from `[0, 1)`.
    /// Always within `[ceiling/2, ceiling]`.
    pub fn delay_with(&self, attempt: u32, unit: f64) -> Duration {
        spread(self.ceiling(attempt), unit)
    }

    /// [`Backoff::delay_with`] for a server that asked for `retry_after`: within
    /// `[c/2, c]` for `c =` [`Backoff::ceiling_after`].
    pub fn delay_after_with(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        unit: f64,
    ) -> Duration {
        spread(self.ceiling_after(attempt, retry_after), unit)
    }

    /// The delay before retry number `attempt` with fresh randomness.
    pub fn delay(&self, attempt: u32) -> Duration {
        self.delay_with(attempt, rand::random::<f64>())
    }
}

/// Equal jitter: `ceiling/2` plus a `unit` share of the other half; garbage randomness is clamped
/// rather than trusted.
fn spread(ceiling: Duration, unit: f64) -> Duration {
    let unit = if unit.is_finite() {
        unit.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let half = ceiling / 2;
    half + (ceiling - half).mul_f64(unit)
}

/// `period` scaled by a uniform factor in `[1 - spread, 1 + spread)`; `spread` is clamped to
/// `[0, 1)`.
pub fn jitter(period: Duration, spread: f64) -> Duration {
    let spread = if spread.is_finite() {
        spread.clamp(0.0, 0.99)
    } else {
        0.0
    };
    if spread == 0.0 {
        return period;
    }
    period.mul_f64(rand::rng().random_range(1.0 - spread..1.0 + spread))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backoff() -> Backoff {
        Backoff {
            base: Duration::from_millis(25),
            max: Duration::from_millis(500),
        }
    }

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap() {
        let b = backoff();
        let ceilings: Vec<u64> = (0..8).map(|a| b.ceiling(a).as_millis() as u64).collect();
        assert_eq!(ceilings, vec![25, 50, 100, 200, 400, 500, 500, 500]);
        // Huge attempt numbers neither overflow nor exceed the cap.
        assert_eq!(b.ceiling(u32::MAX), Duration::from_millis(500));
    }

    #[test]
    fn jitter_stays_within_half_to_full_ceiling() {
        let b = backoff();
        for attempt in 0..12 {
            let ceiling = b.ceiling(attempt);
            assert_eq!(b.delay_with(attempt, 0.0), ceiling / 2);
            assert_eq!(b.delay_with(attempt, 1.0), ceiling);
            for _ in 0..200 {
                let d = b.delay(attempt);
                assert!(d >= ceiling / 2 && d <= ceiling, "{d:?} outside bounds");
            }
        }
        // Garbage randomness is clamped rather than trusted.
        assert_eq!(b.delay_with(0, f64::NAN), Duration::from_micros(12_500));
        assert_eq!(b.delay_with(0, 7.0), Duration::from_millis(25));
        assert_eq!(b.delay_with(0, -1.0), Duration::from_micros(12_500));
    }

    #[test]
    fn retry_after_raises_the_ceiling_up_to_the_cap_and_never_lowers_it() {
        let b = backoff();
        // A server's wait beyond the exponential ceiling is honoured...
        assert_eq!(
            b.ceiling_after(0, Some(Duration::from_millis(300))),
            Duration::from_millis(300)
        );
        // ...up to the cap...
        assert_eq!(
            b.ceiling_after(0, Some(Duration::from_secs(1))),
            Duration::from_millis(500)
        );
        // ...and a shorter one does not shorten the exponential spacing.
        assert_eq!(
            b.ceiling_after(4, Some(Duration::ZERO)),
            Duration::from_millis(400)
        );
        assert_eq!(b.ceiling_after(2, None), b.ceiling(2));
        let wait = Some(Duration::from_secs(1));
        assert_eq!(b.delay_after_with(0, wait, 0.0), Duration::from_millis(250));
        assert_eq!(b.delay_after_with(0, wait, 1.0), Duration::from_millis(500));
    }

    #[test]
    fn jitter_actually_varies() {
        let b = backoff();
        let samples: std::collections::HashSet<Duration> = (0..50).map(|_| b.delay(4)).collect();
        assert!(
            samples.len() > 10,
            "jitter produced {} values",
            samples.len()
        );
    }

    #[test]
    fn a_jittered_period_stays_within_its_spread_and_varies() {
        let period = Duration::from_secs(1);
        let samples: std::collections::HashSet<Duration> =
            (0..200).map(|_| jitter(period, 0.2)).collect();
        for d in &samples {
            assert!(
                *d >= Duration::from_millis(800) && *d < Duration::from_millis(1200),
                "{d:?} outside 0.8..1.2 s"
            );
        }
        assert!(
            samples.len() > 10,
            "jitter produced {} values",
            samples.len()
        );
        // No spread, or garbage, leaves the period as it is.
        assert_eq!(jitter(period, 0.0), period);
        assert_eq!(jitter(period, f64::NAN), period);
    }
}
