//! `stream-position-forked`: every position of a partition's event stream names one ledger row
//! (I14). A move copies a partition's rows to its target under the same positions, so the
//! source's stale copy and the holder's rows agree wherever both hold a position; two different
//! rows at one position mean two shards wrote the partition's stream — a second owner (say,
//! allocators campaigning for a lease row an interrupted move left on its target) numbering its
//! own rows into positions the real owner also used.

use std::collections::BTreeMap;

use super::input::LedgerRow;
use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "stream-position-forked",
    run,
};

/// What makes two copies of a row the same row (entry ids are per shard).
type Identity<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    [i64; 4],
    i64,
    i64,
);

fn identity(r: &LedgerRow) -> Identity<'_> {
    (
        r.sku.as_str(),
        r.kind.as_str(),
        r.reservation_id.as_deref(),
        r.adjustment_id.as_deref(),
        r.d,
        r.epoch,
        r.recorded_us,
    )
}

fn run(facts: &Facts) -> Vec<String> {
    let dump = facts.dump;
    let mut at: BTreeMap<(i64, i64), Vec<&LedgerRow>> = BTreeMap::new();
    for r in dump.ledger.iter().chain(&dump.foreign_ledger) {
        if let Some(position) = r.position {
            at.entry((r.partition, position)).or_default().push(r);
        }
    }
    at.iter()
        .filter_map(|((partition, position), rows)| {
            let first = identity(rows[0]);
            let other = rows.iter().find(|r| identity(r) != first)?;
            Some(format!(
                "partition {partition} position {position}: {} {} at epoch {} and {} {} at \
                 epoch {}",
                rows[0].kind,
                rows[0]
                    .reservation_id
                    .as_deref()
                    .or(rows[0].adjustment_id.as_deref())
                    .unwrap_or("-"),
                rows[0].epoch,
                other.kind,
                other
                    .reservation_id
                    .as_deref()
                    .or(other.adjustment_id.as_deref())
                    .unwrap_or("-"),
                other.epoch
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::check;
    use super::super::testdata::*;

    #[test]
    fn a_copy_of_the_same_rows_passes() {
        let (history, mut dump) = clean();
        for (i, r) in dump.ledger.iter_mut().enumerate() {
            r.position = Some(i as i64 + 1);
        }
        dump.foreign_ledger = dump.ledger[..3].to_vec();
        for r in &mut dump.foreign_ledger {
            r.entry_id += 100;
        }
        let report = check(&history, &dump);
        assert_eq!(
            report.count("stream-position-forked"),
            0,
            "{}",
            report.table()
        );
    }

    #[test]
    fn fires_for_another_row_at_a_position_on_another_shard() {
        let (history, mut dump) = clean();
        for (i, r) in dump.ledger.iter_mut().enumerate() {
            r.position = Some(i as i64 + 1);
        }
        // A stale copy's owner swept an expiry into position 4, which the holder used for r2.
        let mut swept = row(104, "a", "expire", Some("r1"), [0, 3, -3, 0], 2, 1150);
        swept.position = Some(4);
        dump.foreign_ledger.push(swept);
        let report = check(&history, &dump);
        assert_eq!(
            report.count("stream-position-forked"),
            1,
            "{}",
            report.table()
        );
    }
}
