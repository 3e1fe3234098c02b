//! The problem vocabulary: each problem type with its one title and usual status, so the
//! allocator and the router describe the same condition in the same words.

use super::{problem_type, Problem};

/// Every problem type either service answers with. The URIs are the documented
/// [`problem_type`] constants; the title is fixed per type so a client (or a person reading a
/// log) sees the same title whichever service produced the problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    InvalidRequest,
    InsufficientStock,
    IdempotencyMismatch,
    InvalidState,
    NotFound,
    NotOwner,
    PartitionUnavailable,
    ShrinkBelowHeld,
    StorageUnavailable,
    UpstreamUnavailable,
    OrderFailed,
    Internal,
    Unauthenticated,
    Forbidden,
    RateLimited,
    NamespaceForbidden,
    QuotaExceeded,
}

impl ProblemType {
    pub const ALL: [ProblemType; 17] = [
        ProblemType::InvalidRequest,
        ProblemType::InsufficientStock,
        ProblemType::IdempotencyMismatch,
        ProblemType::InvalidState,
        ProblemType::NotFound,
        ProblemType::NotOwner,
        ProblemType::PartitionUnavailable,
        ProblemType::ShrinkBelowHeld,
        ProblemType::StorageUnavailable,
        ProblemType::UpstreamUnavailable,
        ProblemType::OrderFailed,
        ProblemType::Internal,
        ProblemType::Unauthenticated,
        ProblemType::Forbidden,
        ProblemType::RateLimited,
        ProblemType::NamespaceForbidden,
        ProblemType::QuotaExceeded,
    ];

    /// The documented `type` URI.
    pub const fn uri(self) -> &'static str {
        match self {
            ProblemType::InvalidRequest => problem_type::INVALID_REQUEST,
            ProblemType::InsufficientStock => problem_type::INSUFFICIENT_STOCK,
            ProblemType::IdempotencyMismatch => problem_type::IDEMPOTENCY_MISMATCH,
            ProblemType::InvalidState => problem_type::INVALID_STATE,
            ProblemType::NotFound => problem_type::NOT_FOUND,
            ProblemType::NotOwner => problem_type::NOT_OWNER,
            ProblemType::PartitionUnavailable => problem_type::PARTITION_UNAVAILABLE,
            ProblemType::ShrinkBelowHeld => problem_type::SHRINK_BELOW_HELD,
            ProblemType::StorageUnavailable => problem_type::STORAGE_UNAVAILABLE,
            ProblemType::UpstreamUnavailable => problem_type::UPSTREAM_UNAVAILABLE,
            ProblemType::OrderFailed => problem_type::ORDER_FAILED,
            ProblemType::Internal => problem_type::INTERNAL,
            ProblemType::Unauthenticated => problem_type::UNAUTHENTICATED,
            ProblemType::Forbidden => problem_type::FORBIDDEN,
            ProblemType::RateLimited => problem_type::RATE_LIMITED,
            ProblemType::NamespaceForbidden => problem_type::NAMESPACE_FORBIDDEN,
            ProblemType::QuotaExceeded => problem_type::QUOTA_EXCEEDED,
        }
    }

    /// The short, human-readable summary; the same for every occurrence of the type (RFC 9457
    /// §3.1.3). What differs between occurrences goes into `detail`.
    pub const fn title(self) -> &'static str {
        match self {
            ProblemType::InvalidRequest => "Invalid request",
            ProblemType::InsufficientStock => "Insufficient stock",
            ProblemType::IdempotencyMismatch => "Id reused with a different payload",
            ProblemType::InvalidState => "Transition not allowed",
            ProblemType::NotFound => "Not found",
            ProblemType::NotOwner => "Partition owned elsewhere",
            ProblemType::PartitionUnavailable => "Partition temporarily unavailable",
            ProblemType::ShrinkBelowHeld => "Shrink below held stock",
            ProblemType::StorageUnavailable => "Storage unavailable",
            ProblemType::UpstreamUnavailable => "Upstream unavailable",
            ProblemType::OrderFailed => "Order failed",
            ProblemType::Internal => "Internal error",
            ProblemType::Unauthenticated => "Authentication required",
            ProblemType::Forbidden => "Scope not granted",
            ProblemType::RateLimited => "Too many requests",
            ProblemType::NamespaceForbidden => "SKU outside the client's namespaces",
            ProblemType::QuotaExceeded => "Quota exceeded",
        }
    }

    /// The HTTP status this type is usually answered with. A few answers use another status for
    /// the same type ( `413` and `405` are invalid requests, a timed-out upstream is `504`); they
    /// set it with [`Problem::with_status`].
    pub const fn status(self) -> u16 {
        match self {
            ProblemType::InvalidRequest => 400,
            ProblemType::InsufficientStock => 409,
            ProblemType::IdempotencyMismatch => 422,
            ProblemType::InvalidState => 409,
            ProblemType::NotFound => 404,
            ProblemType::NotOwner => 421,
            ProblemType::PartitionUnavailable => 503,
            ProblemType::ShrinkBelowHeld => 409,
            ProblemType::StorageUnavailable => 503,
            ProblemType::UpstreamUnavailable => 503,
            ProblemType::OrderFailed => 409,
            ProblemType::Internal => 500,
            ProblemType::Unauthenticated => 401,
            ProblemType::Forbidden => 403,
            ProblemType::RateLimited => 429,
            ProblemType::NamespaceForbidden => 403,
            ProblemType::QuotaExceeded => 429,
        }
    }

    /// The type a problem document names, if it is one of ours.
    pub fn from_uri(uri: &str) -> Option<ProblemType> {
        ProblemType::ALL.into_iter().find(|t| t.uri() == uri)
    }
}

impl Problem {
    /// A problem of type `kind` with its title and usual status, explaining this occurrence in
    /// `detail`.
    pub fn new(kind: ProblemType, detail: impl Into<String>) -> Problem {
        Problem {
            kind: kind.uri().to_owned(),
            title: kind.title().to_owned(),
            status: kind.status(),
            detail: Some(detail.into()),
            ..Problem::default()
        }
    }

    /// The same problem answered with another status than the type's usual one.
    pub fn with_status(mut self, status: u16) -> Problem {
        self.status = status;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_own_uri_and_a_title() {
        let uris: std::collections::BTreeSet<_> =
            ProblemType::ALL.iter().map(|t| t.uri()).collect();
        assert_eq!(uris.len(), ProblemType::ALL.len());
        for t in ProblemType::ALL {
            assert_eq!(ProblemType::from_uri(t.uri()), Some(t));
            assert!(!t.title().is_empty());
            assert!(t.uri().starts_with("urn:allocator:problem:"));
        }
        assert_eq!(ProblemType::from_uri("about:blank"), None);
    }

    #[test]
    fn new_problem_carries_type_title_status_and_detail() {
        let p = Problem::new(ProblemType::NotOwner, "partition 3").with_status(421);
        assert_eq!(p.kind, problem_type::NOT_OWNER);
        assert_eq!(p.title, "Partition owned elsewhere");
        assert_eq!(p.status, 421);
        assert_eq!(p.detail.as_deref(), Some("partition 3"));
    }
}
