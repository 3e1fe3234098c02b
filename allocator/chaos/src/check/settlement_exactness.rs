//! `settlement-exactness`: every confirmation is settled exactly once, and a settled window's
//! totals are the ledger's.
//!
//! The settled range runs from the first settled window's start to the last one's end. Every
//! `confirm` ledger row stamped (`recorded_at`, what the job cuts windows by) inside that range
//! lies in exactly one settled window — none is a gap, two an overlap. For each settled window,
//! its `settlements` rows equal, SKU by SKU, the count and quantity of the ledger's confirmations
//! in `[start, end)` — a confirmation that committed into a window after it was settled (a
//! window closed too early) makes them differ — and the run's own totals equal its rows.
//! Windows still `running` are not judged.

use std::collections::BTreeMap;

use super::{Dump, Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "settlement-exactness",
    run,
};

fn run(facts: &Facts) -> Vec<String> {
    if facts.dump.shard_settlement.is_empty() {
        return judge(facts.dump);
    }
    // Over several shards every shard settles its own windows from its own ledger.
    let mut found = Vec::new();
    for (shard, dump) in &facts.dump.shard_settlement {
        found.extend(
            judge(dump)
                .into_iter()
                .map(|v| format!("shard {shard}: {v}")),
        );
    }
    found
}

/// The rule over one database's windows and ledger.
fn judge(dump: &Dump) -> Vec<String> {
    let mut settled: Vec<_> = dump.runs.iter().filter(|r| r.status == "settled").collect();
    settled.sort_by_key(|r| r.start_us);
    let mut found = Vec::new();
    let (Some(first), Some(last_end)) = (settled.first(), settled.iter().map(|r| r.end_us).max())
    else {
        for s in &dump.settlements {
            found.push(format!(
                "settlement rows of window {} without a settled run",
                s.start_us
            ));
        }
        return found;
    };
    let confirms: Vec<_> = dump.ledger.iter().filter(|r| r.kind == "confirm").collect();
    // Where the ledger starts later, a window that began before its start also summed
    // archived confirmations: its totals cannot be recomputed here.
    let from_us = dump.archived.as_ref().map_or(i64::MIN, |a| a.before_us);
    for c in &confirms {
        if c.recorded_us < first.start_us || c.recorded_us >= last_end {
            if c.recorded_us < first.start_us {
                found.push(format!(
                    "confirmation entry {} at {} us precedes the first settled window",
                    c.entry_id, c.recorded_us
                ));
            }
            continue;
        }
        let windows = settled
            .iter()
            .filter(|w| w.start_us <= c.recorded_us && c.recorded_us < w.end_us)
            .count();
        if windows != 1 {
            found.push(format!(
                "confirmation entry {} ({} {}) at {} us is in {windows} settled windows",
                c.entry_id,
                c.sku,
                c.reservation_id.as_deref().unwrap_or("-"),
                c.recorded_us
            ));
        }
    }
    // (window start, sku) → (confirmations, quantity), from the ledger and from the job.
    let mut ledger: BTreeMap<(i64, &str), (i64, i64)> = BTreeMap::new();
    for w in &settled {
        for c in confirms
            .iter()
            .filter(|c| w.start_us <= c.recorded_us && c.recorded_us < w.end_us)
        {
            let e = ledger.entry((w.start_us, c.sku.as_str())).or_default();
            e.0 += 1;
            e.1 += c.d[3];
        }
    }
    let mut rows: BTreeMap<(i64, &str), (i64, i64)> = BTreeMap::new();
    let mut per_run: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for s in &dump.settlements {
        if !settled.iter().any(|w| w.start_us == s.start_us) {
            found.push(format!(
                "settlement rows of window {} without a settled run",
                s.start_us
            ));
        }
        rows.insert((s.start_us, s.sku.as_str()), (s.reservations, s.quantity));
        let t = per_run.entry(s.start_us).or_default();
        t.0 += s.reservations;
        t.1 += s.quantity;
    }
    for key in ledger
        .keys()
        .chain(rows.keys())
        .collect::<std::collections::BTreeSet<_>>()
    {
        let (from_ledger, from_job) = (ledger.get(key), rows.get(key));
        if from_ledger != from_job
            && key.0 >= from_us
            && settled.iter().any(|w| w.start_us == key.0)
        {
            found.push(format!(
                "window {} sku {}: ledger has {from_ledger:?} (confirmations, quantity), settled {from_job:?}",
                key.0, key.1
            ));
        }
    }
    for w in &settled {
        let rows = per_run.get(&w.start_us).copied().unwrap_or_default();
        if (w.reservations, w.quantity) != (Some(rows.0), Some(rows.1)) {
            found.push(format!(
                "window {}: run totals {:?}/{:?}, its rows sum to {}/{}",
                w.start_us, w.reservations, w.quantity, rows.0, rows.1
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::super::{check, Run};

    fn settled(start_us: i64, end_us: i64, reservations: i64, quantity: i64) -> Run {
        Run {
            start_us,
            end_us,
            status: "settled".into(),
            reservations: Some(reservations),
            quantity: Some(quantity),
            position: None,
            stream: "settlement".into(),
        }
    }

    #[test]
    fn fires_for_a_confirmation_in_no_window_or_in_two() {
        // A gap: the settled windows skip [100, 200), where a confirmation lies.
        let (history, mut dump) = clean();
        add_hold(&mut dump, "r5", 1, 120, None);
        confirm(&mut dump, "r5", 150);
        dump.runs = vec![settled(0, 100, 1, 3), settled(200, 300, 0, 0)];
        only(&check(&history, &dump), "settlement-exactness");
        // An overlap: [0, 100) and [50, 150) both settled; r1's confirmation (t=30) is in one,
        // r5's (t=60) in both.
        let (history, mut dump) = clean();
        add_hold(&mut dump, "r5", 1, 55, None);
        confirm(&mut dump, "r5", 60);
        dump.runs = vec![settled(0, 100, 2, 4), settled(50, 150, 1, 1)];
        dump.settlements[0].quantity = 4;
        dump.settlements[0].reservations = 2;
        dump.settlements.push(super::super::Settled {
            start_us: 50,
            sku: "a".into(),
            quantity: 1,
            reservations: 1,
        });
        only(&check(&history, &dump), "settlement-exactness");
    }

    #[test]
    fn fires_when_a_window_misses_a_confirmation_committed_after_it_was_settled() {
        // r5 was confirmed at t=90 but the window [0, 100) only counted r1.
        let (history, mut dump) = clean();
        add_hold(&mut dump, "r5", 1, 80, None);
        confirm(&mut dump, "r5", 90);
        only(&check(&history, &dump), "settlement-exactness");
    }

    #[test]
    fn fires_when_a_runs_totals_differ_from_its_rows() {
        let (history, mut dump) = clean();
        dump.runs[0].quantity = Some(4);
        only(&check(&history, &dump), "settlement-exactness");
    }

    #[test]
    fn confirmations_after_the_last_settled_window_are_not_judged() {
        let (history, mut dump) = clean();
        add_hold(&mut dump, "r5", 1, 120, None);
        confirm(&mut dump, "r5", 150);
        passes(&history, &dump);
    }
}
