//! How many group statements may run at once, adapted to the offered load (DESIGN.md §6).
//!
//! Two pulls: a batch that waits for a lane waits for a whole statement (at ordinary load that is
//! mostly a commit's flush, during which the database's CPU idles), so idle lanes should take it
//! at once; but every statement has a fixed cost, so under load fewer, larger groups cost the
//! database less per command than many small ones. The limit therefore follows what the
//! database answers: while statements come back about as fast as the quickest recent one (the
//! database is not the bottleneck) and batches were left waiting, one more may run; when they
//! slow down (the database is busy), the limit shrinks in proportion, batches queue, and the next
//! lane to start takes them all as one group. It never goes below `min` (so commits of one
//! statement overlap the work of another) or above `max` (the lanes there are).
//!
//! Pure arithmetic over the latencies it is shown; [`Slots`] applies it to running lanes.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// Statements within this factor of the quickest recent one count as uncontended.
const TOLERANCE: f64 = 2.0;
/// The quickest latency is taken over the last two windows of this many statements, so it
/// follows a database that got slower (or faster) for good.
const WINDOW: u32 = 256;

#[derive(Debug, Clone)]
pub struct Concurrency {
    min: f64,
    max: f64,
    limit: f64,
    quickest: Duration,
    quickest_before: Duration,
    seen: u32,
}

impl Concurrency {
    /// Start at `min`; `1 <= min <= max`.
    pub fn new(min: usize, max: usize) -> Self {
        let max = max.max(1) as f64;
        let min = (min.max(1) as f64).min(max);
        Self {
            min,
            max,
            limit: min,
            quickest: Duration::MAX,
            quickest_before: Duration::MAX,
            seen: 0,
        }
    }

    /// Statements that may run at once now.
    pub fn limit(&self) -> usize {
        self.limit as usize
    }

    /// A lane's statement took `latency`; `backlog` when batches were waiting as it finished.
    /// Returns the new limit.
    pub fn observe(&mut self, latency: Duration, backlog: bool) -> usize {
        self.seen += 1;
        if self.seen >= WINDOW {
            self.seen = 0;
            self.quickest_before = self.quickest;
            self.quickest = Duration::MAX;
        }
        self.quickest = self.quickest.min(latency);
        let quickest = self.quickest.min(self.quickest_before).as_secs_f64();
        let gradient = (TOLERANCE * quickest / latency.as_secs_f64().max(1e-6)).clamp(0.5, 1.0);
        let grow = if backlog && gradient >= 1.0 { 1.0 } else { 0.0 };
        self.limit = (self.limit * gradient + grow).clamp(self.min, self.max);
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
    /// Lanes with work that wait for a slot: batches are queueing behind the limit.
    waiting: usize,
    concurrency: Concurrency,
}

impl Slots {
    pub fn new(concurrency: Concurrency) -> Self {
        Self {
            state: Mutex::new(State {
                running: 0,
                waiting: 0,
                concurrency,
            }),
            freed: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("slots lock poisoned")
    }

    /// Wait until fewer statements run than the limit allows, and take a slot.
    pub async fn acquire(&self) {
        let mut counted = false;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.lock();
                if state.running < state.concurrency.limit() {
                    state.running += 1;
                    if counted {
                        state.waiting -= 1;
                    }
                    return;
                }
                if !counted {
                    state.waiting += 1;
                    counted = true;
                }
            }
            freed.await;
        }
    }

    /// Give a slot back after a statement that took `latency`; returns the new limit.
    pub fn release(&self, latency: Duration) -> usize {
        let limit = {
            let mut state = self.lock();
            state.running -= 1;
            let backlog = state.waiting > 0;
            state.concurrency.observe(latency, backlog)
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

    #[test]
    fn waiting_batches_open_lanes_while_statements_stay_quick() {
        let mut c = Concurrency::new(2, 8);
        assert_eq!(c.limit(), 2);
        for _ in 0..10 {
            c.observe(2 * MS, true);
        }
        assert_eq!(c.limit(), 8, "up to the lanes there are");
        // Nothing waiting: no reason to open more, none to close any.
        c.observe(2 * MS, false);
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn slow_statements_close_lanes_so_groups_grow() {
        let mut c = Concurrency::new(2, 8);
        for _ in 0..10 {
            c.observe(2 * MS, true);
        }
        // The database is busy: statements take five times the quickest.
        for _ in 0..3 {
            c.observe(10 * MS, true);
        }
        assert_eq!(c.limit(), 2, "down to the minimum, however much waits");
        // Quick again: lanes open one by one.
        c.observe(3 * MS, true);
        assert_eq!(c.limit(), 3);
    }

    #[test]
    fn nothing_waits_nothing_opens() {
        let mut c = Concurrency::new(1, 8);
        for _ in 0..100 {
            c.observe(MS, false);
        }
        assert_eq!(c.limit(), 1);
    }

    #[test]
    fn the_quickest_latency_follows_a_database_that_got_slower() {
        let mut c = Concurrency::new(2, 8);
        c.observe(MS, false);
        // Two windows later only the new, slower latencies count as the quickest.
        for _ in 0..(2 * WINDOW) {
            c.observe(20 * MS, false);
        }
        for _ in 0..6 {
            c.observe(20 * MS, true);
        }
        assert_eq!(c.limit(), 8);
    }

    #[test]
    fn lanes_open_one_at_a_time_and_close_in_proportion_to_the_slowdown() {
        let mut c = Concurrency::new(1, 8);
        c.observe(2 * MS, true);
        assert_eq!(c.limit(), 2, "one more per quick statement with a backlog");
        for _ in 0..6 {
            c.observe(2 * MS, true);
        }
        assert_eq!(c.limit(), 8);
        // Three times the quickest: the limit shrinks by 2/3, backlog or not.
        assert_eq!(c.observe(6 * MS, true), 5);
        // However slow, at most halved per statement.
        assert_eq!(c.observe(200 * MS, false), 2);
        // Within twice the quickest, without a backlog: unchanged.
        assert_eq!(c.observe(4 * MS, false), 2);
    }

    #[tokio::test]
    async fn a_lane_waiting_for_a_slot_is_the_backlog_that_opens_another() {
        let slots = std::sync::Arc::new(Slots::new(Concurrency::new(1, 4)));
        slots.acquire().await;
        // No lane waits: a quick statement opens nothing.
        assert_eq!(slots.release(MS), 1);
        slots.acquire().await;
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await }
        });
        for _ in 0..1000 {
            if slots.lock().waiting == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(slots.lock().waiting, 1, "the second lane waits");
        assert_eq!(slots.release(MS), 2, "a waiting lane opens one more");
        waiting.await.unwrap();
        // A slot given back unused (its batch was withdrawn) teaches the limit nothing.
        slots.acquire().await;
        slots.cancel();
        assert_eq!(slots.lock().concurrency.limit(), 2);
        assert_eq!(slots.lock().running, 1);
    }

    #[tokio::test]
    async fn a_lane_waits_for_a_slot_beyond_the_limit() {
        let slots = std::sync::Arc::new(Slots::new(Concurrency::new(1, 1)));
        slots.acquire().await;
        let waiting = tokio::spawn({
            let slots = slots.clone();
            async move { slots.acquire().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiting.is_finished(), "the only slot is taken");
        slots.release(MS);
        tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("the freed slot is taken")
            .unwrap();
    }
}
