//! Every error the HTTP API returns, rendered as RFC 9457 problem+json. One enum, one
//! `status_code()` mapping.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::fenced::ReadError;
use crate::work::WorkError;
use schema::wire::{Problem, ProblemType, ReservationStatus};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("insufficient stock")]
    InsufficientStock { available: i64, replayed: bool },
    #[error("{0}")]
    IdempotencyMismatch(String),
    #[error("transition not allowed from {}", current.as_str())]
    InvalidState { current: ReservationStatus },
    #[error("shrink would take stock that is held or confirmed")]
    ShrinkBelowHeld { available: i64, replayed: bool },
    #[error("partition {partition} is not owned by this replica")]
    NotOwner {
        partition: u32,
        owner_id: Option<String>,
        owner_url: Option<String>,
        epoch: Option<i64>,
        revision: Option<i64>,
    },
    #[error("partition {partition} has no confirmed owner right now: {reason}")]
    PartitionUnavailable {
        partition: u32,
        reason: String,
        outcome_unknown: bool,
    },
    #[error("storage unavailable: {0}")]
    StorageUnavailable(String),
    /// The client's `max_held_per_sku` or `max_held_units`, decided by the fenced batch.
    #[error("{detail}")]
    HoldQuotaExceeded {
        quota: access::Quota,
        limit: i64,
        detail: String,
    },
}

impl ApiError {
    fn kind(&self) -> ProblemType {
        match self {
            ApiError::InvalidRequest(_) => ProblemType::InvalidRequest,
            ApiError::NotFound(_) => ProblemType::NotFound,
            ApiError::InsufficientStock { .. } => ProblemType::InsufficientStock,
            ApiError::IdempotencyMismatch(_) => ProblemType::IdempotencyMismatch,
            ApiError::InvalidState { .. } => ProblemType::InvalidState,
            ApiError::ShrinkBelowHeld { .. } => ProblemType::ShrinkBelowHeld,
            ApiError::NotOwner { .. } => ProblemType::NotOwner,
            ApiError::PartitionUnavailable { .. } => ProblemType::PartitionUnavailable,
            ApiError::StorageUnavailable(_) => ProblemType::StorageUnavailable,
            ApiError::HoldQuotaExceeded { .. } => ProblemType::QuotaExceeded,
        }
    }

    pub fn problem(&self) -> Problem {
        let mut problem =
            Problem::new(self.kind(), self.to_string()).with_status(self.status_code().as_u16());
        match self {
            ApiError::InsufficientStock { available, .. }
            | ApiError::ShrinkBelowHeld { available, .. } => problem.available = Some(*available),
            ApiError::InvalidState { current } => problem.current_status = Some(*current),
            ApiError::NotOwner {
                partition,
                owner_id,
                owner_url,
                epoch,
                revision,
            } => {
                problem.partition = Some(*partition);
                problem.owner_id = owner_id.clone();
                problem.owner_url = owner_url.clone();
                problem.epoch = *epoch;
                problem.revision = *revision;
            }
            ApiError::PartitionUnavailable {
                partition,
                outcome_unknown,
                ..
            } => {
                problem.partition = Some(*partition);
                problem.outcome_unknown = Some(*outcome_unknown);
            }
            ApiError::HoldQuotaExceeded { quota, limit, .. } => {
                problem.quota = Some(quota.as_str().to_owned());
                problem.limit = Some(*limit);
            }
            _ => {}
        }
        problem
    }

    fn replayed(&self) -> bool {
        matches!(
            self,
            ApiError::InsufficientStock { replayed: true, .. }
                | ApiError::ShrinkBelowHeld { replayed: true, .. }
        )
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::InsufficientStock { .. }
            | ApiError::InvalidState { .. }
            | ApiError::ShrinkBelowHeld { .. } => StatusCode::CONFLICT,
            ApiError::IdempotencyMismatch(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::HoldQuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::NotOwner { .. } => StatusCode::MISDIRECTED_REQUEST,
            ApiError::PartitionUnavailable { .. } | ApiError::StorageUnavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut response = edge::problem::builder(self.status_code());
        if self.replayed() {
            response.insert_header((schema::wire::HEADER_REPLAYED, "true"));
        }
        edge::problem::body(response, &self.problem())
    }
}

impl From<WorkError> for ApiError {
    fn from(error: WorkError) -> Self {
        match error {
            WorkError::NotOwner { partition } => ApiError::NotOwner {
                partition,
                owner_id: None,
                owner_url: None,
                epoch: None,
                revision: None,
            },
            WorkError::Unavailable {
                partition,
                reason,
                outcome_unknown,
            } => ApiError::PartitionUnavailable {
                partition,
                reason,
                outcome_unknown,
            },
            WorkError::Storage { partition, reason } => ApiError::PartitionUnavailable {
                partition,
                reason,
                outcome_unknown: false,
            },
        }
    }
}

impl From<ReadError> for ApiError {
    fn from(error: ReadError) -> Self {
        match error {
            ReadError::Db(error) => ApiError::from(error),
            malformed @ ReadError::Malformed(_) => {
                ApiError::StorageUnavailable(malformed.to_string())
            }
        }
    }
}

impl From<deadpool_postgres::PoolError> for ApiError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        ApiError::StorageUnavailable(error.to_string())
    }
}

impl From<tokio_postgres::Error> for ApiError {
    fn from(error: tokio_postgres::Error) -> Self {
        ApiError::StorageUnavailable(crate::error::describe(&error))
    }
}
