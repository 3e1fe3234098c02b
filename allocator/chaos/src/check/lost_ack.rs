//! `lost-ack`: what was acknowledged stayed done. An acknowledged confirm ends `confirmed`, an
//! acknowledged release `released` (or `expired`), an acknowledged adjustment `applied` as
//! asked. A reservation removed past the horizon ends as its last ledger row shows.

use super::facts::ARCHIVED;
use super::{Facts, Outcome, Rule};

pub(super) const RULE: Rule = Rule {
    name: "lost-ack",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    for op in facts
        .history
        .iter()
        .filter(|op| op.outcome == Outcome::Acknowledged)
    {
        match op.kind.as_str() {
            "confirm" => {
                let id = op.id("reservation_id");
                let status = facts.final_status(id);
                if !matches!(status, Some("confirmed" | ARCHIVED)) {
                    found.push(format!("{id}: confirm acknowledged, ended {status:?}"));
                }
            }
            "release" => {
                let id = op.id("reservation_id");
                let status = facts.final_status(id);
                if !matches!(status, Some("released" | "expired" | ARCHIVED)) {
                    found.push(format!("{id}: release acknowledged, ended {status:?}"));
                }
            }
            "adjust" => {
                let id = op.id("adjustment_id");
                let stored = facts.dump.adjustments.get(id);
                let applied = stored.is_some_and(|(sku, delta, status)| {
                    status == "applied"
                        && Some(sku.as_str()) == op.request["sku"].as_str()
                        && Some(*delta) == op.request["delta"].as_i64()
                });
                if !applied {
                    found.push(format!(
                        "{id}: adjustment acknowledged, stored as {stored:?}"
                    ));
                }
            }
            _ => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;
    use serde_json::json;

    #[test]
    fn fires_for_confirm_release_and_adjust() {
        let (mut history, dump) = clean();
        history.push(op("confirm", json!({"reservation_id": "r2"}), Some(200)));
        only(&check(&history, &dump), "lost-ack");

        let (mut history, dump) = clean();
        history.push(op("release", json!({"reservation_id": "r1"}), Some(200)));
        only(&check(&history, &dump), "lost-ack");

        let (mut history, dump) = clean();
        history.push(op(
            "adjust",
            json!({"adjustment_id": "adj-9", "sku": "a", "delta": 4}),
            Some(201),
        ));
        only(&check(&history, &dump), "lost-ack");
    }
}
