//! `stale-epoch-write`: no ledger row of partition `p` at epoch `e` was written after some epoch
//! `e' > e` of `p`'s lease was acquired.
//!
//! Why it is sound: a fenced batch reads its lease row `FOR KEY SHARE` until it commits, and an
//! acquisition locks the row `FOR UPDATE` before it bumps the epoch, so every write under epoch
//! `e` happens before the acquisition of `e + 1` on the database's clock. `written_at` is
//! `clock_timestamp()` at insert and `acquired_at` is `clock_timestamp()` in the trigger that
//! records the new epoch, both taken by the one database server.
//!
//! Rows below the history horizon (migration V6) are left out: they were written before the
//! lease history existed, so their `written_at` is the migration's moment and the epochs that
//! superseded them may be missing. Rows from the horizon on are judged against the first
//! *recorded* epoch above theirs, which began no earlier than any unrecorded epoch between.

use std::collections::HashMap;

use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "stale-epoch-write",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    let dump = facts.dump;
    // partition → epochs ascending with the earliest acquisition of any epoch at or above each.
    let mut later: HashMap<i64, Vec<(i64, i64)>> = HashMap::new();
    for (p, history) in &dump.lease_history {
        let mut h = history.clone();
        h.sort();
        let mut min_from_here = i64::MAX;
        let mut suffix = vec![(0, 0); h.len()];
        for (i, (epoch, acquired)) in h.iter().enumerate().rev() {
            min_from_here = min_from_here.min(*acquired);
            suffix[i] = (*epoch, min_from_here);
        }
        later.insert(*p, suffix);
    }
    let horizon = dump.history_from_entry.unwrap_or(i64::MIN);
    let mut found = Vec::new();
    let rows = dump.ledger.iter().filter(|r| r.entry_id >= horizon);
    for r in rows.chain(&dump.foreign_ledger) {
        let Some(epochs) = later.get(&r.partition) else {
            continue;
        };
        // First recorded epoch above the row's.
        let i = epochs.partition_point(|(e, _)| *e <= r.epoch);
        if let Some((next_epoch, superseded_at)) = epochs.get(i) {
            if r.written_us > *superseded_at {
                found.push(format!(
                    "entry {} ({} {} {}) partition {} epoch {} written {} us after epoch {} began",
                    r.entry_id,
                    r.kind,
                    r.sku,
                    r.reservation_id
                        .as_deref()
                        .or(r.adjustment_id.as_deref())
                        .unwrap_or("-"),
                    r.partition,
                    r.epoch,
                    r.written_us - superseded_at,
                    next_epoch
                ));
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
    fn fires_for_a_write_after_a_later_acquisition() {
        let (history, mut dump) = clean();
        // r1's confirm under epoch 1 lands after epoch 2 was acquired at t=1000.
        dump.ledger[2].written_us = 1500;
        only(&check(&history, &dump), "stale-epoch-write");
        // The same write just before the acquisition is fine.
        dump.ledger[2].written_us = 999;
        passes(&history, &dump);
    }

    #[test]
    fn rows_before_the_history_horizon_are_left_out_and_later_ones_are_not() {
        // A database migrated with data: the old rows were stamped at the migration (t=5000),
        // after epoch 2 began (t=1000); only epoch 2 and later were recorded.
        let (history, mut dump) = clean();
        for r in &mut dump.ledger {
            r.written_us = 5000;
        }
        dump.lease_history.insert(0, vec![(2, 1000), (3, 6000)]);
        only(&check(&history, &dump), "stale-epoch-write");
        dump.history_from_entry = Some(6);
        passes(&history, &dump);
        // From the horizon on the rule holds: an epoch-1 row written after epoch 3 began.
        dump.ledger
            .push(row(6, "a", "restock", None, [1, 1, 0, 0], 1, 7000));
        dump.inventory.insert("a".into(), [11, 8, 0, 3]);
        dump.adjustments
            .insert("adj-6".into(), ("a".into(), 1, "applied".into()));
        only(&check(&history, &dump), "stale-epoch-write");
    }
}
