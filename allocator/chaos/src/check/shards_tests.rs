//! The merge of several shards' dumps: partition 1 moved from `s0` to `s1` (its ledger copied
//! with the same positions, write times and epochs, the source keeping a stale copy), partition
//! 0 stayed on `s0`, each shard settled its own window.

use serde_json::{json, Value};

use super::shards::{merge, ShardPart};
use super::testdata::{only, passes, reserve};
use super::{check, Op, RULES};

#[allow(clippy::too_many_arguments)] // one ledger row, column by column
fn ledger(
    entry: i64,
    p: i64,
    sku: &str,
    kind: &str,
    id: &str,
    d: [i64; 4],
    epoch: i64,
    at: i64,
    pos: i64,
) -> Value {
    let (reservation, adjustment) = if kind == "adjust" {
        (None, Some(id))
    } else {
        (Some(id), None)
    };
    json!({
        "entry_id": entry, "sku": sku, "partition": p, "kind": kind,
        "reservation_id": reservation, "adjustment_id": adjustment,
        "d_on_hand": d[0], "d_available": d[1], "d_held": d[2], "d_confirmed": d[3],
        "epoch": epoch, "position": pos, "written_us": at, "recorded_us": at,
    })
}

fn history(p: i64, epoch: i64, at: i64) -> Value {
    json!({"name": format!("partition/{p}"), "partition": p, "epoch": epoch, "holder_id": "x", "acquired_us": at})
}

/// `s0` (catalog) and `s1` after partition 1 moved to `s1` at 100 µs: `rc` was confirmed on
/// `s0` at 50 µs and settled there in [0, 100); `rb` was confirmed on `s1` at 200 µs and
/// settled there in [150, 300).
fn world() -> (Vec<Op>, Value, Value) {
    let ops = vec![
        reserve("ra", "a", 3, Some(201)),
        reserve("rb", "b", 2, Some(201)),
        reserve("rc", "b", 1, Some(201)),
    ];
    let s0 = json!({
        "inventory": [
            {"sku": "a", "partition": 0, "on_hand": 10, "available": 7, "held": 3, "confirmed": 0},
            // The source's stale copy of partition 1.
            {"sku": "b", "partition": 1, "on_hand": 10, "available": 7, "held": 2, "confirmed": 1},
        ],
        "reservations": [
            {"reservation_id": "ra", "sku": "a", "partition": 0, "quantity": 3, "status": "held"},
            {"reservation_id": "rb", "sku": "b", "partition": 1, "quantity": 2, "status": "held"},
            {"reservation_id": "rc", "sku": "b", "partition": 1, "quantity": 1, "status": "confirmed"},
        ],
        "ledger": [
            ledger(1, 0, "a", "adjust", "adj-a", [10, 10, 0, 0], 1, 10, 1),
            ledger(2, 1, "b", "adjust", "adj-b", [10, 10, 0, 0], 1, 11, 1),
            ledger(3, 1, "b", "reserve", "rb", [0, -2, 2, 0], 1, 20, 2),
            ledger(4, 0, "a", "reserve", "ra", [0, -3, 3, 0], 1, 30, 2),
            ledger(5, 1, "b", "reserve", "rc", [0, -1, 1, 0], 1, 40, 3),
            ledger(6, 1, "b", "confirm", "rc", [0, 0, -1, 1], 1, 50, 4),
        ],
        "adjustments": [
            {"adjustment_id": "adj-a", "sku": "a", "partition": 0, "delta": 10, "status": "applied"},
            {"adjustment_id": "adj-b", "sku": "b", "partition": 1, "delta": 10, "status": "applied"},
        ],
        "orders": [],
        "leases": [],
        // Epoch 2 of partition 1 is the mover's fence on the source.
        "lease_history": [history(0, 1, 0), history(1, 1, 0), history(1, 2, 100)],
        "settlement_runs": [
            {"start_us": 0, "end_us": 100, "status": "settled", "reservations": 1, "quantity": 1, "position": 1},
        ],
        "settlements": [{"start_us": 0, "sku": "b", "quantity": 1, "reservations": 1}],
    });
    let s1 = json!({
        "inventory": [
            {"sku": "b", "partition": 1, "on_hand": 10, "available": 7, "held": 0, "confirmed": 3},
        ],
        "reservations": [
            {"reservation_id": "rb", "sku": "b", "partition": 1, "quantity": 2, "status": "confirmed"},
            {"reservation_id": "rc", "sku": "b", "partition": 1, "quantity": 1, "status": "confirmed"},
        ],
        "ledger": [
            ledger(1, 1, "b", "adjust", "adj-b", [10, 10, 0, 0], 1, 11, 1),
            ledger(2, 1, "b", "reserve", "rb", [0, -2, 2, 0], 1, 20, 2),
            ledger(3, 1, "b", "reserve", "rc", [0, -1, 1, 0], 1, 40, 3),
            ledger(4, 1, "b", "confirm", "rc", [0, 0, -1, 1], 1, 50, 4),
            ledger(5, 1, "b", "confirm", "rb", [0, 0, -2, 2], 3, 200, 5),
        ],
        "adjustments": [
            {"adjustment_id": "adj-b", "sku": "b", "partition": 1, "delta": 10, "status": "applied"},
        ],
        "orders": [],
        "leases": [],
        "lease_history": [history(1, 3, 150)],
        "partition_moves_in": [
            {"partition": 1, "from_position": 1, "through_position": 4, "source_shard": "s0"},
        ],
        "settlement_runs": [
            {"start_us": 150, "end_us": 300, "status": "settled", "reservations": 1, "quantity": 2, "position": 1},
        ],
        "settlements": [{"start_us": 150, "sku": "b", "quantity": 2, "reservations": 1}],
    });
    (ops, s0, s1)
}

fn parts(s0: Value, s1: Value) -> Vec<ShardPart> {
    vec![
        ShardPart {
            name: "s0".into(),
            catalog: true,
            partitions: [0].into(),
            dump: s0,
        },
        ShardPart {
            name: "s1".into(),
            catalog: false,
            partitions: [1].into(),
            dump: s1,
        },
    ]
}

#[test]
fn a_moved_partition_is_judged_from_its_new_shard() {
    let (ops, s0, s1) = world();
    let dump = merge(&parts(s0, s1)).unwrap();
    assert_eq!(dump.inventory["b"], [10, 7, 0, 3], "b comes from s1");
    assert_eq!(dump.reservations["rb"].status, "confirmed");
    let streams: Vec<&str> = dump.runs.iter().map(|r| r.stream.as_str()).collect();
    assert_eq!(streams, ["settlement", "settlement/s1"]);
    passes(&ops, &dump);
}

#[test]
fn a_write_on_the_source_after_the_move_is_a_stale_epoch_write() {
    let (ops, mut s0, s1) = world();
    // The old owner's batch landing on the source after the mover's fence (epoch 2 at 100).
    s0["ledger"].as_array_mut().unwrap().push(ledger(
        7,
        1,
        "b",
        "release",
        "rb",
        [0, 2, -2, 0],
        1,
        120,
        5,
    ));
    // It took the source's next position, 5, which the target gave another row: the stream
    // forks there too.
    let report = check(&ops, &merge(&parts(s0, s1)).unwrap());
    for rule in RULES.iter().map(|r| r.name) {
        let fired = report.count(rule) > 0;
        let expected = ["stale-epoch-write", "stream-position-forked"].contains(&rule);
        assert_eq!(fired, expected, "{rule}:\n{}", report.table());
    }
}

#[test]
fn a_target_that_settles_the_copied_range_again_is_caught() {
    let (ops, s0, mut s1) = world();
    // Without its record of the copy, s1 would own rc's confirmation, settled by s0 before
    // s1's first window.
    s1["partition_moves_in"] = json!([]);
    let report = check(&ops, &merge(&parts(s0, s1)).unwrap());
    only(&report, "settlement-exactness");
    assert!(report.violations["settlement-exactness"][0].starts_with("shard s1: "));
}

#[test]
fn a_partition_on_two_shards_is_refused() {
    let (_, s0, s1) = world();
    let mut both = parts(s0, s1);
    both[1].partitions.insert(0);
    assert!(merge(&both).unwrap_err().contains("partition 0"));
}

#[test]
fn a_skus_archived_history_comes_from_the_shard_that_holds_it() {
    let (ops, mut s0, mut s1) = world();
    // s1 archived b's first row (the adjustment); s0's archive says something else of b.
    s1["ledger"].as_array_mut().unwrap().remove(0);
    s1["ledger_archives"] = json!([{"name": "l1", "end_us": 15, "rows": 1, "last_entry_id": 1}]);
    s1["ledger_archived_totals"] =
        json!([{"sku": "b", "d_on_hand": 10, "d_available": 10, "d_held": 0, "d_confirmed": 0}]);
    s0["ledger_archives"] = json!([{"name": "l0", "end_us": 12, "rows": 1, "last_entry_id": 9}]);
    s0["ledger_archived_totals"] =
        json!([{"sku": "b", "d_on_hand": 99, "d_available": 0, "d_held": 0, "d_confirmed": 0}]);
    let dump = merge(&parts(s0, s1)).unwrap();
    let archived = dump.archived.as_ref().unwrap();
    assert_eq!(archived.totals["b"], [10, 10, 0, 0]);
    assert_eq!(archived.last_entry_by_sku["b"], 1);
    assert_eq!(archived.before_us, 15);
    passes(&ops, &dump);
}

#[test]
fn the_source_stale_copy_is_not_judged_as_the_partition() {
    let (ops, mut s0, s1) = world();
    // Were the source's row of b judged, the confirmed hold would be missing there.
    s0["reservations"][1]["status"] = json!("held");
    let dump = merge(&parts(s0, s1)).unwrap();
    passes(&ops, &dump);
    assert_eq!(
        dump.foreign_ledger.len(),
        4,
        "the source's copy of partition 1"
    );
}
