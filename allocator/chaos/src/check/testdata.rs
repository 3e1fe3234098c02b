//! Small synthetic histories for the rules' unit tests: a consistent world ([`clean`]) that each
//! test breaks in exactly one way.

use serde_json::{json, Value};

use super::input::{Dump, LedgerRow, Op, Order, Reservation, Run, Settled};
use super::{check, Report, RULES};

pub fn op(kind: &str, request: Value, status: Option<i64>) -> Op {
    Op::from_json(&json!({"kind": kind, "request": request, "status": status})).unwrap()
}

/// `op` with the time its answer arrived (wall-clock ms).
pub fn op_at(kind: &str, request: Value, status: Option<i64>, complete_wall_ms: i64) -> Op {
    Op::from_json(&json!({
        "kind": kind, "request": request, "status": status, "complete_wall_ms": complete_wall_ms,
    }))
    .unwrap()
}

pub fn reserve(id: &str, sku: &str, qty: i64, status: Option<i64>) -> Op {
    op(
        "reserve",
        json!({"reservation_id": id, "sku": sku, "quantity": qty}),
        status,
    )
}

/// A ledger row written (and recorded) at `at` µs.
pub fn row(
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
        recorded_us: at,
        position: None,
    }
}

pub fn reservation(sku: &str, quantity: i64, status: &str) -> Reservation {
    Reservation {
        sku: sku.into(),
        quantity,
        status: status.into(),
    }
}

pub fn order(status: &str, lines: &[(&str, i64)]) -> Order {
    Order {
        status: status.into(),
        lines: lines.iter().map(|(s, q)| (s.to_string(), *q)).collect(),
    }
}

/// A consistent world: 10 units restocked, r1 held 3 and confirmed, r2 held 2 and released,
/// r3 refused; partition 0 had epoch 1 from t=0 and epoch 2 from t=1000; one settled window
/// [0, 100) holds r1's confirmation and an open one follows.
pub fn clean() -> (Vec<Op>, Dump) {
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
        .insert("r1".into(), reservation("a", 3, "confirmed"));
    dump.reservations
        .insert("r2".into(), reservation("a", 2, "released"));
    dump.reservations
        .insert("r3".into(), reservation("a", 50, "rejected"));
    dump.adjustments
        .insert("adj-1".into(), ("a".into(), 10, "applied".into()));
    dump.lease_history
        .insert(0, vec![(0, 0), (1, 5), (2, 1000)]);
    dump.runs = vec![
        Run {
            start_us: 0,
            end_us: 100,
            status: "settled".into(),
            reservations: Some(1),
            quantity: Some(3),
            position: Some(1),
            stream: "settlement".into(),
        },
        Run {
            start_us: 100,
            end_us: 200,
            status: "running".into(),
            reservations: None,
            quantity: None,
            position: None,
            stream: "settlement".into(),
        },
    ];
    dump.settlements = vec![Settled {
        start_us: 0,
        sku: "a".into(),
        quantity: 3,
        reservations: 1,
    }];
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

/// Adds reservation `id` of `qty` units of "a", reserved at `at` (µs) under epoch 2, to the
/// ledger, the inventory row and the reservations, with the given status and give-back
/// (`release`/`expire`, written at `back_at`).
pub fn add_hold(dump: &mut Dump, id: &str, qty: i64, at: i64, back: Option<(&str, i64)>) {
    let next = dump.ledger.iter().map(|r| r.entry_id).max().unwrap_or(0) + 1;
    dump.ledger.push(row(
        next,
        "a",
        "reserve",
        Some(id),
        [0, -qty, qty, 0],
        2,
        at,
    ));
    let status = match back {
        Some((kind, back_at)) => {
            dump.ledger.push(row(
                next + 1,
                "a",
                kind,
                Some(id),
                [0, qty, -qty, 0],
                2,
                back_at,
            ));
            if kind == "release" {
                "released"
            } else {
                "expired"
            }
        }
        None => {
            let inv = dump.inventory.get_mut("a").unwrap();
            inv[1] -= qty;
            inv[2] += qty;
            "held"
        }
    };
    dump.reservations
        .insert(id.into(), reservation("a", qty, status));
}

/// Asserts that `rule` fired and no other rule did.
pub fn only(report: &Report, rule: &str) {
    assert!(
        report.count(rule) > 0,
        "{rule} did not fire:\n{}",
        report.table()
    );
    for other in RULES.iter().filter(|r| r.name != rule) {
        assert_eq!(
            report.count(other.name),
            0,
            "{} fired too:\n{}",
            other.name,
            report.table()
        );
    }
}

/// Asserts that no rule fired.
pub fn passes(history: &[Op], dump: &Dump) {
    let report = check(history, dump);
    assert_eq!(report.total(), 0, "{}", report.table());
}

/// Confirms the held reservation `id` at `at` µs (ledger, inventory row, status).
pub fn confirm(dump: &mut Dump, id: &str, at: i64) {
    let next = dump.ledger.iter().map(|r| r.entry_id).max().unwrap_or(0) + 1;
    let r = dump.reservations.get_mut(id).unwrap();
    let qty = r.quantity;
    r.status = "confirmed".into();
    dump.ledger.push(row(
        next,
        &r.sku.clone(),
        "confirm",
        Some(id),
        [0, 0, -qty, qty],
        2,
        at,
    ));
    let inv = dump.inventory.get_mut("a").unwrap();
    inv[2] -= qty;
    inv[3] += qty;
}

/// Asserts that `rule` fired and no rule but it and `also` did.
pub fn fires(report: &Report, rule: &str, also: &[&str]) {
    assert!(
        report.count(rule) > 0,
        "{rule} did not fire:\n{}",
        report.table()
    );
    for other in RULES
        .iter()
        .filter(|r| r.name != rule && !also.contains(&r.name))
    {
        assert_eq!(
            report.count(other.name),
            0,
            "{} fired too:\n{}",
            other.name,
            report.table()
        );
    }
}
