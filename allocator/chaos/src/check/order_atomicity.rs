//! `order-atomicity`: an order holds all of its lines or none, and what a client was told
//! matches what was stored.
//!
//! * An order answered `2xx` (or stored `placed`) held every line under the line's own payload:
//!   each line is a reservation that was reserved once (and may since be confirmed, released or
//!   expired).
//! * An order that settled as not placed — answered `409` or `422` or any other `4xx`, or stored
//!   `failed` or `refused` — holds nothing: no line is held or confirmed at the end, every hold a
//!   line took was given back, and, when the refusal's arrival time is recorded, given back
//!   *before* the client had the answer (the answer says nothing is held; a hold released or
//!   expired only afterwards was held while the client was told otherwise).
//! * An order answered `2xx` is not stored `failed`/`refused`; one answered `409`/`422` is not
//!   stored `placed`.
//!
//! Orders answered `5xx` or not at all (outcome unknown) and still `pending` are judged by
//! `orphan-held-line` only. A line whose id a single reservation took (a collision, told apart
//! by payload) is that reservation's, not the order's. An order and lines the retention job
//! removed past the horizon are judged by what is left of them (see [`Facts`]).

use super::facts::{Line, ARCHIVED};
use super::{Facts, Outcome, Rule};

pub(super) const RULE: Rule = Rule {
    name: "order-atomicity",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut ids: Vec<&str> = facts.order_ids.iter().copied().collect();
    ids.sort_unstable();
    let mut found = Vec::new();
    for order in ids {
        let answers = facts.submissions(order);
        let stored = facts.dump.orders.get(order);
        let stored_status = stored.map(|o| o.status.as_str());
        let lines = answers
            .first()
            .map(|op| op.order_lines())
            .or_else(|| stored.map(|o| o.lines.clone()))
            .unwrap_or_default();
        let placed_answer = answers.iter().any(|a| a.outcome == Outcome::Acknowledged);
        let decided_refusal = answers.iter().find(|a| matches!(a.status, Some(409 | 422)));
        let refused_answer = answers.iter().find(|a| a.outcome == Outcome::Refused);
        if placed_answer
            && !matches!(stored_status, Some("placed"))
            && !facts.order_removed_past_horizon(order)
        {
            found.push(format!(
                "order {order} answered placed, stored {stored_status:?}"
            ));
        }
        if let (Some(a), Some("placed")) = (decided_refusal, stored_status) {
            found.push(format!(
                "order {order} answered {:?}, stored placed",
                a.status
            ));
        }
        if placed_answer || stored_status == Some("placed") {
            placed(facts, order, &lines, &mut found);
        } else if refused_answer.is_some() || matches!(stored_status, Some("failed" | "refused")) {
            let answered_ms = refused_answer.and_then(|a| a.complete_wall_ms);
            not_placed(facts, order, &lines, answered_ms, &mut found);
        }
    }
    found
}

/// Every line was held by the order itself.
fn placed(facts: &Facts, order: &str, lines: &[(String, i64)], found: &mut Vec<String>) {
    let sent = facts.first_sent_us(order);
    for (i, (sku, qty)) in lines.iter().enumerate() {
        match facts.line(order, i, sku, *qty) {
            Line::Own(id) => {
                let status = facts.final_status(&id);
                let reserves = facts
                    .kinds_from_reserve(&id)
                    .map_or(1, |kinds| kinds.iter().filter(|k| **k == "reserve").count());
                if status == Some(ARCHIVED) {
                    continue;
                }
                if !matches!(status, Some("held" | "confirmed" | "released" | "expired"))
                    || reserves != 1
                {
                    found.push(format!(
                        "order {order} placed but line {id} is {status:?} with {reserves} reserve rows"
                    ));
                }
            }
            Line::NotStored
                if super::facts::line_ids(order, i)
                    .iter()
                    .any(|id| facts.removed_past_horizon(id, sent)) => {}
            Line::NotStored => found.push(format!("order {order} placed but line {i} never held")),
            Line::Foreign(id) => found.push(format!(
                "order {order} placed but line {id} is stored with another payload"
            )),
            Line::Ambiguous(_) => {}
        }
    }
}

/// No line holds anything, and every hold was given back before the answer arrived.
fn not_placed(
    facts: &Facts,
    order: &str,
    lines: &[(String, i64)],
    answered_ms: Option<i64>,
    found: &mut Vec<String>,
) {
    for (i, (sku, qty)) in lines.iter().enumerate() {
        let Line::Own(id) = facts.line(order, i, sku, *qty) else {
            continue;
        };
        let status = facts.final_status(&id);
        let rows = facts
            .ledger_by_id
            .get(id.as_str())
            .cloned()
            .unwrap_or_default();
        let taken = facts
            .kinds_from_reserve(&id)
            .map_or(0, |kinds| kinds.iter().filter(|k| **k == "reserve").count());
        let back: Vec<_> = rows
            .iter()
            .filter(|r| matches!(r.kind.as_str(), "release" | "expire"))
            .collect();
        if matches!(status, Some("held" | "confirmed")) || taken != back.len() {
            let kinds = facts.kinds(&id);
            found.push(format!(
                "order {order} not placed but line {id} is {status:?}, ledger {kinds:?}"
            ));
            continue;
        }
        // The answer's arrival is recorded in whole milliseconds (truncated), the give-back in
        // microseconds: only a give-back from the next millisecond on is surely after it.
        if let Some(ms) = answered_ms {
            let surely_after_us = (ms + 1) * 1000;
            if let Some(late) = back.iter().find(|r| r.written_us >= surely_after_us) {
                found.push(format!(
                    "order {order} not placed but line {id} was held until its {} {} µs after the answer's millisecond",
                    late.kind,
                    late.written_us - surely_after_us
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::super::{check, Dump, Op};
    use serde_json::json;

    fn order_op(id: &str, status: Option<i64>, answered_ms: i64) -> Op {
        op_at(
            "order",
            json!({"order_id": id, "lines": [{"sku": "a", "quantity": 1}, {"sku": "a", "quantity": 1}]}),
            status,
            answered_ms,
        )
    }

    /// o1's line 0 (in `form`) held at t=1300 µs and, optionally, given back.
    fn with_line(form: &str, back: Option<(&str, i64)>) -> (Vec<Op>, Dump) {
        let (history, mut dump) = clean();
        add_hold(&mut dump, form, 1, 1300, back);
        (history, dump)
    }

    #[test]
    fn fires_for_a_placed_order_with_a_line_never_held() {
        for form in ["o1:0", "order:o1:0"] {
            let (mut history, mut dump) = with_line(form, None);
            history.push(order_op("o1", Some(201), 2));
            dump.orders
                .insert("o1".into(), order("placed", &[("a", 1), ("a", 1)]));
            only(&check(&history, &dump), "order-atomicity");
        }
    }

    #[test]
    fn fires_for_a_refused_order_with_a_line_still_held_whatever_the_answer() {
        // (A hold of a failed order is an orphan as well.)
        let orphan = ["orphan-held-line"];
        for (status, stored) in [(409, Some("failed")), (422, Some("refused")), (429, None)] {
            for form in ["o1:0", "order:o1:0"] {
                let (mut history, mut dump) = with_line(form, None);
                history.push(order_op("o1", Some(status), 2));
                if let Some(stored) = stored {
                    dump.orders
                        .insert("o1".into(), order(stored, &[("a", 1), ("a", 1)]));
                }
                fires(&check(&history, &dump), "order-atomicity", &orphan);
            }
        }
        // Answered 503 (unknown), then stored failed by a later attempt: still held is wrong.
        let (mut history, mut dump) = with_line("o1:0", None);
        history.push(order_op("o1", Some(503), 2));
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1), ("a", 1)]));
        fires(&check(&history, &dump), "order-atomicity", &orphan);
    }

    #[test]
    fn fires_for_a_hold_given_back_only_after_the_refusal() {
        // Answered 409 at t=2 ms; line 0 expired at t=5 ms: held while the client was told not.
        let (mut history, mut dump) = with_line("o1:0", Some(("expire", 5000)));
        history.push(order_op("o1", Some(409), 2));
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1), ("a", 1)]));
        only(&check(&history, &dump), "order-atomicity");
        // Released within the millisecond the answer arrived in (recorded truncated, as 2 ms):
        // not surely after it.
        let (mut history, mut dump) = with_line("o1:0", Some(("release", 2600)));
        history.push(order_op("o1", Some(409), 2));
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1), ("a", 1)]));
        passes(&history, &dump);
        // Released from the next millisecond on: after the answer.
        let (mut history, mut dump) = with_line("o1:0", Some(("release", 3000)));
        history.push(order_op("o1", Some(409), 2));
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1), ("a", 1)]));
        only(&check(&history, &dump), "order-atomicity");
        // Released before the answer: fine.
        let (mut history, mut dump) = with_line("o1:0", Some(("release", 1500)));
        history.push(order_op("o1", Some(409), 2));
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1), ("a", 1)]));
        passes(&history, &dump);
    }

    #[test]
    fn fires_when_the_answer_contradicts_the_stored_decision() {
        let (mut history, mut dump) = with_line("o1:0", Some(("release", 1500)));
        history.push(order_op("o1", Some(409), 2));
        dump.orders
            .insert("o1".into(), order("placed", &[("a", 1), ("a", 1)]));
        let report = check(&history, &dump);
        assert!(report.count("order-atomicity") > 0, "{}", report.table());
    }

    #[test]
    fn a_colliding_single_reservation_is_not_the_orders_line() {
        // A single reserve took o1:0 (3 units) before the order; the order was refused (422)
        // and the single hold is still held: that hold is not the order's.
        let (mut history, mut dump) = clean();
        add_hold(&mut dump, "o1:0", 3, 1300, None);
        history.push(reserve("o1:0", "a", 3, Some(201)));
        history.push(order_op("o1", Some(422), 2));
        dump.orders
            .insert("o1".into(), order("refused", &[("a", 1), ("a", 1)]));
        passes(&history, &dump);
        // With the reserved namespace the single reserve is refused and the order placed.
        let (mut history, mut dump) = with_line("order:o1:0", None);
        add_hold(&mut dump, "order:o1:1", 1, 1400, None);
        history.push(reserve("order:o1:0", "a", 3, Some(400)));
        history.push(order_op("o1", Some(201), 2));
        dump.orders
            .insert("o1".into(), order("placed", &[("a", 1), ("a", 1)]));
        passes(&history, &dump);
    }
}
