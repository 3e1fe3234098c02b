//! Moving a partition between shards that archive their ledgers (DESIGN.md §8a, §12): the
//! partition's archived history travels with it, and a move into a shard whose old time range
//! is archived folds the rows it cannot hold instead of failing.
//!
//! Two shards with 2 s ledger partitions and one-second settlement windows; the test archives
//! their oldest partitions itself (`archive_oldest`, a 1 s horizon). Partition `MOVED`'s rows
//! are written on s0 and its oldest ones archived there; it moves to s1; more rows on s1; s1
//! archives the rows it got and some of its own, s0 archives everything it held and the time
//! the partition spent on s1; it moves back to s0; s1 archives all it held of it, and it moves
//! to s1 again (whose copied range then starts at position 1 a second time). After each move
//! the holding shard's ledger (archived totals plus live rows) sums to every inventory row of
//! the partition, the move succeeded and folded rows, and every acknowledged hold is there; at
//! the end the two shards' settlements count every confirmed unit once between them. And a
//! move whose source does not balance is refused before the fence.

use std::time::{Duration, Instant};

use allocator::retention::archive::{archive_oldest, ArchiveSettings, Archived};
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use schema::shard::{ShardName, ShardTarget};

use crate::common::*;
use crate::shard_moves::two_shards;

const MOVED: u32 = 1;
const STOCK: i64 = 1_000_000;
/// One-second settlement windows (the grace outlasts the tests' 1 s statement timeout).
const WINDOWS: [&str; 4] = [
    "--settlement-window-secs",
    "1",
    "--settlement-grace-ms",
    "1500",
];

async fn now(db: &tokio_postgres::Client) -> DateTime<Utc> {
    db.query_one("SELECT now()", &[]).await.unwrap().get(0)
}

/// Archive every ledger partition of `db` that ends by `before`, waiting for settlement to pass
/// each; returns how many went.
pub(crate) async fn archive_through(db: &tokio_postgres::Client, before: DateTime<Utc>) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let settings = ArchiveSettings {
        dir: dir.path().to_path_buf(),
        horizon: Duration::from_secs(1),
        require_relay: false,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut archived = 0;
    loop {
        match archive_oldest(db, &settings, Some(before), None)
            .await
            .expect("archive")
        {
            Archived::Done(_) => archived += 1,
            Archived::Nothing => return archived,
            Archived::Refused { partition, reason } => {
                assert!(
                    Instant::now() < deadline,
                    "{partition} not archived: {reason}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Archived::Fenced => unreachable!("no fence given"),
        }
    }
}

/// Moves `MOVED` to `to`; a failure is one of the `problems`.
async fn move_to(
    shards: &[ShardTarget],
    to: &ShardName,
    problems: &mut Vec<String>,
) -> Option<allocator::shard::Moved> {
    // These replicas run no event relay: nothing to wait for before folding rows.
    let options = allocator::shard::MoveOptions {
        relay_wait: None,
        ..Default::default()
    };
    match allocator::shard::move_partition_with(shards, MOVED, to, &options).await {
        Ok(moved) => Some(moved),
        Err(e) => {
            problems.push(format!("the move to {to} failed: {e:#}"));
            None
        }
    }
}

/// The end of the last window `db` has settled.
async fn settled_through(db: &tokio_postgres::Client) -> DateTime<Utc> {
    db.query_one(
        "SELECT coalesce(max(window_end), 'epoch'::timestamptz) FROM settlement_runs
          WHERE status = 'settled'",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Waits until `replica` owns `MOVED`.
async fn wait_owns_moved(replica: &TestReplica) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !replica
        .ownership
        .held()
        .iter()
        .any(|t| t.partition == MOVED)
    {
        assert!(
            Instant::now() < deadline,
            "{} did not take partition {MOVED}",
            replica.replica_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `n` holds of one unit on each of `skus` as `prefix-i`, every other one confirmed; the ids
/// left held.
async fn load(replica: &TestReplica, prefix: &str, skus: &[String], n: usize) -> Vec<String> {
    let mut held = Vec::new();
    for i in 0..n {
        for (k, sku) in skus.iter().enumerate() {
            let id = format!("{prefix}-{k}-{i}");
            let answer = reserve(&replica.api, &id, sku, 1).await;
            assert_eq!(answer.status, StatusCode::CREATED, "{id}: {answer:?}");
            if i % 2 == 1 {
                let confirmed = replica.api.confirm(&id).await;
                assert!(confirmed.status.is_success(), "{id}: {confirmed:?}");
            } else {
                held.push(id);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held
}

/// Every way `db` disagrees with itself about `skus`: a row that does not equal its archived
/// totals plus its live ledger, or an acknowledged hold that is not held.
async fn disagreements(
    db: &tokio_postgres::Client,
    skus: &[String],
    held: &[String],
    when: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for sku in skus {
        let (row, ledger) = ledger_balance(db, sku).await;
        if row != ledger {
            out.push(format!(
                "{when}: {sku}: row {row:?}, archived totals + live ledger {ledger:?}"
            ));
        }
    }
    for id in held {
        let status: Option<String> = db
            .query_opt(
                "SELECT status FROM reservations WHERE reservation_id = $1",
                &[id],
            )
            .await
            .unwrap()
            .map(|r| r.get(0));
        if status.as_deref() != Some("held") {
            out.push(format!("{when}: acknowledged hold {id} is {status:?}"));
        }
    }
    out
}

#[tokio::test]
async fn shard_moves_carry_archived_history_and_fold_rows_into_archived_time() {
    let (a, b, shards) = two_shards("movearch", Some(2)).await;
    let r0 = TestReplica::start(fast_config_with(&a, "r0", &WINDOWS)).await;
    let on_b: Vec<&str> = WINDOWS
        .iter()
        .copied()
        .chain(["--catalog-url", &a])
        .collect();
    let r1 = TestReplica::start(fast_config_with(&b, "r1", &on_b)).await;
    let (db0, db1) = (client(&a).await, client(&b).await);
    let skus = vec![sku_in(MOVED, "arch-x"), sku_in(MOVED, "arch-y")];
    let (s0, s1): (ShardName, ShardName) = ("s0".parse().unwrap(), "s1".parse().unwrap());
    let mut problems = Vec::new();
    let mut folded = Vec::new();

    // On s0: rows, then the partitions holding them archived, then live rows.
    wait_owns_moved(&r0).await;
    for sku in &skus {
        restock(&r0.url, sku, STOCK).await;
    }
    let mut held = load(&r0, "p1", &skus, 6).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let t1 = now(&db0).await;
    assert!(archive_through(&db0, t1).await > 0, "s0 archived nothing");
    let archived_rows: i64 = db0
        .query_one(
            "SELECT coalesce(sum(rows), 0)::bigint FROM ledger_archived_totals
              WHERE sku = ANY($1)",
            &[&skus],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        archived_rows > 0,
        "s0 archived none of the partition's rows"
    );
    held.extend(load(&r0, "p2", &skus, 6).await);
    // s1 archives the same time (none of the partition's rows yet).
    archive_through(&db1, t1).await;

    'moves: {
        // Move 1: s0 -> s1, the oldest rows archived on the source.
        let Some(moved) = move_to(&shards, &s1, &mut problems).await else {
            break 'moves;
        };
        folded.push(moved.ledger_rows_folded);
        problems.extend(disagreements(&db1, &skus, &held, "after the move to s1").await);
        wait_owns_moved(&r1).await;
        held.extend(load(&r1, "p3", &skus, 6).await);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let t3 = now(&db1).await;
        held.extend(load(&r1, "p4", &skus, 6).await);
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let t4 = now(&db1).await;
        // s1 archives the rows it got and some of its own; s0 everything up to t4, the time the
        // partition's live rows on s1 were written in among it.
        assert!(archive_through(&db1, t3).await > 0, "s1 archived nothing");
        assert!(archive_through(&db0, t4).await > 0, "s0 archived nothing");
        held.extend(load(&r1, "p5", &skus, 4).await);
        problems.extend(disagreements(&db1, &skus, &held, "on s1 after archiving").await);

        // Move 2: s1 -> s0, into archived time.
        let Some(moved) = move_to(&shards, &s0, &mut problems).await else {
            break 'moves;
        };
        folded.push(moved.ledger_rows_folded);
        problems.extend(disagreements(&db0, &skus, &held, "after the move back to s0").await);
        wait_owns_moved(&r0).await;
        held.extend(load(&r0, "p6", &skus, 4).await);
        problems.extend(disagreements(&db0, &skus, &held, "on s0 after new rows").await);

        // Move 3: s0 -> s1 once s1 archived every row it held of the partition, so its copied
        // range starts at position 1 again, as the first move's did.
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let t6 = now(&db1).await;
        archive_through(&db1, t6).await;
        let live_on_s1: i64 = db1
            .query_one(
                "SELECT count(*) FROM ledger WHERE partition = $1",
                &[&(MOVED as i32)],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(live_on_s1, 0, "s1 archived all it held of the partition");
        held.extend(load(&r0, "p7", &skus, 4).await);
        let Some(moved) = move_to(&shards, &s1, &mut problems).await else {
            break 'moves;
        };
        folded.push(moved.ledger_rows_folded);
        assert!(
            moved.ledger_rows > 0,
            "the rows since s1 archived were appended"
        );
        problems.extend(disagreements(&db1, &skus, &held, "after the third move").await);
        wait_owns_moved(&r1).await;
        held.extend(load(&r1, "p8", &skus, 2).await);
        problems.extend(disagreements(&db1, &skus, &held, "on s1 after new rows").await);
        assert!(
            folded.iter().all(|n| *n > 0),
            "each move carried archived rows: {folded:?}"
        );

        // Both shards settle past the end; between them every confirmed unit once, the copied
        // ranges (the third move's widened) skipped by the shard that did not write them.
        let end = now(&db1).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while settled_through(&db0).await <= end || settled_through(&db1).await <= end {
            assert!(Instant::now() < deadline, "settlement did not pass the end");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut settled = 0;
        for db in [&db0, &db1] {
            let q: i64 = db
                .query_one(
                    "SELECT coalesce(sum(quantity), 0)::bigint FROM settlements
                      WHERE sku = ANY($1)",
                    &[&skus],
                )
                .await
                .unwrap()
                .get(0);
            settled += q;
        }
        let confirmed: i64 = db1
            .query_one(
                "SELECT sum(confirmed)::bigint FROM inventory WHERE sku = ANY($1)",
                &[&skus],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(settled, confirmed, "settled units over both shards");
    }
    r0.stop().await;
    r1.stop().await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// A source whose ledger does not balance a row of the partition (here archived totals that
/// were never archived) is refused before the fence: the source's lease is untouched, the
/// partition stays where it was and is served there.
#[tokio::test]
async fn shard_moves_refuse_an_unbalanced_history_before_the_fence() {
    let (a, _, shards) = two_shards("movearch-refuse", Some(2)).await;
    let r0 = TestReplica::start(fast_config_with(&a, "r0", &WINDOWS)).await;
    let db0 = client(&a).await;
    let sku = sku_in(MOVED, "refused");
    wait_owns_moved(&r0).await;
    restock(&r0.url, &sku, 10).await;
    db0.execute(
        "INSERT INTO ledger_archived_totals (sku, rows, d_on_hand, d_available, d_held,
                                             d_confirmed)
         VALUES ($1, 1, 5, 5, 0, 0)",
        &[&sku],
    )
    .await
    .unwrap();
    let before: (Option<String>, i64) = {
        let r = db0
            .query_one(
                "SELECT holder_id, epoch FROM leases WHERE partition = $1",
                &[&(MOVED as i32)],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let s1: ShardName = "s1".parse().unwrap();
    let error = allocator::shard::move_partition(&shards, MOVED, &s1)
        .await
        .expect_err("an unbalanced history is refused");
    assert!(
        format!("{error:#}").contains("does not balance"),
        "{error:#}"
    );
    let after: (Option<String>, i64) = {
        let r = db0
            .query_one(
                "SELECT holder_id, epoch FROM leases WHERE partition = $1",
                &[&(MOVED as i32)],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(after, before, "the source's lease is untouched");
    let map = schema::shard::store::read_map(&db0).await.unwrap().unwrap();
    assert_eq!(map.shard_index(MOVED), Some(0));
    assert_eq!(
        reserve(&r0.api, "after-refusal", &sku, 1).await.status,
        StatusCode::CREATED
    );
    r0.stop().await;
}
