//! Classifying each line's answers and deciding the order's answer from them.
//!
//! A line is *settled* when its final state is known: held (for a placed order), or holding
//! nothing now and never later. A reserve that got a definitive answer settles its id for good
//! (the allocator stores the outcome, so a late duplicate of the request replays it). A release
//! that finds nothing (`404`) only settles a line whose reserve was definitive: if the reserve's
//! outcome is unknown, it may still be queued somewhere and commit after the release. Such a line
//! is reported as unsettled and the order answers `503` with `outcome_unknown: true`; the client's
//! retry (same order id) reserves the line again, which settles it either way.

use schema::wire::{Problem, ProblemType, Reservation, ReservationStatus};

use super::{Compensation, LineOutcome, LineReport, OrderPlaced, OrderProblem, OrderResult};
use crate::error::RouterError;
use crate::forward::UpstreamResponse;

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
        Ok(resp) => {
            let problem = upstream_problem(resp, "refused");
            // Only an answer that proves nothing is held under the line's id settles it as
            // refused. Anything else (a 429 or 401/403 from a limit or a credential, a 408, a
            // 413, a 5xx the forwarder does not retry) says nothing about what an earlier
            // attempt of the same request did, so the line may be held: it is compensated.
            report.outcome = if proves_nothing_held(resp.status, &problem) {
                LineOutcome::Refused
            } else {
                LineOutcome::Unknown
            };
            report.problem = Some(problem);
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

/// Whether a reserve's final answer proves that nothing is held under its id, now or later: the
/// allocator decided the id itself. `409 insufficient-stock` is stored under the id (a late
/// duplicate replays it); `404 not-found` means the SKU is unknown, so no attempt of this line
/// could have held it; `422 idempotency-mismatch` means the id holds another payload, which this
/// line never held. The problem type must match too: a `409`, `404` or `422` of another kind
/// (from a proxy, or a refusal before the id was looked at) proves nothing. A `429
/// quota-exceeded` naming `max_held_per_sku` or `max_held_units` is stored under the id by the
/// partition's owner like a refusal for stock (`V21__quota_refusals_stored.sql`,
/// `V22__hold_quota_units.sql`), so it settles the line too; any other `429` (a rate limit,
/// `max_quantity` at an edge, which records nothing) does not.
fn proves_nothing_held(status: u16, problem: &Problem) -> bool {
    let kind = match status {
        409 => ProblemType::InsufficientStock,
        404 => ProblemType::NotFound,
        422 => ProblemType::IdempotencyMismatch,
        429 if problem
            .quota
            .as_deref()
            .is_some_and(|q| STORED_QUOTAS.contains(&q)) =>
        {
            ProblemType::QuotaExceeded
        }
        _ => return false,
    };
    problem.kind == kind.uri()
}

/// The quotas whose refusals the partition's owner stores under the reservation id.
const STORED_QUOTAS: [&str; 2] = ["max_held_per_sku", "max_held_units"];

/// Classify the release answer for a line whose reserve ended as `reserved`.
pub fn classify_release(
    reserved: LineOutcome,
    answer: Result<&UpstreamResponse, &RouterError>,
) -> Compensation {
    match answer {
        Ok(resp) if resp.is_success() => match resp.json::<Reservation>() {
            Some(r) if r.status == ReservationStatus::Released => Compensation::Released,
            Some(_) => Compensation::NotHeld,
            None => Compensation::Failed,
        },
        // The id exists in a state that holds nothing releasable (expired, rejected, confirmed),
        // or was refused by a hold quota of the client and stored so (V21, V22).
        Ok(resp) if resp.status == 409 => Compensation::NotHeld,
        Ok(resp)
            if resp.status == 429
                && resp
                    .json::<Problem>()
                    .is_some_and(|p| proves_nothing_held(429, &p)) =>
        {
            Compensation::NotHeld
        }
        // No such id *now*. Conclusive only if the reserve's own answer was: otherwise that
        // reserve may still be on its way and commit after this release.
        Ok(resp) if resp.status == 404 => {
            if reserved.is_definitive() {
                Compensation::NotHeld
            } else {
                Compensation::Unsettled
            }
        }
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
    let unsettled = lines.iter().filter(|l| !l.is_settled()).count();
    let failed = lines.iter().filter(|l| !l.is_secured()).count();
    let mismatch = lines.iter().any(LineReport::is_mismatch);
    if unsettled > 0 {
        OrderResult::Unknown(OrderProblem {
            problem: Problem {
                outcome_unknown: Some(true),
                ..Problem::new(
                    ProblemType::UpstreamUnavailable,
                    format!(
                        "{failed} line(s) could not be held and {unsettled} line(s) may still \
                         be held or become held; retry the order with the same order id"
                    ),
                )
            },
            order_id: order_id.to_owned(),
            lines,
        })
    } else if mismatch {
        OrderResult::Mismatch(OrderProblem {
            problem: Problem {
                outcome_unknown: Some(false),
                ..Problem::new(
                    ProblemType::IdempotencyMismatch,
                    "some line ids of this order already exist with another sku or quantity; \
                     the original order is left as it was",
                )
            },
            order_id: order_id.to_owned(),
            lines,
        })
    } else {
        OrderResult::Failed(OrderProblem {
            problem: Problem {
                outcome_unknown: Some(false),
                ..Problem::new(
                    ProblemType::OrderFailed,
                    format!("{failed} line(s) could not be held; no line of the order is held"),
                )
            },
            order_id: order_id.to_owned(),
            lines,
        })
    }
}

/// The allocator's problem for a line, or (when its body is not one) an internal problem that
/// says what was wrong and quotes the start of the body.
fn upstream_problem(resp: &UpstreamResponse, fallback: &str) -> Problem {
    resp.json::<Problem>().unwrap_or_else(|| {
        let body: String = String::from_utf8_lossy(&resp.body)
            .chars()
            .take(200)
            .collect();
        Problem::new(ProblemType::Internal, format!("{fallback}: {body}")).with_status(resp.status)
    })
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
