//! Keeping an order's lock for as long as its submission acts, and acting only while it is held.
//!
//! A submission works on an order under the row lock of its `orders` row ([`super::store`]),
//! which lives exactly as long as the transaction's session. The phase that sends requests can be
//! long — up to 100 lines, 16 in flight at a time, each with its own retry deadline — so two things
//! could end the lock while the submission still sends reserves or releases:
//!
//! * **the session's idle timeout** (`idle_in_transaction_session_timeout`, there so that a router
//!   whose host vanished does not block the order forever) — [`keep_alive`] sends a statement on
//!   the transaction every [`KeepAlive::period`], so a submission that is alive never idles that
//!   long however long its phase;
//! * **anything else that ends the session**: an operator's `pg_terminate_backend`, a database
//!   restart, a broken or black-holed connection. [`keep_alive`] notices (the client's connection
//!   closed, a keep-alive failed or timed out, or no keep-alive has been confirmed for longer than
//!   the idle timeout allows) and marks the [`Tenure`] lost.
//!
//! Once the tenure is lost, another submission may hold the lock and decide the order (it may
//! place it, taking over the holds), so this one must not send anything more: every line's
//! forward runs under [`Tenure::run`], which does not start after the loss and drops a forward in
//! progress (its current attempt and any retries) the moment it happens. The lines it could not
//! settle leave the order undecided (`503`, `outcome_unknown`), and the commit that would record
//! a decision fails with the session anyway.
//!
//! What this cannot do is recall a request already on the wire when the session ended: an
//! allocator may still apply it. The window is the time to notice the loss (one
//! [`CLOSED_POLL`] for a killed session, at most the idle timeout for a silent link) plus the
//! request's own transit.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::metrics;

/// How often the keeper looks whether the session's connection has closed (a local check).
pub const CLOSED_POLL: Duration = Duration::from_millis(50);

/// Whether the submission still holds the order's lock, as far as it can tell. Shared by the
/// keeper (which ends it) and the phase that sends requests (which stops when it ends).
#[derive(Debug, Clone, Default)]
pub struct Tenure {
    lost: CancellationToken,
}

impl Tenure {
    pub fn held(&self) -> bool {
        !self.lost.is_cancelled()
    }

    /// The lock is gone (or can no longer be relied on).
    pub fn lose(&self) {
        self.lost.cancel();
    }

    /// Resolves once the tenure is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// Run `work` (something that sends requests) while the tenure is held: `None` if it was
    /// already lost, or was lost before `work` finished (which is then dropped, sending nothing
    /// more).
    pub async fn run<F: Future>(&self, work: F) -> Option<F::Output> {
        if !self.held() {
            return None;
        }
        tokio::select! {
            biased;
            _ = self.lost.cancelled() => None,
            out = work => Some(out),
        }
    }
}

/// Timing of [`keep_alive`].
#[derive(Debug, Clone, Copy)]
pub struct KeepAlive {
    /// The session's `idle_in_transaction_session_timeout`.
    pub idle_timeout: Duration,
    /// Bound on one keep-alive round trip.
    pub db_timeout: Duration,
}

impl KeepAlive {
    /// Between keep-alives: four per idle timeout, so one slow or lost round trip is survived.
    pub fn period(&self) -> Duration {
        self.idle_timeout / 4
    }

    /// Until when the session surely outlives its idle timeout, given the last keep-alive that
    /// was confirmed was *sent* at `confirmed_sent`: the server ran it after that instant, so its
    /// idle clock restarted after it. A round trip's worth of margin is kept.
    pub fn safe_until(&self, confirmed_sent: Instant) -> Instant {
        confirmed_sent + self.idle_timeout.saturating_sub(self.db_timeout)
    }
}

/// Keep the order's transaction from idling out and watch for the end of its session; returns
/// (after marking `tenure` lost) once the lock can no longer be relied on. Runs until then: the
/// caller drops it when the submission is done.
pub async fn keep_alive(
    tx: &deadpool_postgres::Transaction<'_>,
    tenure: &Tenure,
    timing: KeepAlive,
) {
    let mut confirmed_sent = Instant::now();
    let mut next = confirmed_sent + timing.period();
    let (reason, why) = loop {
        tokio::time::sleep(CLOSED_POLL).await;
        let now = Instant::now();
        if tx.client().is_closed() {
            break ("closed", "the session's connection closed");
        }
        if now >= timing.safe_until(confirmed_sent) {
            break ("idle", "no keep-alive confirmed within the idle timeout");
        }
        if now < next {
            continue;
        }
        match tokio::time::timeout(timing.db_timeout, tx.query_one("SELECT 1", &[])).await {
            Ok(Ok(_)) => {
                confirmed_sent = now;
                next = now + timing.period();
            }
            Ok(Err(error)) => {
                tracing::warn!(%error, "order lock keep-alive failed");
                break ("keepalive", "a keep-alive failed");
            }
            Err(_) => break ("keepalive", "a keep-alive timed out"),
        }
    };
    metrics::record_order_lock_lost(reason);
    tracing::warn!(
        reason = why,
        "order lock lost; this submission sends nothing more"
    );
    tenure.lose();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_only_while_the_tenure_is_held() {
        let tenure = Tenure::default();
        assert_eq!(tenure.run(async { 7 }).await, Some(7));
        // Lost in the middle: the work is dropped at once.
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let losing = {
            let tenure = tenure.clone();
            async move {
                started_rx.await.unwrap();
                tenure.lose();
            }
        };
        let work = tenure.run(async move {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await
        });
        let (out, ()) = tokio::join!(work, losing);
        assert_eq!(out, None);
        assert!(!tenure.held());
        // Lost before: nothing starts.
        let mut started = false;
        assert_eq!(tenure.run(async { started = true }).await, None);
        assert!(!started);
    }

    #[test]
    fn the_safe_deadline_keeps_a_round_trip_of_margin() {
        let timing = KeepAlive {
            idle_timeout: Duration::from_secs(32),
            db_timeout: Duration::from_secs(2),
        };
        assert_eq!(timing.period(), Duration::from_secs(8));
        let sent = Instant::now();
        assert_eq!(timing.safe_until(sent), sent + Duration::from_secs(30));
        // Keep-alives come well before the deadline.
        assert!(sent + timing.period() * 3 < timing.safe_until(sent));
    }
}
