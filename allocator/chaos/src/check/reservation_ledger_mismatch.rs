//! `reservation-ledger-mismatch`: a reservation's ledger rows are exactly those its status
//! implies (`held` = reserve; `confirmed` = reserve, confirm; `released` = reserve, release;
//! `expired` = reserve, expire; `rejected` = none), and no ledger row names an unknown
//! reservation, except one the retention job removed past the horizon (see [`Facts`]); where
//! the ledger starts later, a reservation's reserve may be among the archived rows.

use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "reservation-ledger-mismatch",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    for id in facts.ledger_by_id.keys() {
        if !facts.dump.reservations.contains_key(*id) && !facts.removed_past_horizon(id, None) {
            found.push(format!(
                "{id}: ledger {:?} but no reservation",
                facts.kinds(id)
            ));
        }
    }
    for (id, r) in &facts.dump.reservations {
        let expected: &[&str] = match r.status.as_str() {
            "held" => &["reserve"],
            "confirmed" => &["reserve", "confirm"],
            "released" => &["reserve", "release"],
            "expired" => &["reserve", "expire"],
            "rejected" => &[],
            other => {
                found.push(format!("{id}: unknown status {other}"));
                continue;
            }
        };
        let Some(actual) = facts.kinds_from_reserve(id) else {
            // Every row it had may be archived.
            continue;
        };
        if actual != expected {
            found.push(format!("{id}: status {} but ledger {actual:?}", r.status));
        }
    }
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_for_a_status_its_rows_do_not_show() {
        let (history, mut dump) = clean();
        // Confirmed without its confirm row: the row sums still match because both change.
        dump.reservations
            .insert("r2".into(), reservation("a", 2, "confirmed"));
        let report = check(&history, &dump);
        assert!(
            report.count("reservation-ledger-mismatch") > 0,
            "{}",
            report.table()
        );
    }
}
