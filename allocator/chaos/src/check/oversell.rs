//! `oversell`: replaying one SKU's ledger in entry order, no prefix may go below zero or hold or
//! confirm more than is on hand. The end state can balance while a prefix did not (a hold taken
//! before the stock existed and given back later), so every prefix is checked.

use std::collections::BTreeMap;

use super::{Facts, LedgerRow, Rule};

pub(super) const RULE: Rule = Rule {
    name: "oversell",
    run,
};

/// Every SKU's ledger rows in entry order.
pub(super) fn by_sku<'a>(facts: &Facts<'a>) -> BTreeMap<&'a str, Vec<&'a LedgerRow>> {
    let mut by_sku: BTreeMap<&str, Vec<&LedgerRow>> = BTreeMap::new();
    for r in &facts.dump.ledger {
        by_sku.entry(r.sku.as_str()).or_default().push(r);
    }
    for rows in by_sku.values_mut() {
        rows.sort_by_key(|r| r.entry_id);
    }
    by_sku
}

/// The sums of `sku`'s archived rows (zero when the ledger is whole), and the highest archived
/// entry id.
pub(super) fn archived(facts: &Facts, sku: &str) -> ([i64; 4], i64) {
    facts.dump.archived.as_ref().map_or(([0; 4], 0), |a| {
        (
            a.totals.get(sku).copied().unwrap_or_default(),
            a.last_entry_by_sku
                .get(sku)
                .copied()
                .unwrap_or(a.last_entry_id),
        )
    })
}

fn run(facts: &Facts) -> Vec<String> {
    let mut found = Vec::new();
    for (sku, rows) in by_sku(facts) {
        // [on_hand, available, held, confirmed] after each prefix of the SKU's ledger; where the
        // ledger starts later, from the archived rows' sums. A row in the dump with an entry id
        // below an archived one was inserted before it (its transaction began before the
        // archived range ended): the prefixes are judged once all of those are in.
        let (mut s, last_archived) = archived(facts, sku);
        for r in rows {
            for (acc, d) in s.iter_mut().zip(r.d) {
                *acc += d;
            }
            if r.entry_id < last_archived {
                continue;
            }
            let [on_hand, available, held, confirmed] = s;
            if available < 0 || held < 0 || confirmed < 0 || held + confirmed > on_hand {
                found.push(format!(
                    "{sku} after entry {}: on_hand {on_hand} available {available} held {held} confirmed {confirmed}",
                    r.entry_id
                ));
                // One finding per SKU: every later prefix is usually off as well.
                break;
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn fires_on_a_negative_prefix_even_when_the_end_balances() {
        let (history, mut dump) = clean();
        // A reserve of 12 before the restock of 10 is undone later: the end state balances.
        dump.ledger
            .insert(0, row(0, "a", "reserve", Some("x"), [0, -12, 12, 0], 1, 5));
        dump.ledger
            .push(row(6, "a", "release", Some("x"), [0, 12, -12, 0], 1, 40));
        dump.reservations
            .insert("x".into(), reservation("a", 12, "released"));
        only(&check(&history, &dump), "oversell");
    }
}
