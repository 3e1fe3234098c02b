//! `refused-but-applied`: what was refused did not happen. A refused reserve holds no stock
//! under its id; a refused confirm (release) did not confirm (release) the reservation, unless
//! another confirm (release) of the same id was acknowledged or may have been applied.
//!
//! A `429` counts as refused like any `4xx`: a rate-limited request must not have been applied.

use std::collections::HashSet;

use super::facts::ARCHIVED;
use super::{Facts, Outcome, Rule};

pub(super) const RULE: Rule = Rule {
    name: "refused-but-applied",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    // (kind, id) of confirms and releases that were acknowledged or may have been applied.
    let maybe_applied: HashSet<(&str, &str)> = facts
        .history
        .iter()
        .filter(|op| matches!(op.kind.as_str(), "confirm" | "release"))
        .filter(|op| op.outcome != Outcome::Refused)
        .map(|op| (op.kind.as_str(), op.id("reservation_id")))
        .collect();
    let mut found = Vec::new();
    for op in facts
        .history
        .iter()
        .filter(|op| op.outcome == Outcome::Refused)
    {
        let id = op.id("reservation_id");
        let status = facts.final_status(id);
        let applied = match op.kind.as_str() {
            "reserve" => {
                status.is_some_and(|s| s != "rejected" && s != ARCHIVED) && !collided(facts, op, id)
            }
            "confirm" => status == Some("confirmed") && !maybe_applied.contains(&("confirm", id)),
            "release" => status == Some("released") && !maybe_applied.contains(&("release", id)),
            _ => false,
        };
        if applied {
            found.push(format!(
                "{id}: {} refused with {:?}, ended {status:?}",
                op.kind, op.status
            ));
        }
    }
    found
}

/// A refused reserve whose id is stored with another payload was refused *because* the id was
/// taken (an idempotency mismatch): the stored reservation is someone else's. A reservation
/// removed past the horizon is told by its reserve row; with that archived too, whose it was
/// cannot be told, and it is not counted against the refusal.
fn collided(facts: &Facts, op: &super::Op, id: &str) -> bool {
    let stored = match facts.dump.reservations.get(id) {
        Some(r) => Some((r.sku.as_str(), r.quantity)),
        None => match facts.ledger_by_id.get(id) {
            Some(rows) => rows
                .iter()
                .find(|r| r.kind == "reserve")
                .map(|r| (r.sku.as_str(), r.d[2])),
            None => return false,
        },
    };
    stored.is_none_or(|(sku, quantity)| {
        Some(sku) != op.request["sku"].as_str() || Some(quantity) != op.request["quantity"].as_i64()
    })
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;
    use serde_json::json;

    #[test]
    fn fires_for_a_refused_reserve_and_a_refused_confirm_that_took_effect() {
        let (mut history, dump) = clean();
        history.push(reserve("r2", "a", 2, Some(409)));
        only(&check(&history, &dump), "refused-but-applied");

        let (mut history, dump) = clean();
        history.retain(|o| o.kind != "confirm");
        history.push(op("confirm", json!({"reservation_id": "r1"}), Some(409)));
        only(&check(&history, &dump), "refused-but-applied");
    }

    #[test]
    fn a_rate_limited_reserve_that_was_applied_fires() {
        let (mut history, dump) = clean();
        history.push(reserve("r2", "a", 2, Some(429)));
        only(&check(&history, &dump), "refused-but-applied");
    }

    #[test]
    fn a_reserve_refused_because_its_id_was_taken_is_not_flagged() {
        let (mut history, dump) = clean();
        // r1 holds 3 units; a reserve of 1 under the same id is refused with 422.
        history.push(reserve("r1", "a", 1, Some(422)));
        passes(&history, &dump);
    }
}
