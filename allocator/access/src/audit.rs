//! The audit trail's log side: one structured line (target `audit`, JSON like every log line)
//! for each refused authentication or authorisation and each administrative write, with the
//! client, the route, the SKU, the ids, the outcome and the status. The request id is on the
//! line's `span` (the request span both services open for every request), so an audit line can
//! be followed into the router's and the allocator's other lines. Routers and allocators each
//! write their own line for a forwarded write, under the same request id.
//!
//! Limits (rate, in-flight, quotas) are not audited: they are counted per client in metrics, and
//! a client flooding its limit must not flood the log. Who changed which stock is also recorded
//! durably with the adjustment itself once the fenced batch stores its client; these lines are
//! what a log pipeline keeps meanwhile.

use actix_web::ResponseError;

use crate::error::AccessError;
use crate::request::Request;

/// The `target` of every audit line: route it to its own sink with `RUST_LOG`-style filters.
pub const TARGET: &str = "audit";

/// A request refused for its credential or for what it asks to touch.
pub(crate) fn refused(client: &str, request: &Request<'_>, sku: Option<&str>, error: &AccessError) {
    if !error.is_access_refusal() {
        return;
    }
    tracing::info!(
        target: TARGET,
        event = "refused",
        client,
        method = request.method,
        route = request.template.unwrap_or("unmatched"),
        path = request.path,
        sku,
        outcome = error.outcome(),
        status = error.status_code().as_u16(),
        reason = %error,
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
        path,
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
