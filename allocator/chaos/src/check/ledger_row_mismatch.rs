//! `ledger-row-mismatch`: each SKU's ledger deltas sum to its final inventory row; no ledger
//! without a row, no non-zero row without ledger. Where the ledger starts later, its archived
//! rows count by their recorded sums.

use super::oversell::{archived, by_sku};
use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "ledger-row-mismatch",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    let by_sku = by_sku(facts);
    for (sku, rows) in &by_sku {
        let (mut s, _) = archived(facts, sku);
        for r in rows {
            for (acc, d) in s.iter_mut().zip(r.d) {
                *acc += d;
            }
        }
        match facts.dump.inventory.get(*sku) {
            Some(row) if *row != s => {
                found.push(format!("{sku}: ledger sums to {s:?}, row is {row:?}"))
            }
            Some(_) => {}
            None => found.push(format!("{sku}: ledger rows but no inventory row")),
        }
    }
    for (sku, row) in &facts.dump.inventory {
        if !by_sku.contains_key(sku.as_str()) && *row != archived(facts, sku).0 {
            found.push(format!("{sku}: row {row:?} without ledger rows"));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_when_the_row_differs_from_its_ledger() {
        let (history, mut dump) = clean();
        dump.inventory.insert("a".into(), [10, 8, 0, 2]);
        only(&check(&history, &dump), "ledger-row-mismatch");
    }
}
