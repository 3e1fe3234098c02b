//! Wire types shared by the allocator, the router and the load generator.
//!
//! Request bodies reject unknown fields so that a misspelt field (`quantiy`) is a 400, not a
//! silently ignored default.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

mod order_line;
mod problem;
mod request_id;
mod values;

pub use order_line::{
    is_order_line_id, order_line_id, reserved_id_refusal, HEADER_ORDER_LINE, ORDER_LINE_PREFIX,
};
pub use problem::ProblemType;
pub use request_id::{RequestId, REQUEST_ID_MAX_LEN};
pub use values::{
    rule_violation, AdjustmentId, Delta, InvalidValue, Quantity, ReservationId, Sku, TtlSeconds,
};

/// Set on a `200` that replays an earlier outcome of the same reservation or adjustment id.
pub const HEADER_REPLAYED: &str = "Idempotent-Replayed";
/// The assignment revision the router routed by; lets an allocator tell a stale router apart.
pub const HEADER_ASSIGNMENT_REVISION: &str = "X-Assignment-Revision";
/// The epoch the router expects the owner to hold for the target partition.
pub const HEADER_EXPECTED_EPOCH: &str = "X-Expected-Epoch";
/// Set by the allocator on every answer about a partition: the epoch it served under.
pub const HEADER_EPOCH: &str = "X-Partition-Epoch";
/// Correlates one client request across the router's and the allocators' logs: the router takes
/// the client's (1–128 visible ASCII characters) or makes one, forwards it on every upstream
/// attempt, and both services echo it on the response.
///
/// Lower case, as HTTP/2 sends it and as `HeaderName::from_static` requires; header names are
/// case-insensitive on the wire.
pub const HEADER_REQUEST_ID: &str = "x-request-id";

/// The client a router forwards a request for: the name of the line of the router's auth file
/// that authenticated it. An allocator believes it only from a caller holding the `router` scope
/// ([`crate::routes::Scope::Router`]) and otherwise ignores it.
pub const HEADER_CLIENT: &str = "x-allocator-client";

/// What the client a router forwards for may touch: the SKU namespaces and quotas of its line of
/// the router's auth file, in the auth file's own option grammar (`skus=acme:* max_quantity=2`).
/// Sent only for clients that have any. An allocator takes it from a caller holding the `router`
/// scope, or with authentication off (it can only narrow what an anonymous caller may do), and
/// ignores it from any other caller.
pub const HEADER_CLIENT_POLICY: &str = "x-allocator-client-policy";

/// Sent by a router of a cluster of several shards with a reserve of a client that has a
/// `max_held_units` quota: the units the client holds, unexpired, on the cluster's other shards,
/// as the router read them just before (DESIGN.md §12). The owner counts them with what the
/// client holds on its own shard, so the quota is exact for reserves sent in sequence over every
/// shard. An allocator takes it only from a caller holding the `router` scope (or with
/// authentication off).
pub const HEADER_HELD_ELSEWHERE: &str = "x-allocator-held-elsewhere";

/// Sent as `true` by a router when the client it forwards for holds the `admin` scope, which may
/// act on every client's reservations ([`HEADER_CLIENT`] names the client; a reservation records
/// its client and is otherwise answered `404` to any other). An allocator believes it only from a
/// caller holding the `router` scope and ignores it from any other caller.
pub const HEADER_CLIENT_ADMIN: &str = "x-allocator-client-admin";

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

/// Bounds on request fields, documented in the README and the OpenAPI document.
pub mod limits {
    pub const SKU_MAX_LEN: usize = 64;
    pub const ID_MAX_LEN: usize = 255;
    pub const QUANTITY_MAX: i64 = 1_000_000;
    pub const ADJUSTMENT_DELTA_MAX: i64 = 1_000_000_000;
    pub const TTL_SECONDS_MIN: u32 = 1;
    pub const TTL_SECONDS_MAX: u32 = 86_400;
    pub const TTL_SECONDS_DEFAULT: u32 = 900;
    pub const ORDER_LINES_MAX: usize = 100;
    pub const BODY_MAX_BYTES: usize = 64 * 1024;

    /// Every limit above by name, so that the API document's conformance test can require each
    /// one to be stated there with the value enforced here; a limit added above belongs here too.
    pub const ALL: &[(&str, i64)] = &[
        ("SKU_MAX_LEN", SKU_MAX_LEN as i64),
        ("ID_MAX_LEN", ID_MAX_LEN as i64),
        ("QUANTITY_MAX", QUANTITY_MAX),
        ("ADJUSTMENT_DELTA_MAX", ADJUSTMENT_DELTA_MAX),
        ("TTL_SECONDS_MIN", TTL_SECONDS_MIN as i64),
        ("TTL_SECONDS_MAX", TTL_SECONDS_MAX as i64),
        ("TTL_SECONDS_DEFAULT", TTL_SECONDS_DEFAULT as i64),
        ("ORDER_LINES_MAX", ORDER_LINES_MAX as i64),
        ("BODY_MAX_BYTES", BODY_MAX_BYTES as i64),
    ];
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ReserveRequest {
    pub reservation_id: ReservationId,
    pub sku: Sku,
    pub quantity: Quantity,
    /// `None` holds for [`TtlSeconds::DEFAULT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<TtlSeconds>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReservationStatus {
    Held,
    Confirmed,
    Released,
    Expired,
}

impl ReservationStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Confirmed => "confirmed",
            Self::Released => "released",
            Self::Expired => "expired",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Reservation {
    pub reservation_id: String,
    pub status: ReservationStatus,
    pub sku: String,
    pub quantity: i64,
    pub expires_at: Option<DateTime<Utc>>,
    pub partition: u32,
    pub epoch: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Inventory {
    pub sku: String,
    pub partition: u32,
    pub on_hand: i64,
    pub available: i64,
    pub held: i64,
    pub confirmed: i64,
    pub epoch: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AdjustmentRequest {
    pub adjustment_id: AdjustmentId,
    pub delta: Delta,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Adjustment {
    pub adjustment_id: String,
    pub sku: String,
    pub delta: i64,
    pub on_hand: i64,
    pub available: i64,
    pub partition: u32,
    pub epoch: i64,
}

/// One entry of `GET /v1/partitions`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PartitionAssignment {
    pub partition: u32,
    pub owner_id: Option<String>,
    pub owner_url: Option<String>,
    pub epoch: i64,
    pub revision: i64,
    /// Lease time left by the database clock, in milliseconds; `None` when unowned or expired.
    pub lease_remaining_ms: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PartitionMap {
    pub partition_count: u32,
    /// Highest revision in the map; routers compare it with hints.
    pub revision: i64,
    pub partitions: Vec<PartitionAssignment>,
}

/// The last window the settlement job finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SettledWindow {
    pub window_start: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
    /// The job term (lease epoch) that settled it.
    pub term: i64,
    pub holder_id: String,
    /// Confirmed reservations settled in the window.
    pub reservations: i64,
    /// Units those reservations confirmed, summed over SKUs.
    pub total_quantity: i64,
    pub settled_at: DateTime<Utc>,
}

/// `GET /v1/jobs/settlement`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SettlementStatus {
    /// The replica holding the job's lease; `None` when nobody holds an unexpired one.
    pub holder_id: Option<String>,
    /// The job's current term: the lease's epoch, raised on every acquisition.
    pub term: i64,
    /// Lease time left by the database clock, in milliseconds.
    pub lease_remaining_ms: Option<i64>,
    pub last_settled: Option<SettledWindow>,
    pub settled_windows: i64,
    /// Seconds from the end of the last settled window (or the cluster's creation) to now, by the
    /// database clock. Healthy values stay below two windows plus the closing grace.
    pub lag_seconds: f64,
}

/// `GET /v1/jobs/settlement` on a router: the catalog shard's job at the top level (what an
/// allocator of the catalog answers, so one-database clients read it unchanged), and every
/// shard's job in `shards`, in the configured order (the catalog first). Each shard runs a job of
/// its own over its own rows, with its own windows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardedSettlementStatus {
    #[serde(flatten)]
    pub catalog: SettlementStatus,
    pub shards: Vec<ShardSettlement>,
}

/// One shard's settlement job in [`ShardedSettlementStatus`]: its name and its status's fields,
/// or its name and `error` when its status could not be read in time.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShardSettlement {
    pub name: String,
    #[serde(flatten)]
    pub status: ShardSettlementRead,
}

/// What was read of one shard's settlement job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ShardSettlementRead {
    Status(SettlementStatus),
    Unreadable {
        /// Why the shard's status is missing (a timeout, no connection, a failed query).
        error: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OrderLine {
    pub sku: Sku,
    pub quantity: Quantity,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// A refused value names its line (`lines[2]: quantity must be ...`).
    #[serde(deserialize_with = "values::numbered_lines")]
    pub lines: Vec<OrderLine>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<TtlSeconds>,
}

/// RFC 9457 problem details. `kind` is serialised as `type`; the optional members carry what a
/// client needs to act (the owner to go to, the stock that was available, the current state).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_status: Option<ReservationStatus>,
    /// Router only: `true` when the outcome of a forwarded request is unknown and the client must
    /// retry with the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome_unknown: Option<bool>,
    /// `quota-exceeded`: which quota of the client's auth-file line refused the request
    /// (`max_quantity`, `max_held_per_sku`, `max_held_units`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<String>,
    /// `quota-exceeded`: the quota's value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<i64>,
}

/// Problem type URIs; stable, documented in the README.
pub mod problem_type {
    pub const INVALID_REQUEST: &str = "urn:allocator:problem:invalid-request";
    pub const INSUFFICIENT_STOCK: &str = "urn:allocator:problem:insufficient-stock";
    pub const IDEMPOTENCY_MISMATCH: &str = "urn:allocator:problem:idempotency-mismatch";
    pub const INVALID_STATE: &str = "urn:allocator:problem:invalid-state";
    pub const NOT_FOUND: &str = "urn:allocator:problem:not-found";
    pub const NOT_OWNER: &str = "urn:allocator:problem:not-owner";
    pub const PARTITION_UNAVAILABLE: &str = "urn:allocator:problem:partition-unavailable";
    pub const SHRINK_BELOW_HELD: &str = "urn:allocator:problem:shrink-below-held";
    pub const STORAGE_UNAVAILABLE: &str = "urn:allocator:problem:storage-unavailable";
    pub const UPSTREAM_UNAVAILABLE: &str = "urn:allocator:problem:upstream-unavailable";
    pub const ORDER_FAILED: &str = "urn:allocator:problem:order-failed";
    pub const INTERNAL: &str = "urn:allocator:problem:internal";
    pub const UNAUTHENTICATED: &str = "urn:allocator:problem:unauthenticated";
    pub const FORBIDDEN: &str = "urn:allocator:problem:forbidden";
    pub const RATE_LIMITED: &str = "urn:allocator:problem:rate-limited";
    /// A SKU outside the namespaces (`skus=`) of the client's auth-file line.
    pub const NAMESPACE_FORBIDDEN: &str = "urn:allocator:problem:namespace-forbidden";
    /// A per-client quota; the problem's `quota` member names it, `limit` gives its value.
    pub const QUOTA_EXCEEDED: &str = "urn:allocator:problem:quota-exceeded";

    /// Every problem type above, so that the API document's conformance test can require each
    /// one to be documented; a type added above belongs here too.
    pub const ALL: &[&str] = &[
        INVALID_REQUEST,
        INSUFFICIENT_STOCK,
        IDEMPOTENCY_MISMATCH,
        INVALID_STATE,
        NOT_FOUND,
        NOT_OWNER,
        PARTITION_UNAVAILABLE,
        SHRINK_BELOW_HELD,
        STORAGE_UNAVAILABLE,
        UPSTREAM_UNAVAILABLE,
        ORDER_FAILED,
        INTERNAL,
        UNAUTHENTICATED,
        FORBIDDEN,
        RATE_LIMITED,
        NAMESPACE_FORBIDDEN,
        QUOTA_EXCEEDED,
    ];
}

/// The rules behind [`Sku`], [`ReservationId`], [`AdjustmentId`], [`Quantity`], [`TtlSeconds`]
/// and [`Delta`]: one place, so allocator, router and load generator refuse the same input with
/// the same words. Services parse into those types instead of calling these.
pub mod validate {
    use super::limits::*;

    pub fn sku(sku: &str) -> Result<(), String> {
        if sku.is_empty() || sku.len() > SKU_MAX_LEN {
            return Err(format!("sku must be 1..={SKU_MAX_LEN} characters"));
        }
        if !sku
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        {
            return Err("sku may contain only A-Z a-z 0-9 . _ : -".to_owned());
        }
        Ok(())
    }

    pub fn id(field: &str, id: &str) -> Result<(), String> {
        if id.is_empty() || id.len() > ID_MAX_LEN {
            return Err(format!("{field} must be 1..={ID_MAX_LEN} bytes"));
        }
        if id.chars().any(|c| c.is_control()) {
            return Err(format!("{field} may not contain control characters"));
        }
        Ok(())
    }

    pub fn quantity(quantity: i64) -> Result<(), String> {
        if !(1..=QUANTITY_MAX).contains(&quantity) {
            return Err(format!("quantity must be between 1 and {QUANTITY_MAX}"));
        }
        Ok(())
    }

    pub fn ttl_seconds(ttl: Option<u32>) -> Result<u32, String> {
        let ttl = ttl.unwrap_or(TTL_SECONDS_DEFAULT);
        if !(TTL_SECONDS_MIN..=TTL_SECONDS_MAX).contains(&ttl) {
            return Err(format!(
                "ttl_seconds must be between {TTL_SECONDS_MIN} and {TTL_SECONDS_MAX}"
            ));
        }
        Ok(ttl)
    }

    pub fn delta(delta: i64) -> Result<(), String> {
        // A range check, not `abs()`: `i64::MIN.abs()` overflows.
        if delta == 0 || !(-ADJUSTMENT_DELTA_MAX..=ADJUSTMENT_DELTA_MAX).contains(&delta) {
            return Err(format!(
                "delta must be non-zero and at most {ADJUSTMENT_DELTA_MAX} in magnitude"
            ));
        }
        Ok(())
    }
}
