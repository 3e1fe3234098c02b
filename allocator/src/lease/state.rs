//! The lease state machine of one partition, free of I/O.
//!
//! ```text
//! NotHeld --acquire ok(epoch)--> Active{epoch, safe_until = t0 + ttl - margin}
//! Active  --renew ok(t0)------> Active{safe_until = t0 + ttl - margin}
//! Active  --renew failed/ambiguous--> Uncertain   (stop admitting work, keep trying to renew)
//! Uncertain --renew ok(t0) before safe_until--> Active
//! Active|Uncertain --now >= safe_until | renew rejected | stall > margin--> NotHeld (lost)
//! ```
//!
//! `t0` is the monotonic instant taken *before* the acquire or renew request was sent: the
//! database may have started the lease at any moment while the request was in flight, so only
//! `t0` is a safe lower bound for its start. A renewal that the database rejected (zero rows) means
//! another holder may exist; one that failed or timed out is ambiguous and is treated as a
//! failure. A lost lease only comes back through a fresh acquire, which yields a newer epoch.

use std::time::{Duration, Instant};

/// Timing of every lease this replica holds, derived from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// Lease duration granted by the database (`expires_at = now() + ttl`).
    pub ttl: Duration,
    /// Subtracted from `t0 + ttl` to give the local safe deadline; covers clock-rate drift,
    /// scheduling delay between the deadline check and a write, and small pauses.
    pub margin: Duration,
    /// How often held leases are renewed (default `ttl / 3`). What it leaves of `ttl - margin`
    /// is shared by three renewal attempts, so two can fail and the third still lands in time.
    pub renew_interval: Duration,
}

impl LeaseTiming {
    pub fn new(ttl: Duration, margin: Duration, renew_interval: Duration) -> Result<Self, String> {
        if margin >= ttl {
            return Err("lease margin must be shorter than the lease ttl".into());
        }
        if renew_interval.is_zero()
            || renew_interval >= ttl - margin
            || Self::attempt_timeout(ttl, margin, renew_interval) < MIN_RENEW_ATTEMPT
        {
            return Err(format!(
                "renew interval must be positive and leave ttl - margin - interval >= \
                 {RENEW_ATTEMPTS} x {} ms for renewal attempts",
                MIN_RENEW_ATTEMPT.as_millis()
            ));
        }
        Ok(Self {
            ttl,
            margin,
            renew_interval,
        })
    }

    /// Last instant at which this replica may still act on a lease granted or renewed by a
    /// request sent at `t0`.
    pub fn safe_until(&self, t0: Instant) -> Instant {
        t0 + self.ttl - self.margin
    }

    /// How long one renewal attempt (waiting for a connection included) may run before it is
    /// given up as failed: the time between the regular renewal and the safe deadline, shared by
    /// [`RENEW_ATTEMPTS`] attempts. With the defaults (TTL 5 s, margin 1 s, interval 1.67 s) that
    /// is 778 ms.
    pub fn renew_attempt_timeout(&self) -> Duration {
        Self::attempt_timeout(self.ttl, self.margin, self.renew_interval)
    }

    fn attempt_timeout(ttl: Duration, margin: Duration, renew_interval: Duration) -> Duration {
        ttl.saturating_sub(margin).saturating_sub(renew_interval) / RENEW_ATTEMPTS
    }

    /// When the next renewal attempt starts, after one that started at `started` and ended at
    /// `ended`: one interval after a confirmed attempt *started* (its `t0` is what the deadline
    /// counts from), and right when a failed attempt's time is up (not earlier when it failed
    /// fast, so a refusing database is not hammered). So the k-th attempt after a confirmed
    /// renewal at `t0` ends by `t0 + interval + k × attempt timeout`, and the third by the safe
    /// deadline.
    pub fn next_renewal(&self, started: Instant, ended: Instant, confirmed: bool) -> Instant {
        if confirmed {
            started + self.renew_interval
        } else {
            (started + self.renew_attempt_timeout()).max(ended)
        }
    }
}

/// Renewal attempts that fit between the regular renewal and the safe deadline: two can fail or
/// time out and the third still lands in time.
pub const RENEW_ATTEMPTS: u32 = 3;

/// The shortest time an attempt may be given: a renewal is one round trip and, after a failure,
/// a new connection.
pub const MIN_RENEW_ATTEMPT: Duration = Duration::from_millis(20);

/// Why a lease was lost; a metric label, so keep the set small and stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossCause {
    /// The safe deadline passed without a confirmed renewal.
    Deadline,
    /// The database refused the renewal: the lease expired or a newer epoch exists.
    RenewRejected,
    /// The process stalled for longer than the margin.
    Stall,
    /// A transaction found the lease row naming another holder or epoch.
    Fenced,
    /// The partition's worker ended while it still had authority (a panic): nothing would serve
    /// the partition, so the lease is given up for a fresh acquisition with a new epoch.
    WorkerFailed,
}

impl LossCause {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Deadline => "deadline",
            Self::RenewRejected => "renew_rejected",
            Self::Stall => "stall",
            Self::Fenced => "fenced",
            Self::WorkerFailed => "worker_failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    NotHeld,
    Active {
        epoch: i64,
        safe_until: Instant,
    },
    /// The last renewal failed or was ambiguous: no new work is admitted, but nobody else can
    /// hold the lease before `safe_until` either, so a successful renewal restores `Active`.
    Uncertain {
        epoch: i64,
        safe_until: Instant,
    },
}

/// What a caller may do with a partition right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// Work may start under this epoch and must finish before `safe_until`.
    Granted {
        epoch: i64,
        safe_until: Instant,
    },
    /// The lease is held but unconfirmed: answer "try again shortly".
    Uncertain,
    NotHeld,
}

impl LeaseState {
    pub fn on_acquired(timing: &LeaseTiming, t0: Instant, epoch: i64) -> Self {
        LeaseState::Active {
            epoch,
            safe_until: timing.safe_until(t0),
        }
    }

    pub fn epoch(&self) -> Option<i64> {
        match *self {
            LeaseState::NotHeld => None,
            LeaseState::Active { epoch, .. } | LeaseState::Uncertain { epoch, .. } => Some(epoch),
        }
    }

    /// A renewal sent at `t0` was confirmed by the database.
    pub fn on_renewed(self, timing: &LeaseTiming, t0: Instant, now: Instant) -> Self {
        match self {
            LeaseState::Active { epoch, safe_until }
            | LeaseState::Uncertain { epoch, safe_until } => {
                // In-flight work was cancelled at the deadline; a confirmation arriving later
                // must not revive the lease. Only a fresh acquire (and a new epoch) may.
                if now >= safe_until {
                    return LeaseState::NotHeld;
                }
                let renewed = timing.safe_until(t0);
                LeaseState::Active {
                    epoch,
                    // Never move the deadline backwards because of a slow, older renewal.
                    safe_until: renewed.max(safe_until),
                }
            }
            LeaseState::NotHeld => LeaseState::NotHeld,
        }
    }

    /// The renewal failed or its outcome is unknown.
    pub fn on_renew_failed(self) -> Self {
        match self {
            LeaseState::Active { epoch, safe_until } => LeaseState::Uncertain { epoch, safe_until },
            other => other,
        }
    }

    /// Re-evaluate against the clock; returns the new state and, if authority was just lost, why.
    pub fn tick(self, now: Instant) -> (Self, Option<LossCause>) {
        match self {
            LeaseState::Active { safe_until, .. } | LeaseState::Uncertain { safe_until, .. }
                if now >= safe_until =>
            {
                (LeaseState::NotHeld, Some(LossCause::Deadline))
            }
            other => (other, None),
        }
    }

    pub fn authority(&self, now: Instant) -> Authority {
        if crate::negative_control::enabled() {
            // Negative control only: a tenure past its deadline or unconfirmed still writes.
            if let LeaseState::Active { epoch, .. } | LeaseState::Uncertain { epoch, .. } = *self {
                return Authority::Granted {
                    epoch,
                    safe_until: now + Duration::from_secs(3600),
                };
            }
        }
        match *self {
            LeaseState::Active { epoch, safe_until } if now < safe_until => {
                Authority::Granted { epoch, safe_until }
            }
            LeaseState::Active { .. } | LeaseState::Uncertain { .. } => Authority::Uncertain,
            LeaseState::NotHeld => Authority::NotHeld,
        }
    }
}

/// Detects process stalls (SIGSTOP, VM pause, long GC-like hiccups) from gaps between ticks that
/// are supposed to be `period` apart. A gap longer than `period + margin` means the process may
/// have been frozen past its safe deadline without noticing, so every lease must be dropped.
#[derive(Debug, Clone, Copy)]
pub struct StallWatchdog {
    period: Duration,
    margin: Duration,
    last_tick: Instant,
}

impl StallWatchdog {
    pub fn new(period: Duration, margin: Duration, now: Instant) -> Self {
        Self {
            period,
            margin,
            last_tick: now,
        }
    }

    /// Record a tick; returns the stall length if the gap exceeded the budget.
    pub fn observe(&mut self, now: Instant) -> Option<Duration> {
        let gap = now.saturating_duration_since(self.last_tick);
        self.last_tick = now;
        (gap > self.period + self.margin).then_some(gap)
    }
}

/// The timing the unit tests use: TTL 5 s, margin 1 s, renewal every 1.5 s.
#[cfg(test)]
pub(crate) fn test_timing() -> LeaseTiming {
    LeaseTiming::new(
        Duration::from_secs(5),
        Duration::from_secs(1),
        Duration::from_millis(1500),
    )
    .unwrap()
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
