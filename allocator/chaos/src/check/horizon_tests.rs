//! The rules over a dump that holds less than the whole history: rows the retention job removed
//! past the idempotency horizon, and an archived ledger prefix. What may be missing passes; the
//! same thing missing inside the horizon, or a hold missing at all, still fires.

use std::collections::BTreeMap;

use serde_json::json;

use super::testdata::*;
use super::{check, ArchivedPrefix};

#[test]
fn a_reservation_removed_past_the_horizon_passes_and_one_inside_it_fires() {
    // r2 was released at 1200 µs.
    let (history, mut dump) = clean();
    dump.reservations.remove("r2");
    dump.removed_before_us = Some(2000);
    passes(&history, &dump);

    dump.removed_before_us = Some(1000);
    fires(
        &check(&history, &dump),
        "acked-hold-missing",
        &["reservation-ledger-mismatch"],
    );
    dump.removed_before_us = None;
    fires(
        &check(&history, &dump),
        "acked-hold-missing",
        &["reservation-ledger-mismatch"],
    );
}

#[test]
fn a_hold_is_never_allowed_to_be_missing() {
    let (mut history, mut dump) = clean();
    add_hold(&mut dump, "r5", 1, 1300, None);
    history.push(reserve("r5", "a", 1, Some(201)));
    passes(&history, &dump);
    dump.reservations.remove("r5");
    dump.removed_before_us = Some(i64::MAX);
    fires(
        &check(&history, &dump),
        "acked-hold-missing",
        &["reservation-ledger-mismatch"],
    );
}

#[test]
fn a_removed_reservation_ends_as_its_ledger_rows_show() {
    // r1 was confirmed at 30 µs; removed past the horizon it still counts as confirmed.
    let (mut history, mut dump) = clean();
    dump.reservations.remove("r1");
    dump.removed_before_us = Some(2000);
    passes(&history, &dump);
    // A release acknowledged for it would have been lost.
    history.push(op("release", json!({"reservation_id": "r1"}), Some(200)));
    only(&check(&history, &dump), "lost-ack");
}

/// The clean world with its first three rows (the restock, r1's reserve and confirm, all
/// before 100 µs) archived.
fn archived_world() -> (Vec<super::Op>, super::Dump) {
    let (history, mut dump) = clean();
    dump.ledger.retain(|r| r.entry_id > 3);
    dump.archived = Some(ArchivedPrefix {
        before_us: 100,
        last_entry_id: 3,
        totals: BTreeMap::from([("a".to_owned(), [10, 7, 0, 3])]),
        last_entry_by_sku: BTreeMap::new(),
    });
    (history, dump)
}

#[test]
fn the_ledger_is_replayed_from_the_archived_sums() {
    let (history, dump) = archived_world();
    passes(&history, &dump);

    let (history, mut dump) = archived_world();
    dump.archived
        .as_mut()
        .unwrap()
        .totals
        .insert("a".into(), [10, 8, 0, 2]);
    fires(
        &check(&history, &dump),
        "ledger-row-mismatch",
        &["oversell"],
    );

    // Without the archive's record the missing prefix shows.
    let (history, mut dump) = archived_world();
    dump.archived = None;
    let report = check(&history, &dump);
    assert!(report.count("oversell") > 0, "{}", report.table());
    assert!(
        report.count("ledger-row-mismatch") > 0,
        "{}",
        report.table()
    );
}

#[test]
fn a_prefix_that_went_below_zero_after_the_archive_still_fires() {
    let (history, mut dump) = archived_world();
    // 8 more held than the archived sums left available.
    dump.ledger
        .push(row(6, "a", "reserve", Some("x"), [0, -15, 15, 0], 2, 1300));
    dump.ledger
        .push(row(7, "a", "release", Some("x"), [0, 15, -15, 0], 2, 1400));
    dump.reservations
        .insert("x".into(), reservation("a", 15, "released"));
    only(&check(&history, &dump), "oversell");
}

#[test]
fn windows_after_the_archived_prefix_are_still_judged() {
    let (history, mut dump) = archived_world();
    add_hold(&mut dump, "r5", 1, 120, None);
    confirm(&mut dump, "r5", 150);
    dump.runs[1].status = "settled".into();
    dump.runs[1].reservations = Some(1);
    dump.runs[1].quantity = Some(1);
    dump.settlements.push(super::Settled {
        start_us: 100,
        sku: "a".into(),
        quantity: 1,
        reservations: 1,
    });
    passes(&history, &dump);
    dump.settlements[1].quantity = 2;
    dump.runs[1].quantity = Some(2);
    only(&check(&history, &dump), "settlement-exactness");
}

#[test]
fn an_order_removed_past_the_horizon_with_its_lines_passes() {
    let (mut history, mut dump) = clean();
    // Order o1 placed one line, released at 1500 µs; then it and its line were removed.
    let line = "order:o1:0";
    dump.ledger
        .push(row(6, "a", "reserve", Some(line), [0, -1, 1, 0], 2, 1400));
    dump.ledger
        .push(row(7, "a", "release", Some(line), [0, 1, -1, 0], 2, 1500));
    history.push(op_at(
        "order",
        json!({"order_id": "o1", "lines": [{"sku": "a", "quantity": 1}]}),
        Some(201),
        1,
    ));
    dump.removed_before_us = Some(2000);
    passes(&history, &dump);
    dump.removed_before_us = Some(1450);
    let report = check(&history, &dump);
    assert!(report.count("order-atomicity") > 0, "{}", report.table());
}
