//! Unit tests of [`super`]: classifying answers, deciding the order, and when a line is settled.

mod classify {
    use super::super::*;
    use crate::orders::line_reservation_id;
    use schema::wire::problem_type;

    fn report(index: usize, outcome: LineOutcome) -> LineReport {
        LineReport {
            index,
            sku: format!("sku-{index}").parse().unwrap(),
            quantity: 1.try_into().unwrap(),
            reservation_id: line_reservation_id("o-1", index),
            outcome,
            status: None,
            problem: None,
            compensation: None,
            reservation: None,
        }
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
    fn a_collision_releases_the_orders_own_holds_but_not_unknown_lines() {
        let mut mismatch = report(0, LineOutcome::Refused);
        mismatch.problem = Some(Problem {
            kind: problem_type::IDEMPOTENCY_MISMATCH.to_owned(),
            status: 422,
            ..Problem::default()
        });
        assert!(mismatch.is_mismatch());
        // Held by an earlier attempt of this order (its stored request matched): its own.
        let mut replayed = report(1, LineOutcome::Replayed);
        replayed.status = Some(ReservationStatus::Held);
        assert!(replayed.needs_release(true));
        replayed.compensation = Some(Compensation::Released);
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
        // A 422 of another kind is no collision.
        let mut other = report(0, LineOutcome::Refused);
        other.problem = Some(Problem {
            kind: problem_type::INVALID_REQUEST.to_owned(),
            status: 422,
            ..Problem::default()
        });
        assert!(!other.is_mismatch());
    }

    fn answer(status: u16, kind: Option<ProblemType>) -> UpstreamResponse {
        let body = match kind {
            Some(kind) => serde_json::to_vec(&Problem::new(kind, "x").with_status(status)),
            None => Ok(b"<html>busy</html>".to_vec()),
        };
        UpstreamResponse {
            status,
            headers: Vec::new(),
            body: body.unwrap().into(),
            destination: crate::assignment_cache::Destination {
                partition: 0,
                owner_id: "a".into(),
                owner_url: "http://a".into(),
                epoch: 1,
                map_revision: 1,
            },
            attempts: 2,
        }
    }

    #[test]
    fn only_answers_that_prove_nothing_is_held_refuse_a_line() {
        use ProblemType as T;
        let refusals = [
            (409, T::InsufficientStock),
            (404, T::NotFound),
            (422, T::IdempotencyMismatch),
        ];
        for (status, kind) in refusals {
            let mut line = report(0, LineOutcome::Unknown);
            classify_reserve(&mut line, Ok(&answer(status, Some(kind))));
            assert_eq!(line.outcome, LineOutcome::Refused, "{status} {kind:?}");
            assert_eq!(line.problem.unwrap().status, status);
        }
        let unknown = [
            (429, Some(T::RateLimited)),
            (401, Some(T::Unauthenticated)),
            (403, Some(T::Forbidden)),
            (408, None),
            (413, Some(T::InvalidRequest)),
            (400, Some(T::InvalidRequest)),
            (409, Some(T::InvalidState)),
            (404, None),
            (422, Some(T::InvalidRequest)),
            (500, Some(T::Internal)),
            (502, None),
        ];
        for (status, kind) in unknown {
            let mut line = report(0, LineOutcome::Held);
            classify_reserve(&mut line, Ok(&answer(status, kind)));
            assert_eq!(line.outcome, LineOutcome::Unknown, "{status} {kind:?}");
            // The allocator's answer is kept for the client, or described when it is no problem.
            assert_eq!(line.problem.as_ref().unwrap().status, status, "{status}");
            assert!(
                line.needs_release(false),
                "{status}: an unknown line is compensated"
            );
        }
    }

    /// A `429 quota-exceeded` settles a line only when it names a hold quota (`max_held_per_sku`,
    /// `max_held_units`: stored under the id by the partition's owner); `max_quantity` at an edge
    /// records nothing.
    #[test]
    fn only_a_stored_quota_refusal_refuses_a_line() {
        let quota = |name: &str| {
            let problem = Problem {
                quota: Some(name.to_owned()),
                limit: Some(2),
                ..Problem::new(ProblemType::QuotaExceeded, "x").with_status(429)
            };
            UpstreamResponse {
                body: serde_json::to_vec(&problem).unwrap().into(),
                ..answer(429, None)
            }
        };
        let mut line = report(0, LineOutcome::Unknown);
        classify_reserve(&mut line, Ok(&quota("max_held_per_sku")));
        assert_eq!(line.outcome, LineOutcome::Refused);
        let mut line = report(0, LineOutcome::Unknown);
        classify_reserve(&mut line, Ok(&quota("max_held_units")));
        assert_eq!(line.outcome, LineOutcome::Refused);
        let mut line = report(0, LineOutcome::Unknown);
        classify_reserve(&mut line, Ok(&quota("max_quantity")));
        assert_eq!(line.outcome, LineOutcome::Unknown);
        let mut line = report(0, LineOutcome::Unknown);
        classify_reserve(
            &mut line,
            Ok(&answer(429, Some(ProblemType::QuotaExceeded))),
        );
        assert_eq!(line.outcome, LineOutcome::Unknown, "no quota named");
        // A release that finds the id stored as refused by the quota: nothing is held.
        let stored = classify_release(LineOutcome::Unknown, Ok(&quota("max_held_per_sku")));
        assert_eq!(stored, Compensation::NotHeld);
        let stored = classify_release(LineOutcome::Unknown, Ok(&quota("max_held_units")));
        assert_eq!(stored, Compensation::NotHeld);
        let limited = classify_release(
            LineOutcome::Unknown,
            Ok(&answer(429, Some(ProblemType::RateLimited))),
        );
        assert_eq!(limited, Compensation::Failed);
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
        assert_eq!(json["lines"][0]["reservation_id"], "order:o-1:0");
        assert_eq!(json["lines"][0]["problem"]["available"], 2);
    }
}

mod settlement {
    use super::super::*;
    use crate::orders::line_reservation_id;

    fn report(index: usize, outcome: LineOutcome) -> LineReport {
        LineReport {
            index,
            sku: format!("sku-{index}").parse().unwrap(),
            quantity: 1.try_into().unwrap(),
            reservation_id: line_reservation_id("o-1", index),
            outcome,
            status: None,
            problem: None,
            compensation: None,
            reservation: None,
        }
    }

    fn refused(index: usize, status: u16) -> LineReport {
        let kind = match status {
            409 => ProblemType::InsufficientStock,
            422 => ProblemType::IdempotencyMismatch,
            _ => ProblemType::NotFound,
        };
        let mut line = report(index, LineOutcome::Refused);
        line.problem = Some(Problem::new(kind, "refused").with_status(status));
        line
    }

    #[test]
    fn a_release_that_finds_nothing_settles_only_a_definitive_reserve() {
        // `classify_release` on a plain 404 answer is covered through `decide`: an unknown
        // reserve compensated by a "not found" release is unsettled, a refused one is not.
        let mut unknown = report(0, LineOutcome::Unknown);
        unknown.compensation = Some(Compensation::Unsettled);
        assert!(!unknown.is_settled());
        match decide("o-1", vec![unknown, refused(1, 409)]) {
            OrderResult::Unknown(p) => {
                assert_eq!(p.problem.status, 503);
                assert_eq!(p.problem.outcome_unknown, Some(true));
            }
            other => panic!("a line that may still be held must not fail the order: {other:?}"),
        }
        let mut unavailable = report(0, LineOutcome::Unavailable);
        unavailable.compensation = Some(Compensation::Released);
        assert!(unavailable.is_settled());
        assert_eq!(
            decide("o-1", vec![unavailable, refused(1, 409)]).outcome_label(),
            "failed"
        );
    }

    #[test]
    fn unknown_lines_left_alone_after_a_mismatch_are_not_settled() {
        let unknown = report(1, LineOutcome::Unknown);
        assert!(!unknown.needs_release(true));
        assert!(!unknown.is_settled());
        match decide("o-1", vec![refused(0, 422), unknown]) {
            OrderResult::Unknown(p) => assert_eq!(p.problem.outcome_unknown, Some(true)),
            other => panic!("{other:?}"),
        }
        // Without the unknown line the mismatch is definitive.
        assert_eq!(
            decide("o-1", vec![refused(0, 422)]).outcome_label(),
            "mismatch"
        );
    }

    #[test]
    fn definitive_reserve_outcomes() {
        for o in [
            LineOutcome::Held,
            LineOutcome::Replayed,
            LineOutcome::Inactive,
            LineOutcome::Refused,
        ] {
            assert!(o.is_definitive(), "{o:?}");
        }
        for o in [LineOutcome::Unknown, LineOutcome::Unavailable] {
            assert!(!o.is_definitive(), "{o:?}");
        }
    }
}
