//! Forwarding one client request to the owner of its partition, with retries that keep
//! idempotency.
//!
//! One [`Forwarder::forward`] call is one client request. Each attempt looks the partition's owner
//! up in the *current* map (it may have been refreshed since the last attempt), sends the request
//! with `X-Assignment-Revision` and `X-Expected-Epoch`, and then:
//!
//! * any answer other than `421`/`503` is final and passed through verbatim (status, body,
//!   `Content-Type`, `Idempotent-Replayed`, `Retry-After`, `X-Partition-Epoch`);
//! * `421`, `503`, "no owner in the map", connect errors, timeouts and lost connections refresh the
//!   map (coalesced, see [`crate::assignment_cache`]), back off with jitter and try again, with the
//!   *same* request, so the same reservation/adjustment id;
//! * with upstream TLS configured, an owner advertising a plain `http://` URL is never sent to
//!   (fail closed: neither the request nor the router's token crosses in clear text); it is
//!   counted (`router_upstream_plain_refusals_total`) and retried like an unreachable owner, and
//!   the answer after the deadline is `503 upstream-unavailable` saying why;
//! * when the retry deadline would be exceeded the router answers `upstream-unavailable` (503, or
//!   504 after a timeout) with `outcome_unknown` (see [`crate::retry`] for the rule).
//!
//! Every request the router forwards is safe to repeat: GETs by nature, POSTs because each
//! carries an id the allocator deduplicates on. Nothing without an id is ever forwarded.
//!
//! The upstream client ([`crate::upstream`]) is built once per router (in [`crate::app`], not per
//! actix worker) so all workers share one connection pool, with explicit connect and per-attempt
//! timeouts. An attempt is built straight as an HTTP request: the routing headers from integers,
//! the body shared rather than copied.

use std::sync::Arc;
use std::time::{Duration, Instant};

use schema::wire::{Problem, HEADER_EPOCH, HEADER_REPLAYED, HEADER_REQUEST_ID};

use self::stages::Stage;
use crate::assignment_cache::{AssignmentCache, Destination};
use crate::error::RouterError;
use crate::metrics::{self, ForwardOutcome, RefreshCause};
use crate::retry::{give_up_status, AttemptFailure};
use crate::upstream::UpstreamClient;
use edge::Backoff;

mod message;
pub mod stages;

pub use message::{Method, UpstreamRequest, UpstreamResponse, HEADER_SERVED_BY};

/// Upstream response headers passed through to the client. The owner's echo of the request id
/// shows the client (and tests) that the id reached the owner.
const PASSTHROUGH_HEADERS: &[&str] = &[
    "content-type",
    edge::timing::HEADER,
    HEADER_REPLAYED,
    "retry-after",
    HEADER_EPOCH,
    HEADER_REQUEST_ID,
];

/// How far back a completed map read still counts as fresh after a connect error, timeout or
/// `503` (a `421` always asks for a read started after it).
const UPSTREAM_ERROR_REFRESH_WINDOW: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Total time one client request may spend on attempts and backoff.
    pub deadline: Duration,
    pub backoff: Backoff,
    /// Bound on one attempt (also capped by what is left of the deadline).
    pub attempt_timeout: Duration,
}

/// Forwards requests; one per router, shared by all workers.
pub struct Forwarder {
    http: UpstreamClient,
    cache: Arc<AssignmentCache>,
    policy: RetryPolicy,
    /// This router's token for the allocators (scope `router`); `None` sends none.
    credential: Option<Arc<access::UpstreamToken>>,
}

impl Forwarder {
    pub fn new(http: UpstreamClient, cache: Arc<AssignmentCache>, policy: RetryPolicy) -> Self {
        Forwarder {
            http,
            cache,
            policy,
            credential: None,
        }
    }

    /// Present `credential` on every upstream attempt.
    pub fn with_credential(mut self, credential: Option<Arc<access::UpstreamToken>>) -> Self {
        self.credential = credential;
        self
    }

    pub fn cache(&self) -> &Arc<AssignmentCache> {
        &self.cache
    }

    /// Forward `req` to the partition's owner, retrying within the deadline.
    pub async fn forward(&self, req: &UpstreamRequest) -> Result<UpstreamResponse, RouterError> {
        stages::advance(Stage::Accept);
        let started = Instant::now();
        let deadline = started + self.policy.deadline;
        let mut maybe_applied = false;
        let mut retries = 0u32;
        loop {
            let destination = self
                .cache
                .current()
                .and_then(|m| m.destination(req.partition));
            let failure = match &destination {
                None => AttemptFailure::NoOwner,
                Some(destination) => {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let timeout = remaining.min(self.policy.attempt_timeout);
                    let attempt = self.attempt(req, destination, timeout).await;
                    if attempt.is_ok() {
                        stages::advance(Stage::Upstream);
                    }
                    match attempt {
                        // The allocator refused this router's own credential: this attempt
                        // applied nothing, and it is not the client's token that is wrong, so
                        // the client must not see the allocator's 401/403 as its own. An
                        // earlier attempt that may have been applied stays unknown.
                        Ok(resp) if matches!(resp.status, 401 | 403) => {
                            metrics::record_upstream_auth_failure();
                            let outcome = ForwardOutcome::gave_up(maybe_applied);
                            metrics::record_forward(outcome, started.elapsed().as_secs_f64());
                            tracing::error!(
                                partition = req.partition,
                                owner_id = %destination.owner_id,
                                status = resp.status,
                                "the allocator refused this router's credential; check \
                                 --upstream-token-file and the allocators' auth files"
                            );
                            return Err(RouterError::Upstream {
                                status: 503,
                                outcome_unknown: maybe_applied,
                                partition: Some(req.partition),
                                detail: if maybe_applied {
                                    "the owner refused this router's credential after an \
                                     earlier attempt that may have been applied; retry with the \
                                     same id"
                                } else {
                                    "the owner refused this router's credential; nothing was \
                                     applied"
                                }
                                .to_owned(),
                            });
                        }
                        Ok(mut resp) => {
                            resp.attempts = retries + 1;
                            let outcome = match resp.status {
                                200..=299 => ForwardOutcome::Success,
                                400..=499 => ForwardOutcome::Rejected,
                                _ => ForwardOutcome::UpstreamError,
                            };
                            metrics::record_forward(outcome, started.elapsed().as_secs_f64());
                            if retries > 0 {
                                tracing::info!(
                                    partition = req.partition,
                                    epoch = destination.epoch,
                                    revision = destination.map_revision,
                                    owner_id = %destination.owner_id,
                                    reservation_id = req.reservation_id.as_deref(),
                                    retries,
                                    status = resp.status,
                                    elapsed_ms = started.elapsed().as_millis() as u64,
                                    "forward settled after retries"
                                );
                            }
                            return Ok(resp);
                        }
                        Err(failure) => failure,
                    }
                }
            };
            maybe_applied |= failure.may_have_applied();
            tracing::debug!(
                partition = req.partition,
                epoch = destination.as_ref().map(|r| r.epoch),
                revision = destination.as_ref().map(|r| r.map_revision),
                owner_id = destination.as_ref().map(|r| r.owner_id.as_str()),
                reservation_id = req.reservation_id.as_deref(),
                failure = ?failure,
                retries,
                "upstream attempt failed"
            );

            let now = Instant::now();
            let (cause, fresh_after) = if failure == AttemptFailure::Misdirected {
                (RefreshCause::Misdirected, now)
            } else {
                (
                    RefreshCause::UpstreamError,
                    now.checked_sub(UPSTREAM_ERROR_REFRESH_WINDOW)
                        .unwrap_or(now),
                )
            };
            let remaining = deadline.saturating_duration_since(now);
            // A failed refresh is logged by the cache; we keep retrying on the current map. Only
            // the partition's shard is re-read: another shard being slow must not hold this up.
            let _ = tokio::time::timeout(
                remaining,
                self.cache
                    .refresh_partition(req.partition, cause, fresh_after),
            )
            .await;

            let delay = self.policy.backoff.delay(retries);
            if Instant::now() + delay >= deadline {
                stages::advance(Stage::Retry);
                return Err(self.give_up(req, failure, maybe_applied, started));
            }
            metrics::record_retry(failure.cause().as_str());
            tokio::time::sleep(delay).await;
            stages::advance(Stage::Retry);
            retries += 1;
        }
    }

    fn give_up(
        &self,
        req: &UpstreamRequest,
        last: AttemptFailure,
        maybe_applied: bool,
        started: Instant,
    ) -> RouterError {
        let outcome = ForwardOutcome::gave_up(maybe_applied);
        metrics::record_forward(outcome, started.elapsed().as_secs_f64());
        tracing::warn!(
            partition = req.partition,
            reservation_id = req.reservation_id.as_deref(),
            outcome = outcome.as_str(),
            last_failure = ?last,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "gave up forwarding"
        );
        RouterError::Upstream {
            status: give_up_status(last),
            outcome_unknown: maybe_applied,
            partition: Some(req.partition),
            detail: format!(
                "no answer from the owner of partition {} within {} ms (last failure: {}); \
                 retry with the same id",
                req.partition,
                self.policy.deadline.as_millis(),
                describe(last),
            ),
        }
    }

    /// One attempt against `destination`.
    async fn attempt(
        &self,
        req: &UpstreamRequest,
        destination: &Destination,
        timeout: Duration,
    ) -> Result<UpstreamResponse, AttemptFailure> {
        let started = Instant::now();
        if self.http.tls_only() && !is_https(&destination.owner_url) {
            // Fail closed: the request (and this router's token) would cross in clear text.
            metrics::record_plain_owner_refusal();
            tracing::debug!(partition = destination.partition, owner_id = %destination.owner_id, owner_url = %destination.owner_url, "owner advertises plain http while upstream TLS is configured; not sent");
            return Err(AttemptFailure::PlainOwner);
        }
        let result = match self.request(req, destination) {
            Ok(request) => {
                stages::advance(Stage::Map);
                self.http.send(request, timeout).await.map_err(|e| {
                    AttemptFailure::from_transport_flags(e.is_connect(), e.is_timeout())
                })
            }
            // An owner URL the request cannot be built for: as unreachable as a broken
            // connection, and retried on a refreshed map the same way.
            Err(e) => {
                tracing::warn!(partition = destination.partition, owner_id = %destination.owner_id, owner_url = %destination.owner_url, error = %e, "cannot build the upstream request");
                Err(AttemptFailure::from_transport_flags(false, false))
            }
        };
        metrics::record_upstream_latency(started.elapsed().as_secs_f64());
        let answer = result.inspect_err(|failure| {
            tracing::debug!(partition = destination.partition, owner_id = %destination.owner_id, failure = ?failure, "upstream transport error");
        })?;
        let status = answer.status;
        let headers = PASSTHROUGH_HEADERS
            .iter()
            .filter_map(|name| {
                let value = answer.headers.get(*name)?.to_str().ok()?;
                Some((name.to_ascii_lowercase(), value.to_owned()))
            })
            .collect();
        let body = answer.body;
        let problem = || serde_json::from_slice::<Problem>(&body).ok();
        let outcome_unknown = if status == 503 {
            problem().and_then(|p| p.outcome_unknown)
        } else {
            None
        };
        if let Some(failure) = AttemptFailure::from_status(status, outcome_unknown) {
            if failure == AttemptFailure::Misdirected {
                // The allocator's view, logged for operators; the map is re-read from PostgreSQL.
                let view = problem();
                tracing::info!(
                    partition = destination.partition,
                    epoch = destination.epoch,
                    revision = destination.map_revision,
                    owner_id = %destination.owner_id,
                    allocator_owner_id = view.as_ref().and_then(|p| p.owner_id.as_deref()),
                    allocator_epoch = view.as_ref().and_then(|p| p.epoch),
                    allocator_revision = view.as_ref().and_then(|p| p.revision),
                    "misdirected request; refreshing the assignment map"
                );
            }
            return Err(failure);
        }
        Ok(UpstreamResponse {
            status,
            headers,
            body,
            destination: destination.clone(),
            attempts: 1,
        })
    }
}

/// Whether `url` is an `https://` URL (the scheme is case-insensitive).
fn is_https(url: &str) -> bool {
    url.get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

fn describe(failure: AttemptFailure) -> &'static str {
    match failure {
        AttemptFailure::NoOwner => "no live owner in the assignment map",
        AttemptFailure::Misdirected => "the addressed allocator does not own the partition",
        AttemptFailure::Unavailable => "the partition has no confirmed owner",
        AttemptFailure::Overdue => "the owner accepted the request but did not finish in time",
        AttemptFailure::ConnectFailed => "could not connect to the owner",
        AttemptFailure::PlainOwner => {
            "the owner advertises a plain http:// URL and this router reaches allocators over \
             TLS only (--upstream-ca); nothing was sent"
        }
        AttemptFailure::Timeout => "the owner did not answer in time",
        AttemptFailure::ConnectionLost => "the connection to the owner broke",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_https_urls_are_https() {
        for url in ["https://a:1", "HTTPS://a", "Https://x/y"] {
            assert!(super::is_https(url), "{url}");
        }
        for url in [
            "http://a:1",
            "",
            "https:/a",
            "httpss://a",
            "ftp://a",
            "https:",
        ] {
            assert!(!super::is_https(url), "{url}");
        }
    }
}
