//! All-or-nothing multi-line orders (`POST /v1/orders/{order_id}/reservations`).
//!
//! An order's lines usually live on different partitions, hence on different allocators, and
//! there is no distributed transaction. The router gets "all or nothing" from two properties the
//! allocator already guarantees — idempotent reservations and idempotent release — plus
//! deterministic ids:
//!
//! 1. **Reserve.** Line `i` is reserved under the id `{order_id}:{i}` ([`line_reservation_id`]),
//!    all lines concurrently, each through the normal retrying forwarder. The id depends only on
//!    the order id and the line's position, so a retry of the same order reserves the *same* ids
//!    and gets the stored outcomes back instead of taking stock twice. (The SKU is not part of the
//!    id: with a 200-byte order id and a 64-byte SKU the id could exceed the 255-byte limit, and
//!    leaving it out means a retry that changed a line is refused with `422` instead of silently
//!    holding something else.) Two lines for the same SKU are fine: they have different indexes.
//! 2. **Decide.** If every line is held (newly or by an earlier attempt of this order), the order
//!    succeeds: `201` with all reservations (`200` + `Idempotent-Replayed` if nothing was new).
//! 3. **Compensate.** Otherwise every line that is or may be held — held now, replayed as held,
//!    or with an unknown or unavailable outcome (an earlier attempt of the order may have held
//!    it) — is released (idempotent; releasing an id that was never created is a harmless `404`).
//!    The answer is `409 order-failed` listing each line's outcome and its compensation. If some
//!    release could not be confirmed, the answer is `503 upstream-unavailable` with
//!    `outcome_unknown: true` instead: the client should retry the order with the same id later.
//! 4. **Reused order id.** If a line is refused with `422` (its id exists with another SKU or
//!    quantity), the order id was used before with different lines. The answer is `422
//!    idempotency-mismatch`, and only holds *this* request created are released: replayed holds
//!    belong to the order as first placed, which a mistaken reuse must not undo.
//!
//! **Retries converge.** A retry with the same order id replays each line's stored outcome. An
//! order that was placed replays its holds (`200`). A line released by an earlier compensation
//! replays as `released`, so an order answered `409` stays failed (use a new order id to try
//! again). An order answered `503` (outcome unknown) converges to whatever its retry finds: if an
//! earlier attempt released a line it fails again; if nothing was held or released (every owner
//! was unreachable) the retry can still place it.
//!
//! **If the router dies mid-order** (crash between reserving some lines and answering), some
//! lines may be held with nobody to compensate them. Nothing is lost: every hold carries the
//! order's TTL (`ttl_seconds`, default 15 min) and the owning allocator expires it, returning the
//! stock. The client saw a connection error, so it retries the order with the same id (any
//! router): held lines replay as held, missing lines are reserved, and the order converges to one
//! outcome — success, or failure with compensation. The same holds if a line's reserve timed out
//! and is still executing when the release runs: the release finds nothing (`404`), the late
//! reserve commits, and that hold expires by TTL (or is released by the retried order).
//!
//! The order's total time is bounded by two retry deadlines (reserve phase, then compensation).

use allocator::wire::{
    limits, problem_type, validate, OrderRequest, Problem, Reservation, ReservationStatus,
    ReserveRequest,
};
use futures::StreamExt;
use serde::Serialize;

use crate::error::RouterError;
use crate::forward::{encode_segment, Forwarder, UpstreamRequest, UpstreamResponse};
use crate::metrics;

/// Longest order id; leaves room for `:{index}` within the 255-byte reservation id limit.
pub const ORDER_ID_MAX_LEN: usize = 200;
/// Lines reserved (or released) at the same time.
const LINE_CONCURRENCY: usize = 16;

/// The reservation id of line `index` of order `order_id`.
///
/// Injective: the index is the decimal suffix after the last `:`, so two (order, line) pairs never
/// share an id.
pub fn line_reservation_id(order_id: &str, index: usize) -> String {
    format!("{order_id}:{index}")
}

/// Validate an order; returns nothing but the first problem found.
pub fn validate_order(order_id: &str, order: &OrderRequest) -> Result<(), String> {
    validate::id("order_id", order_id)?;
    if order_id.len() > ORDER_ID_MAX_LEN {
        return Err(format!("order_id must be at most {ORDER_ID_MAX_LEN} bytes"));
    }
    if order.lines.is_empty() || order.lines.len() > limits::ORDER_LINES_MAX {
        return Err(format!(
            "an order must have 1..={} lines",
            limits::ORDER_LINES_MAX
        ));
    }
    for (i, line) in order.lines.iter().enumerate() {
        validate::sku(&line.sku).map_err(|e| format!("lines[{i}]: {e}"))?;
        validate::quantity(line.quantity).map_err(|e| format!("lines[{i}]: {e}"))?;
    }
    validate::ttl_seconds(order.ttl_seconds)?;
    Ok(())
}

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
}

/// One line in an order's answer.
#[derive(Debug, Clone, Serialize)]
pub struct LineReport {
    pub index: usize,
    pub sku: String,
    pub quantity: i64,
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
    /// When the order id was reused with another payload (`mismatch`), only holds this request
    /// created are released: replayed holds belong to the order as first placed, which this
    /// request must not undo.
    pub fn needs_release(&self, mismatch: bool) -> bool {
        match self.outcome {
            LineOutcome::Held => true,
            _ if mismatch => false,
            LineOutcome::Unknown | LineOutcome::Unavailable => true,
            LineOutcome::Replayed => self.status != Some(ReservationStatus::Confirmed),
            LineOutcome::Inactive | LineOutcome::Refused => false,
        }
    }

    /// The allocator refused the line because its id exists with another payload.
    pub fn is_mismatch(&self) -> bool {
        self.outcome == LineOutcome::Refused
            && self.problem.as_ref().is_some_and(|p| p.status == 422)
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
    /// Decided failure; nothing of the order is held (409).
    Failed(OrderProblem),
    /// The order id was used before with other lines (422); holds of the original order stay.
    Mismatch(OrderProblem),
    /// Failure whose compensation could not be confirmed (503, `outcome_unknown`).
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

/// Classify the reserve answer for one line.
pub fn classify_reserve(report: &mut LineReport, answer: Result<&UpstreamResponse, &RouterError>) {
    match answer {
        Ok(resp) if resp.is_success() => match resp.json::<Reservation>() {
            Some(r) => {
                report.outcome = match (resp.status, r.status) {
                    (201, ReservationStatus::Held) => LineOutcome::Held,
                    (_, ReservationStatus::Held | ReservationStatus::Confirmed) => {
                        LineOutcome::Replayed
                    }
                    (_, ReservationStatus::Released | ReservationStatus::Expired) => {
                        LineOutcome::Inactive
                    }
                };
                report.status = Some(r.status);
                report.reservation = Some(r);
            }
            None => {
                report.outcome = LineOutcome::Unknown;
                report.problem = Some(upstream_problem(resp, "unreadable reservation body"));
            }
        },
        Ok(resp) if (400..500).contains(&resp.status) => {
            report.outcome = LineOutcome::Refused;
            report.problem = Some(upstream_problem(resp, "refused"));
        }
        Ok(resp) => {
            // A 5xx the forwarder does not retry: the allocator failed in an unknown state.
            report.outcome = LineOutcome::Unknown;
            report.problem = Some(upstream_problem(resp, "upstream error"));
        }
        Err(err) => {
            report.outcome = match err {
                RouterError::Upstream {
                    outcome_unknown: false,
                    ..
                } => LineOutcome::Unavailable,
                _ => LineOutcome::Unknown,
            };
            report.problem = Some(err.problem());
        }
    }
}

/// Classify the release answer for one line.
pub fn classify_release(answer: Result<&UpstreamResponse, &RouterError>) -> Compensation {
    match answer {
        Ok(resp) if resp.is_success() => match resp.json::<Reservation>() {
            Some(r) if r.status == ReservationStatus::Released => Compensation::Released,
            Some(_) => Compensation::NotHeld,
            None => Compensation::Failed,
        },
        // Unknown id, or a state that holds nothing releasable (expired, rejected, confirmed).
        Ok(resp) if resp.status == 404 || resp.status == 409 => Compensation::NotHeld,
        Ok(_) | Err(_) => Compensation::Failed,
    }
}

/// Decide the order's answer from the final line reports.
pub fn decide(order_id: &str, lines: Vec<LineReport>) -> OrderResult {
    if lines.iter().all(LineReport::is_secured) {
        let replayed = lines.iter().all(|l| l.outcome == LineOutcome::Replayed);
        let reservations = lines.into_iter().filter_map(|l| l.reservation).collect();
        return OrderResult::Placed {
            body: OrderPlaced {
                order_id: order_id.to_owned(),
                reservations,
            },
            replayed,
        };
    }
    let unsettled = lines
        .iter()
        .filter(|l| l.compensation == Some(Compensation::Failed))
        .count();
    let failed = lines.iter().filter(|l| !l.is_secured()).count();
    let mismatch = lines.iter().any(LineReport::is_mismatch);
    if unsettled > 0 {
        OrderResult::Unknown(OrderProblem {
            problem: Problem {
                kind: problem_type::UPSTREAM_UNAVAILABLE.to_owned(),
                title: "order outcome unknown".to_owned(),
                status: 503,
                detail: Some(format!(
                    "{failed} line(s) could not be held and {unsettled} line(s) could not be \
                     released; retry the order with the same order id"
                )),
                outcome_unknown: Some(true),
                ..Problem::default()
            },
            order_id: order_id.to_owned(),
            lines,
        })
    } else if mismatch {
        OrderResult::Mismatch(OrderProblem {
            problem: Problem {
                kind: problem_type::IDEMPOTENCY_MISMATCH.to_owned(),
                title: "order id reused with different lines".to_owned(),
                status: 422,
                detail: Some(
                    "some line ids of this order already exist with another sku or quantity; \
                     the original order is left as it was"
                        .to_owned(),
                ),
                outcome_unknown: Some(false),
                ..Problem::default()
            },
            order_id: order_id.to_owned(),
            lines,
        })
    } else {
        OrderResult::Failed(OrderProblem {
            problem: Problem {
                kind: problem_type::ORDER_FAILED.to_owned(),
                title: "order failed".to_owned(),
                status: 409,
                detail: Some(format!(
                    "{failed} line(s) could not be held; no line of the order is held"
                )),
                outcome_unknown: Some(false),
                ..Problem::default()
            },
            order_id: order_id.to_owned(),
            lines,
        })
    }
}

fn upstream_problem(resp: &UpstreamResponse, fallback: &str) -> Problem {
    resp.json::<Problem>().unwrap_or_else(|| Problem {
        kind: problem_type::INTERNAL.to_owned(),
        title: fallback.to_owned(),
        status: resp.status,
        detail: Some(
            String::from_utf8_lossy(&resp.body)
                .chars()
                .take(200)
                .collect(),
        ),
        ..Problem::default()
    })
}

/// Place an order: reserve every line, then succeed or compensate. `partition_of` maps a SKU to
/// its partition (the shared hash with the cluster's partition count).
pub async fn place(
    forwarder: &Forwarder,
    order_id: &str,
    order: &OrderRequest,
    partition_of: impl Fn(&str) -> u32,
) -> OrderResult {
    let mut lines: Vec<LineReport> = order
        .lines
        .iter()
        .enumerate()
        .map(|(index, line)| LineReport {
            index,
            sku: line.sku.clone(),
            quantity: line.quantity,
            reservation_id: line_reservation_id(order_id, index),
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
            let request = ReserveRequest {
                reservation_id: line.reservation_id.clone(),
                sku: line.sku.clone(),
                quantity: line.quantity,
                ttl_seconds: order.ttl_seconds,
            };
            async move {
                let req = UpstreamRequest::post("/v1/reservations".to_owned(), partition)
                    .reservation(&request.reservation_id)
                    .json(&request)?;
                forwarder.forward(&req).await
            }
        }))
        .buffered(LINE_CONCURRENCY)
        .collect()
        .await;
    for (line, answer) in lines.iter_mut().zip(&reserves) {
        classify_reserve(line, answer.as_ref());
    }

    if !lines.iter().all(LineReport::is_secured) {
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
                let partition = partitions[index];
                async move {
                    let req = UpstreamRequest::post(
                        format!("/v1/reservations/{}/release", encode_segment(&id)),
                        partition,
                    )
                    .reservation(&id);
                    let answer = forwarder.forward(&req).await;
                    (index, classify_release(answer.as_ref()))
                }
            }))
            .buffered(LINE_CONCURRENCY)
            .collect()
            .await;
        for (index, compensation) in releases {
            lines[index].compensation = Some(compensation);
            if compensation == Compensation::Failed {
                tracing::warn!(
                    order_id,
                    reservation_id = %lines[index].reservation_id,
                    partition = partitions[index],
                    "order compensation failed; the hold expires by ttl"
                );
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

#[cfg(test)]
mod tests {
    use super::*;
    use allocator::wire::OrderLine;

    fn report(index: usize, outcome: LineOutcome) -> LineReport {
        LineReport {
            index,
            sku: format!("sku-{index}"),
            quantity: 1,
            reservation_id: line_reservation_id("o-1", index),
            outcome,
            status: None,
            problem: None,
            compensation: None,
            reservation: None,
        }
    }

    #[test]
    fn line_ids_are_deterministic_and_distinct() {
        assert_eq!(line_reservation_id("order-7", 0), "order-7:0");
        assert_eq!(line_reservation_id("order-7", 12), "order-7:12");
        assert_eq!(
            line_reservation_id("order-7", 3),
            line_reservation_id("order-7", 3)
        );
        // Injective even when order ids themselves contain ':' and digits.
        let mut seen = std::collections::HashSet::new();
        for order in ["a", "a:1", "a:10", "a:1:0", "1"] {
            for i in 0..limits::ORDER_LINES_MAX {
                assert!(
                    seen.insert(line_reservation_id(order, i)),
                    "{order}/{i} collides"
                );
            }
        }
    }

    #[test]
    fn longest_line_id_fits_the_reservation_id_limit() {
        let order_id = "x".repeat(ORDER_ID_MAX_LEN);
        let id = line_reservation_id(&order_id, limits::ORDER_LINES_MAX - 1);
        assert!(validate::id("reservation_id", &id).is_ok(), "{}", id.len());
    }

    #[test]
    fn validates_order_bounds() {
        let line = |sku: &str, quantity| OrderLine {
            sku: sku.to_owned(),
            quantity,
        };
        let order = |lines| OrderRequest {
            lines,
            ttl_seconds: None,
        };
        assert!(validate_order("o", &order(vec![line("a", 1), line("a", 2)])).is_ok());
        assert!(validate_order("o", &order(vec![])).is_err());
        assert!(
            validate_order("o", &order(vec![line("a", 1); limits::ORDER_LINES_MAX + 1])).is_err()
        );
        assert!(validate_order("o", &order(vec![line("a", 1); limits::ORDER_LINES_MAX])).is_ok());
        assert!(validate_order(&"o".repeat(201), &order(vec![line("a", 1)])).is_err());
        assert!(validate_order(&"o".repeat(200), &order(vec![line("a", 1)])).is_ok());
        assert!(validate_order("", &order(vec![line("a", 1)])).is_err());
        let err = validate_order("o", &order(vec![line("a", 1), line("bad sku", 1)])).unwrap_err();
        assert!(err.starts_with("lines[1]"), "{err}");
        assert!(validate_order("o", &order(vec![line("a", 0)])).is_err());
        let mut o = order(vec![line("a", 1)]);
        o.ttl_seconds = Some(0);
        assert!(validate_order("o", &o).is_err());
    }

    #[test]
    fn all_secured_lines_place_the_order() {
        let lines = vec![
            report(0, LineOutcome::Held),
            report(1, LineOutcome::Replayed),
        ];
        match decide("o-1", lines) {
            OrderResult::Placed { replayed, .. } => assert!(!replayed),
            other => panic!("{other:?}"),
        }
        let lines = vec![
            report(0, LineOutcome::Replayed),
            report(1, LineOutcome::Replayed),
        ];
        assert_eq!(decide("o-1", lines).outcome_label(), "replayed");
    }

    #[test]
    fn a_failed_line_fails_the_order_and_compensation_decides_409_or_503() {
        let mut held = report(0, LineOutcome::Held);
        held.compensation = Some(Compensation::Released);
        let refused = report(1, LineOutcome::Refused);
        match decide("o-1", vec![held.clone(), refused.clone()]) {
            OrderResult::Failed(p) => {
                assert_eq!(p.problem.status, 409);
                assert_eq!(p.problem.kind, problem_type::ORDER_FAILED);
                assert_eq!(p.problem.outcome_unknown, Some(false));
                assert_eq!(p.lines.len(), 2);
            }
            other => panic!("{other:?}"),
        }
        held.compensation = Some(Compensation::Failed);
        match decide("o-1", vec![held, refused]) {
            OrderResult::Unknown(p) => {
                assert_eq!(p.problem.status, 503);
                assert_eq!(p.problem.outcome_unknown, Some(true));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn compensation_targets_everything_possibly_held() {
        assert!(report(0, LineOutcome::Held).needs_release(false));
        assert!(report(0, LineOutcome::Unknown).needs_release(false));
        assert!(report(0, LineOutcome::Unavailable).needs_release(false));
        let mut replayed = report(0, LineOutcome::Replayed);
        replayed.status = Some(ReservationStatus::Held);
        assert!(replayed.needs_release(false));
        replayed.status = Some(ReservationStatus::Confirmed);
        assert!(!replayed.needs_release(false));
        assert!(!report(0, LineOutcome::Refused).needs_release(false));
        assert!(!report(0, LineOutcome::Inactive).needs_release(false));
    }

    #[test]
    fn a_reused_order_id_only_undoes_its_own_new_holds() {
        let mut mismatch = report(0, LineOutcome::Refused);
        mismatch.problem = Some(Problem {
            kind: problem_type::IDEMPOTENCY_MISMATCH.to_owned(),
            status: 422,
            ..Problem::default()
        });
        assert!(mismatch.is_mismatch());
        let mut replayed = report(1, LineOutcome::Replayed);
        replayed.status = Some(ReservationStatus::Held);
        assert!(!replayed.needs_release(true));
        assert!(!report(2, LineOutcome::Unknown).needs_release(true));
        let mut new = report(3, LineOutcome::Held);
        assert!(new.needs_release(true));
        new.compensation = Some(Compensation::Released);
        match decide("o-1", vec![mismatch, replayed, new]) {
            OrderResult::Mismatch(p) => {
                assert_eq!(p.problem.status, 422);
                assert_eq!(p.problem.kind, problem_type::IDEMPOTENCY_MISMATCH);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failure_body_lists_lines_next_to_problem_fields() {
        let mut line = report(0, LineOutcome::Refused);
        line.problem = Some(Problem {
            kind: problem_type::INSUFFICIENT_STOCK.to_owned(),
            title: "insufficient stock".to_owned(),
            status: 409,
            available: Some(2),
            ..Problem::default()
        });
        let OrderResult::Failed(p) = decide("o-1", vec![line]) else {
            panic!("expected failure")
        };
        let json = serde_json::to_value(&p).unwrap();
        assert_eq!(json["type"], problem_type::ORDER_FAILED);
        assert_eq!(json["status"], 409);
        assert_eq!(json["order_id"], "o-1");
        assert_eq!(json["lines"][0]["outcome"], "refused");
        assert_eq!(json["lines"][0]["reservation_id"], "o-1:0");
        assert_eq!(json["lines"][0]["problem"]["available"], 2);
    }
}
