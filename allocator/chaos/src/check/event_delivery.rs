//! `event-delivery`: the run's change-event consumer got every committed ledger row and settled
//! window once, in order.
//!
//! The consumer (the example consumer, `loadtest events`, run through the whole fault schedule)
//! logs every delivery in the order it saw it, duplicates included. Judged here:
//!
//! * per stream, the applied (non-duplicate) positions are exactly `1, 2, 3, …` in log order —
//!   no gap, no position applied twice, nothing out of order;
//! * a duplicate carries the dedupe key of its position (`P:n`, `settlement:n`), so skipping it
//!   by position lost nothing;
//! * every ledger row of the dump at or below its stream's recorded relay progress was applied,
//!   as the event of its kind with its reservation or adjustment id; likewise every settled
//!   window; an applied position beyond the stream's head, read after the consumer stopped
//!   (`events.heads.json`), is an event of nothing (positions after the dump's are not otherwise
//!   judged: their rows were committed after the dump);
//! * the relay was not stuck: no ledger row recorded more than [`RELAY_LAG_ALLOWED_US`] before
//!   the dump lies beyond its stream's recorded progress.
//!
//! Rows of archived ledger partitions are not in the dump; their positions are still covered by
//! the contiguity of what the consumer applied.

use std::collections::BTreeMap;

use super::input::Delivery;
use super::{Facts, Rule};

pub(super) const RULE: Rule = Rule {
    name: "event-delivery",
    run,
};

/// How long after its commit a ledger row may still be unpublished at the dump: the harness
/// waits for the relay to catch up first, so only the last moments' expiries may lag.
pub const RELAY_LAG_ALLOWED_US: i64 = 30_000_000;

/// The event type of a ledger row's kind, as the event contract names it.
fn event_type(kind: &str) -> &str {
    match kind {
        "reserve" => "reservation.held",
        "confirm" => "reservation.confirmed",
        "release" => "reservation.released",
        "expire" => "reservation.expired",
        "restock" | "shrink" => "inventory.adjusted",
        other => other,
    }
}

/// The dedupe key of `position` in `stream`.
fn key_of(stream: &str, position: i64) -> String {
    match stream.strip_prefix("partition/") {
        Some(p) => format!("{p}:{position}"),
        None => format!("{stream}:{position}"),
    }
}

/// What the dump says should be at one position: (event type, id), and the row's record time.
type Expected<'a> = (&'a str, Option<&'a str>, Option<i64>);

fn run(facts: &Facts) -> Vec<String> {
    let Some(deliveries) = &facts.dump.deliveries else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut applied: BTreeMap<&str, BTreeMap<i64, &Delivery>> = BTreeMap::new();
    for d in deliveries {
        if d.duplicate {
            if d.key != key_of(&d.stream, d.position) {
                found.push(format!(
                    "{} {}: a duplicate with key {}",
                    d.stream, d.position, d.key
                ));
            }
            continue;
        }
        let seq = applied.entry(&d.stream).or_default();
        let next = seq.keys().next_back().map_or(1, |last| last + 1);
        if d.position != next {
            found.push(format!(
                "{}: applied position {} where {next} was next",
                d.stream, d.position
            ));
        }
        seq.insert(d.position, d);
    }

    let mut expected: BTreeMap<String, BTreeMap<i64, Expected>> = BTreeMap::new();
    for row in &facts.dump.ledger {
        if let Some(position) = row.position {
            let id = row
                .reservation_id
                .as_deref()
                .or(row.adjustment_id.as_deref());
            expected
                .entry(format!("partition/{}", row.partition))
                .or_default()
                .insert(position, (event_type(&row.kind), id, Some(row.recorded_us)));
        }
    }
    for run in &facts.dump.runs {
        if let Some(position) = run.position {
            expected
                .entry(run.stream.clone())
                .or_default()
                .insert(position, ("settlement.window_settled", None, None));
        }
    }
    let empty = BTreeMap::new();
    for (stream, rows) in &expected {
        let got = applied.get(stream.as_str()).unwrap_or(&empty);
        let progress = facts.dump.relay_progress.get(stream).copied().unwrap_or(0);
        for (position, (kind, id, recorded_us)) in rows {
            match got.get(position) {
                Some(d) if d.event_type != *kind || d.id.as_deref() != *id => found.push(format!(
                    "{stream} {position}: delivered as {} {:?}, the ledger has {kind} {id:?}",
                    d.event_type, d.id
                )),
                Some(_) => {}
                None if *position <= progress => found.push(format!(
                    "{stream} {position}: published (progress {progress}) but never delivered"
                )),
                None => {
                    let stuck = recorded_us
                        .zip(facts.dump.dumped_us)
                        .filter(|(at, dumped)| dumped - at > RELAY_LAG_ALLOWED_US);
                    if let Some((at, dumped)) = stuck {
                        found.push(format!(
                            "{stream} {position}: not published {} s after its commit",
                            (dumped - at) / 1_000_000
                        ));
                    }
                }
            }
        }
    }
    // Rows committed after the dump (expiries, settled windows) are not in it, but they are in
    // the heads read once the consumer had stopped: nothing may have been delivered beyond those.
    if let Some(heads) = &facts.dump.final_heads {
        for (stream, got) in &applied {
            let head = heads.get(*stream).copied().unwrap_or(0);
            if let Some((beyond, _)) = got.range(head + 1..).next() {
                found.push(format!(
                    "{stream} {beyond}: delivered, but the database's stream ends at {head}"
                ));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::super::testdata::*;
    use super::super::{check, Delivery, Dump};

    fn delivery(stream: &str, position: i64, kind: &str, id: Option<&str>, dup: bool) -> Delivery {
        Delivery {
            stream: stream.into(),
            position,
            key: super::key_of(stream, position),
            event_type: kind.into(),
            id: id.map(str::to_owned),
            duplicate: dup,
        }
    }

    /// The clean world with positions 1..5 in partition 0, all published, and a consumer that
    /// got each once (and the restock twice, as after a Redis restart) plus the settled window.
    fn delivered() -> (Vec<super::super::Op>, Dump) {
        let (history, mut dump) = clean();
        let mut log = Vec::new();
        for (i, row) in dump.ledger.iter_mut().enumerate() {
            let position = i as i64 + 1;
            row.position = Some(position);
            let id = row.reservation_id.clone().or(row.adjustment_id.clone());
            log.push(delivery(
                "partition/0",
                position,
                super::event_type(&row.kind),
                id.as_deref(),
                false,
            ));
        }
        log.insert(1, log[0].clone());
        log[1].duplicate = true;
        log.push(delivery(
            "settlement",
            1,
            "settlement.window_settled",
            None,
            false,
        ));
        dump.relay_progress.insert("partition/0".into(), 5);
        dump.relay_progress.insert("settlement".into(), 1);
        dump.dumped_us = Some(2000);
        dump.deliveries = Some(log);
        dump.final_heads = Some(
            [("partition/0".to_owned(), 6), ("settlement".to_owned(), 1)]
                .into_iter()
                .collect(),
        );
        (history, dump)
    }

    #[test]
    fn a_complete_delivery_passes() {
        let (history, dump) = delivered();
        assert_eq!(check(&history, &dump).total(), 0);
    }

    #[test]
    fn fires_for_a_gap_a_double_apply_and_a_published_entry_never_delivered() {
        let (history, mut dump) = delivered();
        dump.deliveries.as_mut().unwrap().remove(3); // position 3 (after the duplicate)
        only(&check(&history, &dump), "event-delivery");

        let (history, mut dump) = delivered();
        let log = dump.deliveries.as_mut().unwrap();
        let again = log[4].clone();
        log.push(again);
        only(&check(&history, &dump), "event-delivery");

        let (history, mut dump) = delivered();
        dump.deliveries.as_mut().unwrap().retain(|d| d.position < 5);
        let report = check(&history, &dump);
        only(&report, "event-delivery");
        assert!(
            report.violations["event-delivery"][0].contains("never delivered"),
            "{}",
            report.table()
        );
    }

    #[test]
    fn fires_for_another_event_at_a_position_or_a_duplicate_with_another_key() {
        let (history, mut dump) = delivered();
        dump.deliveries.as_mut().unwrap()[2].id = Some("r9".into());
        only(&check(&history, &dump), "event-delivery");

        let (history, mut dump) = delivered();
        dump.deliveries.as_mut().unwrap()[1].key = "0:4".into();
        only(&check(&history, &dump), "event-delivery");
    }

    #[test]
    fn fires_for_an_event_beyond_the_database_and_for_a_stuck_relay() {
        // Position 6 was committed after the dump (the head read later says so); 7 never was.
        let (history, mut dump) = delivered();
        let log = dump.deliveries.as_mut().unwrap();
        log.push(delivery(
            "partition/0",
            6,
            "reservation.expired",
            Some("r7"),
            false,
        ));
        assert_eq!(check(&history, &dump).total(), 0);
        let log = dump.deliveries.as_mut().unwrap();
        log.push(delivery(
            "partition/0",
            7,
            "reservation.held",
            Some("r8"),
            false,
        ));
        only(&check(&history, &dump), "event-delivery");

        // Not yet published at the dump: fine shortly after the commit, not 30 s later.
        let (history, mut dump) = delivered();
        dump.deliveries.as_mut().unwrap().retain(|d| d.position < 5);
        dump.relay_progress.insert("partition/0".into(), 4);
        assert_eq!(check(&history, &dump).total(), 0);
        dump.dumped_us = Some(1200 + super::RELAY_LAG_ALLOWED_US + 1);
        only(&check(&history, &dump), "event-delivery");
    }

    #[test]
    fn without_a_consumer_nothing_is_judged() {
        let (history, mut dump) = delivered();
        dump.deliveries = None;
        dump.relay_progress.clear();
        assert_eq!(check(&history, &dump).total(), 0);
    }
}
