//! How many group statements may run at once (DESIGN.md §6).
//!
//! A batch that waits for a lane waits for a whole statement, at ordinary load mostly a
//! commit's flush, during which the database's CPU idles: so while the database answers as fast
//! as it does when quiet, every ready batch gets a lane at once, up to the lanes there are. Only
//! when statements come back measurably slower than that quiet baseline (the database is busy)
//! does the limit shrink, in proportion to the slowdown: batches then queue, and the next lane to
//! start takes them all as one group, whose one statement shares its fixed cost. It never goes
//! below `min` (so one statement's commit overlaps another's work), and it is back at `max` as
//! soon as statements are quick again.
//!
//! The baseline is the lowest *smoothed* latency of the last two windows of statements, so one
//! lucky statement does not set it and a database that got slower (or faster) for good moves it.
//! "Measurably slower" means by a factor and by an absolute margin both, so sub-millisecond jitter
//! of a quiet database never closes a lane.
//!
//! Pure arithmetic over the latencies it is shown; [`Slots`] applies it to running lanes.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// A smoothed latency above this factor of the baseline counts as a busy database...
const TOLERANCE: f64 = 1.5;
/// ...if it is also this much above it.
const MARGIN: Duration = Duration::from_micros(500);
/// Weight of the newest statement in the smoothed latency.
const SMOOTHING: f64 = 1.0 / 8.0;
/// The baseline is taken over the last two windows of this many statements.
const WINDOW: u32 = 256;

#[derive(Debug, Clone)]
pub struct Concurrency {
    min: f64,
    max: f64,
    limit: f64,
    /// Exponentially smoothed statement latency, seconds.
    smoothed: Option<f64>,
    /// Lowest smoothed latency in this window and the one before, seconds.
    quiet: f64,
    quiet_before: f64,
    seen: u32,
}

impl Concurrency {
    /// Start with every lane open; `1 <= min <= max`.
    pub fn new(min: usize, max: usize) -> Self {
        let max = max.max(1) as f64;
        let min = (min.max(1) as f64).min(max);
        Self {
            min,
            max,
            limit: max,
            smoothed: None,
            quiet: f64::MAX,
            quiet_before: f64::MAX,
            seen: 0,
        }
    }

    /// Statements that may run at once now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// The quiet baseline: the lowest smoothed latency of the last two windows.
    fn baseline(&self) -> f64 {
        self.quiet.min(self.quiet_before)
    }

    /// A lane's statement took `latency`. Returns the new limit.
    pub fn observe(&mut self, latency: Duration) -> usize {
        let latency = latency.as_secs_f64();
        let smoothed = match self.smoothed {
            Some(s) => s + SMOOTHING * (latency - s),
            None => latency,
        };
        self.smoothed = Some(smoothed);
        self.seen += 1;
        if self.seen >= WINDOW {
            self.seen = 0;
            self.quiet_before = self.quiet;
            self.quiet = f64::MAX;
        }
        self.quiet = self.quiet.min(smoothed);
        let baseline = self.baseline();
        let busy = smoothed > TOLERANCE * baseline && smoothed - baseline > MARGIN.as_secs_f64();
        self.limit = if busy {
            // In proportion to the slowdown, at most halved per statement.
            let factor = (TOLERANCE * baseline / smoothed).clamp(0.5, 1.0);
            (self.limit * factor).max(self.min)
        } else {
            self.max
        };
        self.limit()
    }
}

/// The running statements' admission: a lane that has work asks for a slot before it takes its
/// group, and gives it back, with the statement's latency, when done. A lane refused a slot keeps
/// the queue to itself, so what arrives meanwhile joins its group.
#[derive(Debug)]
pub struct Slots {
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug)]
struct State {
    running: usize,
    concurrency: Concurrency,
}

impl Slots {
    pub fn new(concurrency: Concurrency) -> Self {
        Self {
            state: Mutex::new(State {
                running: 0,
                concurrency,
            }),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("slots lock poisoned")
    }

    /// Take a slot if fewer statements run than the limit allows.
    pub fn try_acquire(&self) -> bool {
        let mut state = self.lock();
        let open = state.running < state.concurrency.limit();
        if open {
            state.running += 1;
        }
        open
    }

    /// Wait until fewer statements run than the limit allows, and take a slot.
    pub async fn acquire(&self) {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_acquire() {
                return;
            }
            freed.await;
        }
    }

    /// Give a slot back after a statement that took `latency`; returns the new limit.
    pub fn release(&self, latency: Duration) -> usize {
        let limit = {
            let mut state = self.lock();
            state.running -= 1;
            state.concurrency.observe(latency)
        };
        self.freed.notify_waiters();
        limit
    }

    /// Give a slot back unused (its batch was withdrawn meanwhile).
    pub fn cancel(&self) {
        self.lock().running -= 1;
        self.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A quiet database: statements at `latency`, enough of them to settle the baseline.
    fn quiet(c: &mut Concurrency, latency: Duration) {
        for _ in 0..50 {
            c.observe(latency);
        }
    }

    #[test]
    fn every_lane_is_open_while_the_database_answers_as_fast_as_when_quiet() {
        let mut c = Concurrency::new(2, 8);
        assert_eq!(c.limit(), 8, "nothing seen yet: nothing to back off from");
        quiet(&mut c, 2 * MS);
        assert_eq!(c.limit(), 8);
        // More concurrent statements cost a little more each (a shared flush): not measurably
        // slower, so nothing closes.
        for _ in 0..50 {
            c.observe(2 * MS + MS / 2);
        }
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn sub_millisecond_jitter_of_a_quick_database_closes_nothing() {
        let mut c = Concurrency::new(2, 8);
        quiet(&mut c, MS / 5);
        // Three times the baseline, but 0.4 ms above it: within the margin.
        for _ in 0..50 {
            c.observe(3 * MS / 5);
        }
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn the_limit_shrinks_on_a_slow_database_and_grows_back_when_it_is_quick_again() {
        let mut c = Concurrency::new(2, 8);
        quiet(&mut c, 2 * MS);
        // The database is busy: statements take five times the baseline.
        let mut limits = Vec::new();
        for _ in 0..20 {
            limits.push(c.observe(10 * MS));
        }
        assert!(limits.windows(2).all(|w| w[1] <= w[0]), "{limits:?}");
        assert_eq!(c.limit(), 2, "down to the minimum: {limits:?}");
        // One quick statement does not undo a slow spell: the smoothed latency is still high.
        assert_eq!(c.observe(2 * MS), 2);
        // Quick again for good: every lane opens.
        quiet(&mut c, 2 * MS);
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn the_backoff_is_in_proportion_to_the_slowdown_and_at_most_halves() {
        let mut c = Concurrency::new(1, 16);
        quiet(&mut c, 2 * MS);
        // A smoothed latency of 2 + (8 - 2) / 8 = 2.75 ms: under 1.5 × 2 ms, nothing closes.
        assert_eq!(c.observe(8 * MS), 16);
        // However slow, at most halved per statement.
        assert_eq!(c.observe(200 * MS), 8);
    }

    #[test]
    fn the_baseline_follows_a_database_that_got_slower_for_good() {
        let mut c = Concurrency::new(2, 8);
        quiet(&mut c, MS);
        for _ in 0..(2 * WINDOW) {
            c.observe(20 * MS);
        }
        // Two windows later 20 ms is the quiet baseline: nothing is held back.
        c.observe(20 * MS);
        assert_eq!(c.limit(), 8);
    }

    #[tokio::test]
    async fn a_lone_batch_takes_an_idle_lane_at_once_while_others_run() {
        let slots = Slots::new(Concurrency::new(1, 4));
        for _ in 0..50 {
            assert!(slots.try_acquire());
            slots.release(2 * MS);
        }
        // Three statements run; a fourth batch arrives and finds the last lane.
        for _ in 0..3 {
            assert!(slots.try_acquire());
        }
        assert!(
            slots.try_acquire(),
            "a ready batch is not held behind an idle lane"
        );
        assert!(!slots.try_acquire(), "no more than the lanes there are");
        // A slot given back unused (its batch was withdrawn) teaches the limit nothing.
        slots.cancel();
        assert_eq!(slots.lock().concurrency.limit(), 4);
        assert_eq!(slots.lock().running, 3);
    }

    #[tokio::test]
    async fn on_a_slow_database_a_lane_waits_for_a_slot_and_its_batch_joins_a_group() {
        let slots = std::sync::Arc::new(Slots::new(Concurrency::new(1, 2)));
        for _ in 0..50 {
            slots.acquire().await;
            slots.release(2 * MS);
        }
        slots.acquire().await;
        // The database slowed down: the limit drops to one.
        assert_eq!(slots.release(50 * MS), 1);
        slots.acquire().await;
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await }
        });
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "the only slot is taken");
        slots.release(50 * MS);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the freed slot is taken")
            .unwrap();
    }
}
