//! `acked-hold-missing`: a `201` reserve left its reservation behind, as asked (same SKU and
//! quantity, not refused), with exactly one `reserve` ledger row — unless the retention job
//! removed it past the idempotency horizon, which its ledger rows must show (see [`Facts`]).

use super::{Facts, Outcome, Rule};

pub(super) const RULE: Rule = Rule {
    name: "acked-hold-missing",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    for op in facts.history {
        if (op.kind.as_str(), op.outcome) != ("reserve", Outcome::Acknowledged) {
            continue;
        }
        let id = op.id("reservation_id");
        // All of its rows archived: its reserve is among them.
        let reserves = facts
            .kinds_from_reserve(id)
            .map_or(1, |kinds| kinds.iter().filter(|k| **k == "reserve").count());
        match facts.dump.reservations.get(id) {
            None if facts.removed_past_horizon(id, facts.first_sent_us(id)) => {}
            None => found.push(format!(
                "{id}: reserve answered {:?}, no reservation",
                op.status
            )),
            Some(r)
                if r.status == "rejected"
                    || Some(r.sku.as_str()) != op.request["sku"].as_str()
                    || Some(r.quantity) != op.request["quantity"].as_i64() =>
            {
                found.push(format!(
                    "{id}: acknowledged, stored as {} x{} {}",
                    r.sku, r.quantity, r.status
                ))
            }
            Some(_) if reserves != 1 => found.push(format!(
                "{id}: acknowledged, {reserves} reserve ledger rows"
            )),
            Some(_) => {}
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_for_an_acknowledged_hold_that_is_not_there() {
        let (mut history, dump) = clean();
        history.push(reserve("r9", "a", 1, Some(201)));
        only(&check(&history, &dump), "acked-hold-missing");
    }
}
