//! All-or-nothing multi-line orders (`POST /v1/orders/{order_id}/reservations`).
//!
//! An order's lines usually live on different partitions, hence on different allocators, and
//! there is no distributed transaction. The router gets "all or nothing" from two properties the
//! allocator already guarantees — idempotent reservations and idempotent release — plus
//! deterministic ids, and serialises the submissions of one order id through PostgreSQL:
//!
//! 0. **One submission at a time.** The `orders` row of the order id is locked for as long as a
//!    router works on the order, and the final answer is stored in it ([`store`]). A second
//!    submission (a client retry racing the first, or the same order sent to another router)
//!    waits for the lock and then replays the stored answer, so two submissions can never
//!    decide one order differently (one answering "placed" for holds the other released). An
//!    order id stored with other lines is refused with `422` before anything is reserved.
//! 1. **Reserve.** Line `i` is reserved under the id `order:{order_id}:{i}`
//!    ([`line_reservation_id`]), all lines concurrently, each through the normal retrying
//!    forwarder. The id depends only on the order id and the line's position, so a retry of the
//!    same order reserves the *same* ids and gets the stored outcomes back instead of taking stock
//!    twice. (The SKU is not part of the id: with a 200-byte order id and a 64-byte SKU the id
//!    could exceed the 255-byte limit.) Two lines for the same SKU are fine: they have different
//!    indexes. Ids starting with `order:` are a namespace single reservations cannot use (routers
//!    and allocators refuse them on `POST /v1/reservations`; an allocator accepts one only from a
//!    router marking an order line), so no client can occupy a line of someone's order.
//! 2. **Decide.** If every line is held (newly or by an earlier attempt of this order), the order
//!    succeeds: `201` with all reservations.
//! 3. **Compensate.** Otherwise every line that is or may be held — held now, replayed as held,
//!    or with an unknown or unavailable outcome (an earlier attempt of the order may have held
//!    it) — is released (idempotent). The answer is `409 order-failed` listing each line's
//!    outcome and its compensation, but only if every line is *settled* ([`decide`]): a release
//!    that finds nothing (`404`) does not settle a line whose reserve got no definitive answer,
//!    because that reserve may still be queued and commit after the release. If some line is not
//!    settled (or a release could not be confirmed), the answer is `503 upstream-unavailable`
//!    with `outcome_unknown: true`: the client retries the order with the same id, the retry's
//!    reserve of that line gets a definitive answer, and its release then settles it.
//! 4. **Line ids taken by something else.** This can only happen to an order an earlier version
//!    left undecided under the line ids of that version, `{order_id}:{i}` ([`LineIds::Legacy`]),
//!    which any client could also reserve. Only an order stored without an owner (from before
//!    owners were recorded) is finished under that form, and only when a reservation without an
//!    owner (as that version's lines are) exists under one of its ids: another client's
//!    reservation under such an id never turns an order to it ([`store`]). If a line is refused with `422` (its id exists with
//!    another SKU or quantity), the answer is `422 idempotency-mismatch`. Every hold of the order
//!    is still released — held now or replayed from an earlier attempt: the order's stored
//!    request matched, so those holds are this order's own — but lines whose outcome is unknown
//!    are not (their id may be the other client's), so they leave the order unsettled (`503`)
//!    until a retry knows more.
//!
//! **Retries converge.** A decided order (`201`, `409`, `422`) replays its stored answer, with
//! `Idempotent-Replayed: true` (a placed order replays as `200`). An order answered `503`
//! (outcome unknown) is not decided: its retry runs the protocol again with the same line ids and
//! converges to whatever it finds — a line released by an earlier compensation replays as
//! `released`, so the order fails; if nothing was held or released it can still be placed.
//!
//! **If the router dies mid-order** (crash between reserving some lines and answering), its
//! database session ends, which unlocks the order, and some lines may be held with nobody to
//! compensate them. Nothing is lost: every hold carries the order's TTL (`ttl_seconds`, default
//! 15 min) and the owning allocator expires it. The client saw a connection error, so it retries
//! the order with the same id (any router): held lines replay as held, missing lines are
//! reserved, and the order converges to one outcome.
//!
//! The order's total time is bounded by two retry deadlines (reserve phase, then compensation).

use futures::StreamExt;
use schema::wire::{
    OrderRequest, Problem, ProblemType, Quantity, Reservation, ReservationId, ReservationStatus,
    ReserveRequest, Sku,
};
use serde::Serialize;

use crate::error::RouterError;
use crate::forward::{Forwarder, UpstreamRequest, UpstreamResponse};
use crate::metrics;
use schema::path::encode_segment;

mod decide;
mod lines;
pub mod lock;
pub mod store;

pub use decide::{classify_release, classify_reserve, decide};
pub use lines::{line_reservation_id, validate_order, LineIds, ORDER_ID_MAX_LEN};

/// Lines reserved (or released) at the same time.
const LINE_CONCURRENCY: usize = 16;

/// What the reserve step did to one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LineOutcome {
    /// Newly held by this request.
    Held,
    /// Already held (or confirmed) by an earlier attempt of this order.
    Replayed,
    /// An earlier attempt held it and it has since been released or expired.
    Inactive,
    /// The allocator refused it (insufficient stock, unknown SKU, id reused with another payload).
    Refused,
    /// No owner answered; the reserve was not applied by this request.
    Unavailable,
    /// No conclusive answer; the reserve may have been applied.
    Unknown,
}

impl LineOutcome {
    /// Whether the allocator gave this line's id a definitive answer, which it stores: a late
    /// duplicate of the reserve (a retry still in flight) replays it instead of taking stock.
    pub fn is_definitive(self) -> bool {
        !matches!(self, LineOutcome::Unavailable | LineOutcome::Unknown)
    }
}

/// What the compensation step did to one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Compensation {
    /// The hold was released.
    Released,
    /// There was nothing to release (never created, already released, expired or refused).
    NotHeld,
    /// The release could not be confirmed; the hold, if any, expires by TTL.
    Failed,
    /// The release found nothing, but the line's reserve got no definitive answer and may still
    /// commit after it; the order's retry settles the line.
    Unsettled,
}

/// One line in an order's answer.
#[derive(Debug, Clone, Serialize)]
pub struct LineReport {
    pub index: usize,
    pub sku: Sku,
    pub quantity: Quantity,
    pub reservation_id: String,
    pub outcome: LineOutcome,
    /// The reservation's status after the reserve step, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<ReservationStatus>,
    /// Why the line was not held (the allocator's or the router's problem document).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<Problem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Compensation>,
    /// The reservation body, for the success answer.
    #[serde(skip)]
    pub reservation: Option<Reservation>,
}

impl LineReport {
    /// Held now, in the allocator's view (so part of a successful order).
    pub fn is_secured(&self) -> bool {
        matches!(self.outcome, LineOutcome::Held | LineOutcome::Replayed)
    }

    /// Whether compensation must try to release this line: it is held, or may be held by this or
    /// an earlier attempt of the order. Refused and inactive lines hold nothing under this id;
    /// confirmed lines cannot be released.
    ///
    /// A replayed hold is this order's own even when another line collided (`mismatch`): the
    /// order's stored request matched before anything was reserved, so the hold was made by an
    /// earlier attempt of this very order. Only a line whose reserve got no definitive answer is
    /// left alone after a collision: its id may be someone else's (possible only for line ids of
    /// the form used before order lines had their own namespace), and the order stays undecided
    /// until a retry knows more.
    pub fn needs_release(&self, mismatch: bool) -> bool {
        match self.outcome {
            LineOutcome::Held => true,
            LineOutcome::Replayed => self.status != Some(ReservationStatus::Confirmed),
            LineOutcome::Unknown | LineOutcome::Unavailable => !mismatch,
            LineOutcome::Inactive | LineOutcome::Refused => false,
        }
    }

    /// Whether the line's final state is known: nothing of it is or will later be held, or (for a
    /// placed order) it is held. A line released, or refused or inactive with nothing to
    /// release, is settled; an unknown reserve that was not (or could not be) released is not.
    pub fn is_settled(&self) -> bool {
        match self.compensation {
            Some(Compensation::Released | Compensation::NotHeld) => true,
            Some(Compensation::Failed | Compensation::Unsettled) => false,
            None => self.outcome.is_definitive(),
        }
    }

    /// The allocator refused the line because its id exists with another payload.
    pub fn is_mismatch(&self) -> bool {
        self.outcome == LineOutcome::Refused
            && self.problem.as_ref().is_some_and(|p| {
                p.status == 422 && p.kind == ProblemType::IdempotencyMismatch.uri()
            })
    }
}

/// Success body.
#[derive(Debug, Clone, Serialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub reservations: Vec<Reservation>,
}

/// Failure body: a problem document plus the per-line outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct OrderProblem {
    #[serde(flatten)]
    pub problem: Problem,
    pub order_id: String,
    pub lines: Vec<LineReport>,
}

#[derive(Debug, Clone)]
pub enum OrderResult {
    /// Every line held. `replayed` when no line was newly held by this request.
    Placed { body: OrderPlaced, replayed: bool },
    /// Decided failure; nothing of the order is held or will be (409).
    Failed(OrderProblem),
    /// The order id was used before with other lines (422); holds of the original order stay.
    Mismatch(OrderProblem),
    /// Not decided: some line may be held now or later (503, `outcome_unknown`).
    Unknown(OrderProblem),
}

impl OrderResult {
    pub fn outcome_label(&self) -> &'static str {
        match self {
            OrderResult::Placed {
                replayed: false, ..
            } => "placed",
            OrderResult::Placed { replayed: true, .. } => "replayed",
            OrderResult::Failed(_) => "failed",
            OrderResult::Mismatch(_) => "mismatch",
            OrderResult::Unknown(_) => "unknown",
        }
    }
}

/// Place an order: reserve every line, then succeed or compensate. `partition_of` maps a SKU to
/// its partition (the shared hash with the cluster's partition count).
///
/// Every request is sent under `tenure` ([`lock::Tenure::run`]): once the submission may no
/// longer hold the order's lock, nothing more is sent (a line not yet settled then leaves the
/// order undecided). `may_compensate` is asked once more, before any release is sent: it
/// confirms with the database that this submission still holds the lock. If it no longer does,
/// another submission may have decided the order meanwhile (possibly placed it), so releasing
/// would undo someone else's answer; the order is then reported as not decided (`503`,
/// `outcome_unknown`) without releasing anything.
pub async fn place<F, Fut>(
    forwarder: &Forwarder,
    order_id: &str,
    order: &OrderRequest,
    ids: LineIds,
    partition_of: impl Fn(&str) -> u32,
    tenure: &lock::Tenure,
    may_compensate: F,
) -> OrderResult
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut lines: Vec<LineReport> = order
        .lines
        .iter()
        .enumerate()
        .map(|(index, line)| LineReport {
            index,
            sku: line.sku.clone(),
            quantity: line.quantity,
            reservation_id: ids.id(order_id, index),
            outcome: LineOutcome::Unknown,
            status: None,
            problem: None,
            compensation: None,
            reservation: None,
        })
        .collect();
    let partitions: Vec<u32> = lines.iter().map(|l| partition_of(&l.sku)).collect();

    // Reserve phase.
    let reserves: Vec<Result<UpstreamResponse, RouterError>> =
        futures::stream::iter(lines.iter().zip(&partitions).map(|(line, &partition)| {
            // Never refused: a valid order id and line index make a valid reservation id.
            let request =
                ReservationId::try_from(line.reservation_id.as_str()).map(|reservation_id| {
                    ReserveRequest {
                        reservation_id,
                        sku: line.sku.clone(),
                        quantity: line.quantity,
                        ttl_seconds: order.ttl_seconds,
                    }
                });
            async move {
                let request = request
                    .map_err(|e| RouterError::Internal(format!("line reservation id: {e}")))?;
                let mut req = UpstreamRequest::post("/v1/reservations".to_owned(), partition)
                    .reservation(&request.reservation_id)
                    .json(&request)?;
                if ids == LineIds::Namespaced {
                    req = req.order_line();
                }
                under(tenure, forwarder.forward(&req)).await
            }
        }))
        .buffered(LINE_CONCURRENCY)
        .collect()
        .await;
    for (line, answer) in lines.iter_mut().zip(&reserves) {
        classify_reserve(line, answer.as_ref());
    }

    let placed = lines.iter().all(LineReport::is_secured);
    // Before releasing anything: is the lock still ours (as far as the keeper knows, and then
    // confirmed with the database)?
    let still_held = || async { tenure.held() && may_compensate().await };
    if !placed && !still_held().await {
        tracing::warn!(
            order_id,
            "order lock lost before compensation; leaving the order undecided"
        );
        for line in lines.iter_mut().filter(|l| l.needs_release(false)) {
            line.compensation = Some(Compensation::Failed);
        }
    } else if !placed {
        // Compensation phase.
        let mismatch = lines.iter().any(LineReport::is_mismatch);
        let to_release: Vec<usize> = lines
            .iter()
            .filter(|l| l.needs_release(mismatch))
            .map(|l| l.index)
            .collect();
        let releases: Vec<(usize, Compensation)> =
            futures::stream::iter(to_release.into_iter().map(|index| {
                let id = lines[index].reservation_id.clone();
                let reserved = lines[index].outcome;
                let partition = partitions[index];
                async move {
                    let req = UpstreamRequest::post(
                        format!("/v1/reservations/{}/release", encode_segment(&id)),
                        partition,
                    )
                    .reservation(&id);
                    let answer = under(tenure, forwarder.forward(&req)).await;
                    (index, classify_release(reserved, answer.as_ref()))
                }
            }))
            .buffered(LINE_CONCURRENCY)
            .collect()
            .await;
        for (index, compensation) in releases {
            lines[index].compensation = Some(compensation);
            match compensation {
                Compensation::Failed => tracing::warn!(
                    order_id,
                    reservation_id = %lines[index].reservation_id,
                    partition = partitions[index],
                    "order compensation failed; the hold expires by ttl"
                ),
                Compensation::Unsettled => tracing::info!(
                    order_id,
                    reservation_id = %lines[index].reservation_id,
                    partition = partitions[index],
                    "order line not found after an unknown reserve; leaving it to the retry"
                ),
                Compensation::Released | Compensation::NotHeld => {}
            }
        }
    }

    let result = decide(order_id, lines);
    metrics::record_order(result.outcome_label());
    tracing::info!(
        order_id,
        lines = order.lines.len(),
        outcome = result.outcome_label(),
        "order settled"
    );
    result
}

/// A forward sent under `tenure`: when the tenure is lost first, an error that says whether the
/// request may have gone out (it was started) or not (it never was).
async fn under(
    tenure: &lock::Tenure,
    forward: impl std::future::Future<Output = Result<UpstreamResponse, RouterError>>,
) -> Result<UpstreamResponse, RouterError> {
    let started = tenure.held();
    tenure.run(forward).await.unwrap_or_else(|| {
        Err(RouterError::Upstream {
            status: 503,
            outcome_unknown: started,
            partition: None,
            detail: "this submission lost the order's lock; it sends nothing more, retry the \
                     order with the same order id"
                .to_owned(),
        })
    })
}
