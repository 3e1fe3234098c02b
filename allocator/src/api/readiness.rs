//! `/readyz`'s database check, cheap and bounded: `/readyz` is open (no token), so anyone may
//! call it as often as they like, and it must not cost the API a connection each time.
//!
//! The check runs on a pool of its own with one connection ([`Readiness::new`]), never the
//! request pool; at most one check runs at a time, bounded by [`CHECK_BUDGET`]; and its result,
//! good or bad, answers every `/readyz` for [`RESULT_MAX_AGE`]. A burst of probes therefore costs
//! at most one `SELECT 1` a second on one connection, whatever its size.

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use deadpool_postgres::Pool;

use crate::clock::{Clock, SystemClock};
use crate::metrics as m;

/// How long one check's result answers `/readyz`.
pub const RESULT_MAX_AGE: Duration = Duration::from_secs(1);
/// How long one check may take (a connection from its pool and `SELECT 1`).
pub const CHECK_BUDGET: Duration = Duration::from_secs(1);

/// The last result, and one check at a time. The clock is injectable for the unit tests.
pub struct CachedCheck<C: Clock = SystemClock> {
    clock: C,
    max_age: Duration,
    last: Mutex<Option<(Instant, Result<(), String>)>>,
    running: tokio::sync::Mutex<()>,
}

impl<C: Clock> CachedCheck<C> {
    pub fn new(clock: C, max_age: Duration) -> Self {
        CachedCheck {
            clock,
            max_age,
            last: Mutex::new(None),
            running: tokio::sync::Mutex::new(()),
        }
    }

    fn fresh(&self) -> Option<Result<(), String>> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let (at, result) = last.as_ref()?;
        (self.clock.now().saturating_duration_since(*at) < self.max_age).then(|| result.clone())
    }

    /// The last result if it is fresh; otherwise `check`'s, run by this caller or by the one
    /// already running it (callers that arrive meanwhile wait for it and take its result).
    pub async fn get<F, Fut>(&self, check: F) -> Result<(), String>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        if let Some(result) = self.fresh() {
            return result;
        }
        let _one_at_a_time = self.running.lock().await;
        if let Some(result) = self.fresh() {
            return result;
        }
        let result = check().await;
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((self.clock.now(), result.clone()));
        result
    }
}

/// The database half of `/readyz`.
pub struct Readiness {
    pool: Pool,
    cache: CachedCheck,
}

impl Readiness {
    /// `pool`: a pool of its own, of one connection.
    pub fn new(pool: Pool) -> Self {
        Readiness {
            pool,
            cache: CachedCheck::new(SystemClock, RESULT_MAX_AGE),
        }
    }

    /// Whether the database answers, as last checked (at most [`RESULT_MAX_AGE`] ago).
    pub async fn database(&self) -> Result<(), String> {
        self.cache
            .get(|| async {
                let ping = async {
                    let client = self.pool.get().await.map_err(|e| e.to_string())?;
                    client
                        .simple_query("SELECT 1")
                        .await
                        .map_err(|e| crate::error::describe(&e))?;
                    Ok(())
                };
                let result = tokio::time::timeout(CHECK_BUDGET, ping)
                    .await
                    .unwrap_or_else(|_| Err("database ping timed out".to_owned()));
                let outcome = if result.is_ok() { "ok" } else { "failed" };
                metrics::counter!(m::READINESS_CHECKS, "outcome" => outcome).increment(1);
                result
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn a_burst_is_answered_by_one_check_and_a_result_lasts_its_age() {
        let clock = ManualClock::new();
        let cache = Arc::new(CachedCheck::new(clock.clone(), Duration::from_secs(1)));
        let checks = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let counter = checks.clone();
        let check = move || {
            let (checks, mut released) = (counter.clone(), released.clone());
            async move {
                checks.fetch_add(1, Ordering::SeqCst);
                // Slow: every other caller arrives while this one runs.
                let _ = released.wait_for(|r| *r).await;
                Err::<(), _>("down".to_owned())
            }
        };
        let burst: Vec<_> = (0..50)
            .map(|_| {
                let (cache, check) = (cache.clone(), check.clone());
                tokio::spawn(async move { cache.get(check).await })
            })
            .collect();
        tokio::task::yield_now().await;
        release.send(true).unwrap();
        for answer in burst {
            assert_eq!(answer.await.unwrap(), Err("down".to_owned()));
        }
        assert_eq!(checks.load(Ordering::SeqCst), 1, "one check for the burst");
        // Fresh: answered without a check, even a failure.
        assert!(cache.get(check.clone()).await.is_err());
        clock.advance(Duration::from_millis(999));
        assert!(cache.get(check.clone()).await.is_err());
        assert_eq!(checks.load(Ordering::SeqCst), 1);
        // Stale: checked again.
        clock.advance(Duration::from_millis(1));
        assert!(cache.get(|| async { Ok(()) }).await.is_ok());
        assert!(cache.get(check).await.is_ok());
        assert_eq!(checks.load(Ordering::SeqCst), 1);
    }
}
