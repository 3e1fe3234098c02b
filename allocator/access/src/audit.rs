//! The audit trail's log side: one structured line (target `audit`, JSON like every log line)
//! for each refused authentication or authorisation and each administrative write, with the
//! client, the route, the SKU, the ids, the outcome and the status. The request id is on the
//! line's `span` (the request span both services open for every request), so an audit line can
//! be followed into the router's and the allocator's other lines. Routers and allocators each
//! write their own line for a forwarded write, under the same request id.
//!
//! Limits (rate, in-flight, quotas) are not audited: they are counted per client in metrics, and
//! a client flooding its limit must not flood the log. For the same reason refusals of requests
//! without a valid token, which anyone can send, are capped ([`UnauthenticatedBudget`]: at most
//! [`UNAUTHENTICATED_LINES_PER_SECOND`] lines a second per service, the rest counted), and every
//! line carries at most [`PATH_MAX_BYTES`] of the raw path. Who changed which stock is also recorded
//! durably with the adjustment itself once the fenced batch stores its client; these lines are
//! what a log pipeline keeps meanwhile.

use std::sync::Mutex;

use actix_web::ResponseError;

use crate::error::AccessError;
use crate::request::Request;

/// The `target` of every audit line: route it to its own sink with `RUST_LOG`-style filters.
pub const TARGET: &str = "audit";

/// Audit lines of unauthenticated refusals (no, a malformed or an unknown token) one service
/// writes in one second at most; the others are counted (`*_audit_lines_suppressed_total`), and
/// the next line written says how many it stands for (`suppressed_before`). Every refusal is
/// counted in `*_unauthenticated_requests_total{reason}` whether or not its line is written.
pub const UNAUTHENTICATED_LINES_PER_SECOND: u32 = 10;

/// The most of a request's raw path an audit line carries, in bytes: a longer path is cut at a
/// character boundary and ends in `…`. The route template and the SKU say what was asked for.
pub const PATH_MAX_BYTES: usize = 256;

/// `path`, cut to [`PATH_MAX_BYTES`].
pub fn bounded_path(path: &str) -> std::borrow::Cow<'_, str> {
    if path.len() <= PATH_MAX_BYTES {
        return path.into();
    }
    let mut end = PATH_MAX_BYTES;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end]).into()
}

/// Whether one unauthenticated refusal's audit line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    /// Written; it stands for itself and `suppressed_before` refusals not written since the
    /// previous written line.
    Write { suppressed_before: u64 },
    /// Over this second's budget: counted, not written.
    Suppress,
}

/// One service's budget of unauthenticated audit lines: [`UNAUTHENTICATED_LINES_PER_SECOND`]
/// per whole second of the clock the caller reads (the gate's monotonic clock; tests pass their
/// own seconds).
#[derive(Debug)]
pub struct UnauthenticatedBudget {
    per_second: u32,
    window: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    second: u64,
    written: u32,
    suppressed: u64,
}

impl UnauthenticatedBudget {
    pub fn new(per_second: u32) -> Self {
        UnauthenticatedBudget {
            per_second,
            window: Mutex::default(),
        }
    }

    /// Take one line of the budget of `second`.
    pub fn take(&self, second: u64) -> Sample {
        let mut window = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if second != window.second {
            window.second = second;
            window.written = 0;
        }
        if window.written >= self.per_second {
            window.suppressed += 1;
            return Sample::Suppress;
        }
        window.written += 1;
        Sample::Write {
            suppressed_before: std::mem::take(&mut window.suppressed),
        }
    }
}

impl Default for UnauthenticatedBudget {
    fn default() -> Self {
        Self::new(UNAUTHENTICATED_LINES_PER_SECOND)
    }
}

/// A request refused for its credential or for what it asks to touch. `suppressed_before`: the
/// unauthenticated refusals not written since the previous line ([`Sample::Write`]).
pub(crate) fn refused(
    client: &str,
    request: &Request<'_>,
    sku: Option<&str>,
    error: &AccessError,
    suppressed_before: u64,
) {
    if !error.is_access_refusal() {
        return;
    }
    tracing::info!(
        target: TARGET,
        event = "refused",
        client,
        method = request.method,
        route = request.template.unwrap_or("unmatched"),
        path = %bounded_path(request.path),
        sku,
        outcome = error.outcome(),
        status = error.status_code().as_u16(),
        reason = %error,
        suppressed_before,
        "access refused"
    );
}

/// An administrative write (any route that requires `admin`), once answered.
pub(crate) fn admin_write(
    client: &str,
    method: &str,
    route: Option<&str>,
    path: &str,
    sku: Option<&str>,
    ids: &str,
    status: u16,
) {
    let outcome = match status {
        200..=299 => "applied",
        400..=499 => "refused",
        _ => "failed",
    };
    tracing::info!(
        target: TARGET,
        event = "admin_write",
        client,
        method,
        route = route.unwrap_or("unmatched"),
        path = %bounded_path(path),
        sku,
        ids,
        outcome,
        status,
        "administrative write"
    );
}

/// A reservation read or changed by id whose stored SKU is outside the caller's namespaces: the
/// caller is told `404`, the audit trail what happened.
pub(crate) fn hidden(client: &str, sku: &str) {
    tracing::info!(
        target: TARGET,
        event = "refused",
        client,
        sku,
        outcome = "namespace_forbidden",
        status = 404u16,
        reason = "the reservation's sku is outside the client's namespaces; answered as not found",
        "access refused"
    );
}

/// A reservation or order of another client, read, changed or replayed by id: the caller is told
/// `404`, as for an unknown id, the audit trail what happened.
pub(crate) fn not_owner(client: &str) {
    tracing::info!(
        target: TARGET,
        event = "refused",
        client,
        outcome = "not_owner",
        status = 404u16,
        reason = "another client's reservation or order; answered as not found",
        "access refused"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unauthenticated_lines_are_capped_per_second_and_the_rest_counted() {
        let budget = UnauthenticatedBudget::new(3);
        let first: Vec<Sample> = (0..5).map(|_| budget.take(7)).collect();
        assert_eq!(
            first,
            [
                Sample::Write {
                    suppressed_before: 0
                },
                Sample::Write {
                    suppressed_before: 0
                },
                Sample::Write {
                    suppressed_before: 0
                },
                Sample::Suppress,
                Sample::Suppress,
            ]
        );
        // The next second writes again; its first line stands for the two left out.
        assert_eq!(
            budget.take(8),
            Sample::Write {
                suppressed_before: 2
            }
        );
        assert_eq!(
            budget.take(8),
            Sample::Write {
                suppressed_before: 0
            }
        );
        // A burst a long time later has the whole budget again.
        assert_eq!((0..4).filter(|_| budget.take(60) != Sample::Suppress).count(), 3);
    }

    #[test]
    fn paths_are_cut_at_a_character_boundary() {
        assert_eq!(bounded_path("/v1/inventory/a"), "/v1/inventory/a");
        let exact = "x".repeat(PATH_MAX_BYTES);
        assert_eq!(bounded_path(&exact), exact);
        let long = format!("/{}", "é".repeat(PATH_MAX_BYTES));
        let cut = bounded_path(&long);
        assert!(cut.ends_with('…') && cut.len() <= PATH_MAX_BYTES + '…'.len_utf8());
        assert!(long.starts_with(cut.trim_end_matches('…')));
    }
}
