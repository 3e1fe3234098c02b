//! Monotonic time, injectable so lease deadlines can be unit-tested without sleeping.
//!
//! Lease safety is measured only with monotonic instants taken on this process; wall clocks of
//! different machines are never compared (the database clock alone judges expiry).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
}

/// The process's monotonic clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that only moves when told to; for tests of deadline arithmetic and pauses.
#[derive(Debug, Clone)]
pub struct ManualClock {
    base: Instant,
    offset: Arc<Mutex<Duration>>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl ManualClock {
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            offset: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }

    pub fn advance(&self, by: Duration) {
        *self.offset.lock().expect("clock lock") += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.lock().expect("clock lock")
    }
}

/// Tick every `period` until `stop`, calling `on_tick(now, stall)`; `stall` is the gap since the
/// previous tick when it exceeded `period + margin` (see [`StallWatchdog`]).
///
/// Both lease watchdogs (partitions and the settlement job) run on this: they must never wait on
/// anything but the timer, so a slow database can neither look like a stall nor delay a deadline.
///
/// [`StallWatchdog`]: crate::lease::state::StallWatchdog
pub async fn watch(
    clock: &dyn Clock,
    period: Duration,
    margin: Duration,
    stop: &tokio_util::sync::CancellationToken,
    mut on_tick: impl FnMut(Instant, Option<Duration>),
) {
    let mut dog = crate::lease::state::StallWatchdog::new(period, margin, clock.now());
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = clock.now();
        on_tick(now, dog.observe(now));
    }
}
