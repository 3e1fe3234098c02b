//! `negative-row`: every final inventory row is non-negative and balances
//! (`on_hand = available + held + confirmed`).

use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "negative-row",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    facts
        .dump
        .inventory
        .iter()
        .filter(|(_, row)| {
            let [on_hand, available, held, confirmed] = **row;
            row.iter().any(|v| *v < 0) || on_hand != available + held + confirmed
        })
        .map(|(sku, row)| format!("{sku}: {row:?}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_on_a_negative_column() {
        let (history, mut dump) = clean();
        dump.inventory.insert("b".into(), [0, -1, 1, 0]);
        dump.ledger
            .push(row(7, "b", "restock", None, [0, -1, 1, 0], 1, 40));
        let report = check(&history, &dump);
        assert!(report.count("negative-row") > 0, "{}", report.table());
    }
}
