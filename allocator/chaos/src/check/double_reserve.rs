//! `double-reserve`: a reservation id is reserved at most once (one `reserve` ledger row).

use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "double-reserve",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found: Vec<String> = facts
        .ledger_by_id
        .iter()
        .filter_map(|(id, rows)| {
            let reserves = rows.iter().filter(|r| r.kind == "reserve").count();
            (reserves > 1).then(|| format!("{id}: {reserves} reserve rows"))
        })
        .collect();
    found.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_for_a_second_reserve_row() {
        let (history, mut dump) = clean();
        dump.ledger
            .push(row(6, "a", "reserve", Some("r1"), [0, -3, 3, 0], 2, 1300));
        dump.ledger
            .push(row(7, "a", "release", Some("r1"), [0, 3, -3, 0], 2, 1301));
        let report = check(&history, &dump);
        assert!(report.count("double-reserve") > 0, "{}", report.table());
    }
}
