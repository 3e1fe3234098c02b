//! `orphan-held-line`: every hold left at the end under an order's line id belongs to an order
//! that can still own it.
//!
//! The order must be stored `placed` or `pending` (not decided yet: a retry of the same order id
//! decides it) with that line's payload, or — not stored at all — have a submission whose
//! outcome is unknown (no answer, `5xx`: a router that lost its session mid-order leaves no row,
//! and the client's retry owns the line). A hold under a line id of an order stored `failed` or
//! `refused`, or of an order nobody may retry, is stock held that nothing will ever release but
//! its expiry.
//!
//! Ids in the older form (`{o}:{i}`) count only when `o` is a known order id; a single
//! reservation that took such an id (a collision, told apart by payload) is not an order line.

use super::facts::parse_line_id;
use super::{Facts, Outcome, Rule};

pub(super) const RULE: Rule = Rule {
    name: "orphan-held-line",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    for (id, r) in &facts.dump.reservations {
        if r.status != "held" {
            continue;
        }
        let Some((order, index)) = parse_line_id(id) else {
            continue;
        };
        if !id.starts_with("order:") && !facts.order_ids.contains(order) {
            continue;
        }
        // A single reserve asked for exactly this payload under this id: the hold is its own.
        if facts.single_reserve_asked(id, &r.sku, r.quantity) {
            continue;
        }
        let payload = (r.sku.clone(), r.quantity);
        let owner = match facts.dump.orders.get(order) {
            Some(o) if !matches!(o.status.as_str(), "placed" | "pending") => {
                Err(format!("whose order is {}", o.status))
            }
            Some(o) if o.lines.get(index) != Some(&payload) => Err(format!(
                "whose order stores {:?} for it",
                o.lines.get(index)
            )),
            Some(_) => Ok(()),
            None if undecided_submission(facts, order) => Ok(()),
            None => Err("whose order is not stored and was answered".to_owned()),
        };
        if let Err(why) = owner {
            found.push(format!(
                "{id} ({} x{}) held at the end, {why}",
                r.sku, r.quantity
            ));
        }
    }
    found.sort();
    found
}

fn undecided_submission(facts: &Facts, order: &str) -> bool {
    facts
        .submissions(order)
        .iter()
        .any(|op| op.outcome == Outcome::Unknown)
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::super::{check, Op};
    use serde_json::json;

    fn order_op(id: &str, status: Option<i64>) -> Op {
        op(
            "order",
            json!({"order_id": id, "lines": [{"sku": "a", "quantity": 1}]}),
            status,
        )
    }

    #[test]
    fn fires_for_a_hold_whose_order_failed_or_is_gone() {
        // Stored failed, the client never had an answer (no history rule applies).
        let (mut history, mut dump) = clean();
        add_hold(&mut dump, "order:o1:0", 1, 1300, None);
        dump.orders
            .insert("o1".into(), order("failed", &[("a", 1)]));
        history.push(order_op("o1", None));
        fires(
            &check(&history, &dump),
            "orphan-held-line",
            &["order-atomicity"],
        );
        // A line id in the reserved namespace of an order that was never submitted.
        let (history, mut dump) = clean();
        add_hold(&mut dump, "order:o2:0", 1, 1300, None);
        only(&check(&history, &dump), "orphan-held-line");
        // Stored pending, but with another payload for the line.
        let (mut history, mut dump) = clean();
        add_hold(&mut dump, "o3:0", 2, 1300, None);
        dump.orders
            .insert("o3".into(), order("pending", &[("a", 1)]));
        history.push(order_op("o3", Some(503)));
        only(&check(&history, &dump), "orphan-held-line");
    }

    #[test]
    fn holds_an_order_can_still_own_pass() {
        // Pending (answered 503), and not stored at all after an unanswered submission.
        let (mut history, mut dump) = clean();
        add_hold(&mut dump, "o1:0", 1, 1300, None);
        dump.orders
            .insert("o1".into(), order("pending", &[("a", 1)]));
        history.push(order_op("o1", Some(503)));
        add_hold(&mut dump, "order:o2:0", 1, 1400, None);
        history.push(order_op("o2", None));
        passes(&history, &dump);
        // A single reservation under an order line's id (a collision) is not an order's hold.
        let (mut history, mut dump) = clean();
        add_hold(&mut dump, "o4:0", 3, 1300, None);
        history.push(reserve("o4:0", "a", 3, Some(201)));
        history.push(order_op("o4", Some(422)));
        dump.orders
            .insert("o4".into(), order("refused", &[("a", 1)]));
        passes(&history, &dump);
    }
}
