//! The independent checker: reads a recorded history and the final database dump and decides
//! whether the run kept the safety contract.
//!
//! It uses nothing but `std` and `serde_json`, and it re-derives everything from the raw
//! records: the outcome of an operation from its HTTP status (2xx acknowledged, 4xx refused,
//! anything else or no answer unknown), stock levels by replaying the ledger, epochs from the
//! lease history. Each rule is a function over plain data, unit-tested below on small synthetic
//! histories that make it fire.
//!
//! Rules (names as printed in the table):
//!
//! | rule | violation |
//! | --- | --- |
//! | `oversell` | replaying one SKU's ledger in entry order, some prefix has `available < 0`, `held < 0`, `confirmed < 0` or `held + confirmed > on_hand` |
//! | `negative-row` | a final inventory row with a negative column, or `on_hand != available + held + confirmed` |
//! | `ledger-row-mismatch` | a SKU's ledger deltas do not sum to its inventory row (or a row without ledger, or ledger without row) |
//! | `stale-epoch-write` | a ledger row of partition `p` at epoch `e` written (`written_at`) after the acquisition of some epoch `e' > e` of `p`'s lease |
//! | `double-reserve` | a reservation id with more than one `reserve` ledger row |
//! | `acked-hold-missing` | a `201` reserve whose reservation is absent, refused, of another SKU/quantity, or without exactly one `reserve` ledger row |
//! | `lost-ack` | an acknowledged confirm whose reservation is not `confirmed` at the end; an acknowledged release not `released`/`expired`; an acknowledged adjustment not applied |
//! | `refused-but-applied` | a refused reserve whose id holds stock; a refused confirm (no other confirm of it acknowledged or unknown) whose reservation ended `confirmed` |
//! | `reservation-ledger-mismatch` | a reservation whose ledger rows do not match its status (`held` = reserve; `confirmed` = reserve, confirm; …; `rejected` = none), or ledger rows naming an unknown reservation |
//! | `order-atomicity` | a `201` order with a line that was never held; a `409` order with a line still held or confirmed, or whose decrements were not all given back |
//!
//! Why the stale-epoch rule is sound: a fenced batch reads its lease row `FOR KEY SHARE` until
//! it commits, and an acquisition locks the row `FOR UPDATE` before it bumps the epoch, so every
//! write under epoch `e` happens before the acquisition of `e + 1` on the database's clock.
//! `written_at` is `clock_timestamp()` at insert and `acquired_at` is `clock_timestamp()` in the
//! trigger that records the new epoch, both taken by the one database server.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use serde_json::Value;

mod input;

pub use input::{Dump, LedgerRow, Op, Outcome};

/// Every rule, in table order.
pub const RULES: [&str; 10] = [
    "oversell",
    "negative-row",
    "ledger-row-mismatch",
    "stale-epoch-write",
    "double-reserve",
    "acked-hold-missing",
    "lost-ack",
    "refused-but-applied",
    "reservation-ledger-mismatch",
    "order-atomicity",
];

/// How many examples of each violated rule the table shows.
const EXAMPLES: usize = 3;

/// Operation counts of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub attempted: u64,
    pub acknowledged: u64,
    pub refused: u64,
    pub unknown: u64,
}

/// The checker's verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub ops: BTreeMap<String, Counts>,
    /// rule → every violation found (one line each).
    pub violations: BTreeMap<&'static str, Vec<String>>,
}

impl Report {
    fn flag(&mut self, rule: &'static str, what: String) {
        debug_assert!(RULES.contains(&rule), "unknown rule {rule}");
        self.violations.entry(rule).or_default().push(what);
    }

    pub fn count(&self, rule: &str) -> usize {
        self.violations.get(rule).map_or(0, Vec::len)
    }

    pub fn total(&self) -> usize {
        self.violations.values().map(Vec::len).sum()
    }

    /// Violations per rule (every rule listed, zero included), for scripts.
    pub fn to_json(&self) -> Value {
        let mut by_rule = serde_json::Map::new();
        for rule in RULES {
            by_rule.insert(rule.to_owned(), Value::from(self.count(rule)));
        }
        let mut ops = serde_json::Map::new();
        for (kind, c) in &self.ops {
            ops.insert(
                kind.clone(),
                serde_json::json!({
                    "attempted": c.attempted, "acknowledged": c.acknowledged,
                    "refused": c.refused, "unknown": c.unknown,
                }),
            );
        }
        serde_json::json!({ "violations": by_rule, "total_violations": self.total(), "operations": ops })
    }

    /// The operations and violations table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>13} {:>8} {:>8}",
            "operation", "attempted", "acknowledged", "refused", "unknown"
        );
        let mut total = Counts::default();
        for (kind, c) in &self.ops {
            let _ = writeln!(
                out,
                "{:<14} {:>10} {:>13} {:>8} {:>8}",
                kind, c.attempted, c.acknowledged, c.refused, c.unknown
            );
            total.attempted += c.attempted;
            total.acknowledged += c.acknowledged;
            total.refused += c.refused;
            total.unknown += c.unknown;
        }
        let _ = writeln!(
            out,
            "{:<14} {:>10} {:>13} {:>8} {:>8}",
            "total", total.attempted, total.acknowledged, total.refused, total.unknown
        );
        let _ = writeln!(out);
        let _ = writeln!(out, "{:<28} {:>6}  first examples", "rule", "found");
        for rule in RULES {
            let found = self.violations.get(rule).map(Vec::as_slice).unwrap_or(&[]);
            let examples = found
                .iter()
                .take(EXAMPLES)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ");
            let _ = writeln!(out, "{:<28} {:>6}  {}", rule, found.len(), examples);
        }
        out
    }
}

/// Runs every rule.
pub fn check(history: &[Op], dump: &Dump) -> Report {
    let mut report = Report::default();
    for op in history {
        let c = report.ops.entry(op.kind.clone()).or_default();
        c.attempted += 1;
        match op.outcome {
            Outcome::Acknowledged => c.acknowledged += 1,
            Outcome::Refused => c.refused += 1,
            Outcome::Unknown => c.unknown += 1,
        }
    }
    let ledger_by_id = ledger_kinds_by_reservation(dump);
    check_stock(dump, &mut report);
    check_epochs(dump, &mut report);
    check_reservations(dump, &ledger_by_id, &mut report);
    check_acknowledgements(history, dump, &ledger_by_id, &mut report);
    check_orders(history, dump, &ledger_by_id, &mut report);
    report
}

/// reservation id → its ledger kinds in entry order.
fn ledger_kinds_by_reservation(dump: &Dump) -> HashMap<&str, Vec<&str>> {
    let mut rows: Vec<&LedgerRow> = dump
        .ledger
        .iter()
        .filter(|r| r.reservation_id.is_some())
        .collect();
    rows.sort_by_key(|r| r.entry_id);
    let mut out: HashMap<&str, Vec<&str>> = HashMap::new();
    for r in rows {
        out.entry(r.reservation_id.as_deref().unwrap_or_default())
            .or_default()
            .push(r.kind.as_str());
    }
    out
}

/// `oversell`, `negative-row`, `ledger-row-mismatch`.
fn check_stock(dump: &Dump, report: &mut Report) {
    let mut by_sku: BTreeMap<&str, Vec<&LedgerRow>> = BTreeMap::new();
    for r in &dump.ledger {
        by_sku.entry(r.sku.as_str()).or_default().push(r);
    }
    for (sku, rows) in &mut by_sku {
        rows.sort_by_key(|r| r.entry_id);
        // [on_hand, available, held, confirmed] after each prefix of the SKU's ledger.
        let mut s = [0i64; 4];
        let mut flagged = false;
        for r in rows.iter() {
            for (acc, d) in s.iter_mut().zip(r.d) {
                *acc += d;
            }
            let [on_hand, available, held, confirmed] = s;
            if !flagged
                && (available < 0 || held < 0 || confirmed < 0 || held + confirmed > on_hand)
            {
                report.flag(
                    "oversell",
                    format!(
                        "{sku} after entry {}: on_hand {on_hand} available {available} held {held} confirmed {confirmed}",
                        r.entry_id
                    ),
                );
                // One finding per SKU: every later prefix is usually off as well.
                flagged = true;
            }
        }
        match dump.inventory.get(*sku) {
            Some(row) if *row != s => report.flag(
                "ledger-row-mismatch",
                format!("{sku}: ledger sums to {s:?}, row is {row:?}"),
            ),
            Some(_) => {}
            None => report.flag(
                "ledger-row-mismatch",
                format!("{sku}: ledger rows but no inventory row"),
            ),
        }
    }
    for (sku, row) in &dump.inventory {
        let [on_hand, available, held, confirmed] = *row;
        if row.iter().any(|v| *v < 0) || on_hand != available + held + confirmed {
            report.flag("negative-row", format!("{sku}: {row:?}"));
        }
        if !by_sku.contains_key(sku.as_str()) && row.iter().any(|v| *v != 0) {
            report.flag(
                "ledger-row-mismatch",
                format!("{sku}: row {row:?} without ledger rows"),
            );
        }
    }
}

/// `stale-epoch-write`.
fn check_epochs(dump: &Dump, report: &mut Report) {
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
    for r in &dump.ledger {
        let Some(epochs) = later.get(&r.partition) else {
            continue;
        };
        // First recorded epoch above the row's.
        let i = epochs.partition_point(|(e, _)| *e <= r.epoch);
        if let Some((next_epoch, superseded_at)) = epochs.get(i) {
            if r.written_us > *superseded_at {
                report.flag(
                    "stale-epoch-write",
                    format!(
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
                    ),
                );
            }
        }
    }
}

/// `double-reserve`, `reservation-ledger-mismatch`.
fn check_reservations(dump: &Dump, ledger: &HashMap<&str, Vec<&str>>, report: &mut Report) {
    for (id, kinds) in ledger {
        let reserves = kinds.iter().filter(|k| **k == "reserve").count();
        if reserves > 1 {
            report.flag("double-reserve", format!("{id}: {reserves} reserve rows"));
        }
        if !dump.reservations.contains_key(*id) {
            report.flag(
                "reservation-ledger-mismatch",
                format!("{id}: ledger {kinds:?} but no reservation"),
            );
        }
    }
    for (id, (_, _, status)) in &dump.reservations {
        let expected: &[&str] = match status.as_str() {
            "held" => &["reserve"],
            "confirmed" => &["reserve", "confirm"],
            "released" => &["reserve", "release"],
            "expired" => &["reserve", "expire"],
            "rejected" => &[],
            other => {
                report.flag(
                    "reservation-ledger-mismatch",
                    format!("{id}: unknown status {other}"),
                );
                continue;
            }
        };
        let actual = ledger.get(id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
        if actual != expected {
            report.flag(
                "reservation-ledger-mismatch",
                format!("{id}: status {status} but ledger {actual:?}"),
            );
        }
    }
}

fn status_of<'a>(dump: &'a Dump, id: &str) -> Option<&'a str> {
    dump.reservations.get(id).map(|(_, _, s)| s.as_str())
}

/// `acked-hold-missing`, `lost-ack`, `refused-but-applied`.
fn check_acknowledgements(
    history: &[Op],
    dump: &Dump,
    ledger: &HashMap<&str, Vec<&str>>,
    report: &mut Report,
) {
    // Ids with a confirm (or release) that was acknowledged or may have been applied.
    let mut maybe_applied: HashMap<(&str, &str), bool> = HashMap::new();
    for op in history {
        if matches!(op.kind.as_str(), "confirm" | "release") && op.outcome != Outcome::Refused {
            maybe_applied.insert((op.kind.as_str(), op.id("reservation_id")), true);
        }
    }
    for op in history {
        match (op.kind.as_str(), op.outcome) {
            ("reserve", Outcome::Acknowledged) => {
                let id = op.id("reservation_id");
                let reserves = ledger
                    .get(id)
                    .map_or(0, |k| k.iter().filter(|k| **k == "reserve").count());
                match dump.reservations.get(id) {
                    None => report.flag(
                        "acked-hold-missing",
                        format!("{id}: reserve answered {:?}, no reservation", op.status),
                    ),
                    Some((sku, qty, status)) => {
                        if status == "rejected"
                            || Some(sku.as_str()) != op.request["sku"].as_str()
                            || Some(*qty) != op.request["quantity"].as_i64()
                        {
                            report.flag(
                                "acked-hold-missing",
                                format!("{id}: acknowledged, stored as {sku} x{qty} {status}"),
                            );
                        } else if reserves != 1 {
                            report.flag(
                                "acked-hold-missing",
                                format!("{id}: acknowledged, {reserves} reserve ledger rows"),
                            );
                        }
                    }
                }
            }
            ("reserve", Outcome::Refused) => {
                let id = op.id("reservation_id");
                if let Some(status) = status_of(dump, id).filter(|s| *s != "rejected") {
                    report.flag(
                        "refused-but-applied",
                        format!("{id}: reserve refused with {:?}, ended {status}", op.status),
                    );
                }
            }
            ("confirm", Outcome::Acknowledged) => {
                let id = op.id("reservation_id");
                let status = status_of(dump, id);
                if status != Some("confirmed") {
                    report.flag(
                        "lost-ack",
                        format!("{id}: confirm acknowledged, ended {status:?}"),
                    );
                }
            }
            ("release", Outcome::Acknowledged) => {
                let id = op.id("reservation_id");
                let status = status_of(dump, id);
                if !matches!(status, Some("released" | "expired")) {
                    report.flag(
                        "lost-ack",
                        format!("{id}: release acknowledged, ended {status:?}"),
                    );
                }
            }
            ("confirm", Outcome::Refused) => {
                let id = op.id("reservation_id");
                if status_of(dump, id) == Some("confirmed")
                    && !maybe_applied.contains_key(&("confirm", id))
                {
                    report.flag(
                        "refused-but-applied",
                        format!(
                            "{id}: confirm refused with {:?}, ended confirmed",
                            op.status
                        ),
                    );
                }
            }
            ("release", Outcome::Refused) => {
                let id = op.id("reservation_id");
                if status_of(dump, id) == Some("released")
                    && !maybe_applied.contains_key(&("release", id))
                {
                    report.flag(
                        "refused-but-applied",
                        format!("{id}: release refused with {:?}, ended released", op.status),
                    );
                }
            }
            ("adjust", Outcome::Acknowledged) => {
                let id = op.id("adjustment_id");
                let applied = dump
                    .adjustments
                    .get(id)
                    .is_some_and(|(sku, delta, status)| {
                        status == "applied"
                            && Some(sku.as_str()) == op.request["sku"].as_str()
                            && Some(*delta) == op.request["delta"].as_i64()
                    });
                if !applied {
                    report.flag(
                        "lost-ack",
                        format!(
                            "{id}: adjustment acknowledged, stored as {:?}",
                            dump.adjustments.get(id)
                        ),
                    );
                }
            }
            _ => {}
        }
    }
}

/// `order-atomicity`. Line `i` of order `o` is reserved under the id `o:i` (the API's contract).
fn check_orders(
    history: &[Op],
    dump: &Dump,
    ledger: &HashMap<&str, Vec<&str>>,
    report: &mut Report,
) {
    for op in history.iter().filter(|op| op.kind == "order") {
        let order = op.id("order_id");
        let lines = op.request["lines"].as_array().map_or(0, Vec::len);
        for i in 0..lines {
            let id = schema::wire::order_line_id(order, i);
            let status = status_of(dump, &id);
            match (op.status, op.outcome) {
                (_, Outcome::Acknowledged)
                    if !matches!(status, Some("held" | "confirmed" | "released" | "expired")) =>
                {
                    report.flag(
                        "order-atomicity",
                        format!("order {order} placed but line {id} is {status:?}"),
                    );
                }
                (_, Outcome::Acknowledged) => {}
                (Some(409), _) => {
                    let kinds = ledger.get(id.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                    let taken = kinds.iter().filter(|k| **k == "reserve").count();
                    let given_back = kinds
                        .iter()
                        .filter(|k| matches!(**k, "release" | "expire"))
                        .count();
                    if matches!(status, Some("held" | "confirmed")) || taken != given_back {
                        report.flag(
                            "order-atomicity",
                            format!("order {order} failed but line {id} is {status:?}, ledger {kinds:?}"),
                        );
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(kind: &str, request: Value, status: Option<i64>) -> Op {
        Op::from_json(&json!({"kind": kind, "request": request, "status": status})).unwrap()
    }

    fn reserve(id: &str, sku: &str, qty: i64, status: Option<i64>) -> Op {
        op(
            "reserve",
            json!({"reservation_id": id, "sku": sku, "quantity": qty}),
            status,
        )
    }

    fn row(
        entry: i64,
        sku: &str,
        kind: &str,
        id: Option<&str>,
        d: [i64; 4],
        epoch: i64,
        at: i64,
    ) -> LedgerRow {
        LedgerRow {
            entry_id: entry,
            sku: sku.into(),
            partition: 0,
            kind: kind.into(),
            adjustment_id: if id.is_none() {
                Some(format!("adj-{entry}"))
            } else {
                None
            },
            reservation_id: id.map(str::to_owned),
            d,
            epoch,
            written_us: at,
        }
    }

    /// A consistent world: 10 units restocked, r1 held 3 and confirmed, r2 held 2 and released,
    /// r3 refused; partition 0 had epoch 1 from t=0 and epoch 2 from t=1000.
    fn clean() -> (Vec<Op>, Dump) {
        let mut dump = Dump {
            ledger: vec![
                row(1, "a", "restock", None, [10, 10, 0, 0], 1, 10),
                row(2, "a", "reserve", Some("r1"), [0, -3, 3, 0], 1, 20),
                row(3, "a", "confirm", Some("r1"), [0, 0, -3, 3], 1, 30),
                row(4, "a", "reserve", Some("r2"), [0, -2, 2, 0], 2, 1100),
                row(5, "a", "release", Some("r2"), [0, 2, -2, 0], 2, 1200),
            ],
            ..Dump::default()
        };
        dump.inventory.insert("a".into(), [10, 7, 0, 3]);
        dump.reservations
            .insert("r1".into(), ("a".into(), 3, "confirmed".into()));
        dump.reservations
            .insert("r2".into(), ("a".into(), 2, "released".into()));
        dump.reservations
            .insert("r3".into(), ("a".into(), 50, "rejected".into()));
        dump.adjustments
            .insert("adj-1".into(), ("a".into(), 10, "applied".into()));
        dump.lease_history
            .insert(0, vec![(0, 0), (1, 5), (2, 1000)]);
        let history = vec![
            op(
                "adjust",
                json!({"adjustment_id": "adj-1", "sku": "a", "delta": 10}),
                Some(201),
            ),
            reserve("r1", "a", 3, Some(201)),
            op("confirm", json!({"reservation_id": "r1"}), Some(200)),
            reserve("r2", "a", 2, Some(201)),
            op("release", json!({"reservation_id": "r2"}), None),
            reserve("r3", "a", 50, Some(409)),
        ];
        (history, dump)
    }

    fn only(report: &Report, rule: &str) {
        assert!(
            report.count(rule) > 0,
            "{rule} did not fire:\n{}",
            report.table()
        );
        for other in RULES.iter().filter(|r| **r != rule) {
            assert_eq!(
                report.count(other),
                0,
                "{other} fired too:\n{}",
                report.table()
            );
        }
    }

    #[test]
    fn a_consistent_history_passes() {
        let (history, dump) = clean();
        let report = check(&history, &dump);
        assert_eq!(report.total(), 0, "{}", report.table());
        let reserve = report.ops["reserve"];
        assert_eq!(
            (reserve.attempted, reserve.acknowledged, reserve.refused),
            (3, 2, 1)
        );
        assert_eq!(report.ops["release"].unknown, 1);
    }

    #[test]
    fn oversell_fires_on_a_negative_prefix_even_when_the_end_balances() {
        let (history, mut dump) = clean();
        // A reserve of 12 before the restock of 10 is undone later: the end state balances.
        dump.ledger
            .insert(0, row(0, "a", "reserve", Some("x"), [0, -12, 12, 0], 1, 5));
        dump.ledger
            .push(row(6, "a", "release", Some("x"), [0, 12, -12, 0], 1, 40));
        dump.reservations
            .insert("x".into(), ("a".into(), 12, "released".into()));
        only(&check(&history, &dump), "oversell");
    }

    #[test]
    fn negative_row_fires() {
        let (history, mut dump) = clean();
        dump.inventory.insert("b".into(), [0, -1, 1, 0]);
        dump.ledger
            .push(row(7, "b", "restock", None, [0, -1, 1, 0], 1, 40));
        let report = check(&history, &dump);
        assert!(report.count("negative-row") > 0, "{}", report.table());
    }

    #[test]
    fn ledger_row_mismatch_fires() {
        let (history, mut dump) = clean();
        dump.inventory.insert("a".into(), [10, 8, 0, 2]);
        only(&check(&history, &dump), "ledger-row-mismatch");
    }

    #[test]
    fn stale_epoch_write_fires_for_a_write_after_a_later_acquisition() {
        let (history, mut dump) = clean();
        // r1's confirm under epoch 1 lands after epoch 2 was acquired at t=1000.
        dump.ledger[2].written_us = 1500;
        only(&check(&history, &dump), "stale-epoch-write");
        // The same write just before the acquisition is fine.
        dump.ledger[2].written_us = 999;
        assert_eq!(check(&history, &dump).total(), 0);
    }

    #[test]
    fn double_reserve_fires() {
        let (history, mut dump) = clean();
        dump.ledger
            .push(row(6, "a", "reserve", Some("r1"), [0, -3, 3, 0], 2, 1300));
        dump.ledger
            .push(row(7, "a", "release", Some("r1"), [0, 3, -3, 0], 2, 1301));
        let report = check(&history, &dump);
        assert!(report.count("double-reserve") > 0, "{}", report.table());
    }

    #[test]
    fn acked_hold_missing_fires() {
        let (mut history, dump) = clean();
        history.push(reserve("r9", "a", 1, Some(201)));
        only(&check(&history, &dump), "acked-hold-missing");
    }

    #[test]
    fn lost_ack_fires_for_confirm_release_and_adjust() {
        let (mut history, dump) = clean();
        history.push(op("confirm", json!({"reservation_id": "r2"}), Some(200)));
        only(&check(&history, &dump), "lost-ack");

        let (mut history, dump) = clean();
        history.push(op("release", json!({"reservation_id": "r1"}), Some(200)));
        only(&check(&history, &dump), "lost-ack");

        let (mut history, dump) = clean();
        history.push(op(
            "adjust",
            json!({"adjustment_id": "adj-9", "sku": "a", "delta": 4}),
            Some(201),
        ));
        only(&check(&history, &dump), "lost-ack");
    }

    #[test]
    fn refused_but_applied_fires() {
        let (mut history, dump) = clean();
        history.push(reserve("r2", "a", 2, Some(409)));
        only(&check(&history, &dump), "refused-but-applied");

        let (mut history, mut dump) = clean();
        dump.reservations
            .insert("r1".into(), ("a".into(), 3, "confirmed".into()));
        history.retain(|o| o.kind != "confirm");
        history.push(op("confirm", json!({"reservation_id": "r1"}), Some(409)));
        only(&check(&history, &dump), "refused-but-applied");
    }

    #[test]
    fn reservation_ledger_mismatch_fires() {
        let (history, mut dump) = clean();
        // Confirmed without its confirm row: the row sums still match because both change.
        dump.reservations
            .insert("r2".into(), ("a".into(), 2, "confirmed".into()));
        let report = check(&history, &dump);
        assert!(
            report.count("reservation-ledger-mismatch") > 0,
            "{}",
            report.table()
        );
    }

    #[test]
    fn order_atomicity_fires_for_placed_and_failed_orders() {
        let order = |status| {
            op(
                "order",
                json!({"order_id": "o1", "lines": [{"sku": "a", "quantity": 1}, {"sku": "a", "quantity": 1}]}),
                Some(status),
            )
        };
        // Placed, but line 1 was never held.
        let (mut history, mut dump) = clean();
        dump.ledger.push(row(
            6,
            "a",
            "reserve",
            Some("order:o1:0"),
            [0, -1, 1, 0],
            2,
            1300,
        ));
        dump.inventory.insert("a".into(), [10, 6, 1, 3]);
        dump.reservations
            .insert("order:o1:0".into(), ("a".into(), 1, "held".into()));
        history.push(order(201));
        only(&check(&history, &dump), "order-atomicity");
        // Failed, but line 0 is still held.
        history.pop();
        history.push(order(409));
        only(&check(&history, &dump), "order-atomicity");
        // Failed, line 0 held and then released: fine.
        dump.ledger.push(row(
            7,
            "a",
            "release",
            Some("order:o1:0"),
            [0, 1, -1, 0],
            2,
            1301,
        ));
        dump.inventory.insert("a".into(), [10, 7, 0, 3]);
        dump.reservations
            .insert("order:o1:0".into(), ("a".into(), 1, "released".into()));
        assert_eq!(check(&history, &dump).total(), 0);
    }

    #[test]
    fn outcomes_come_from_the_status_alone() {
        assert_eq!(Outcome::of(Some(201)), Outcome::Acknowledged);
        assert_eq!(Outcome::of(Some(409)), Outcome::Refused);
        assert_eq!(Outcome::of(Some(503)), Outcome::Unknown);
        assert_eq!(Outcome::of(None), Outcome::Unknown);
    }
}
