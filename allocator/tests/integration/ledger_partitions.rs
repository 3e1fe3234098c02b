//! The ledger partitioned by time (V17): a populated ledger converted by the migration keeps
//! every row and every column (including one added just before it, as a later migration of the
//! old table would), and every partition refuses UPDATE, DELETE and TRUNCATE.

use std::time::Duration;

use testkit::shared::fresh_database;

use crate::common::*;
use crate::ledger_support::*;

mod before_partitioning {
    // Every migration before V17, applied by the same runner (and so with the same recorded
    // checksums) as `allocator migrate`.
    refinery::embed_migrations!("../schema/migrations");
}

const HISTORY_ROWS: i64 = 20_000;

/// A ledger as an older release leaves it: fenced batches on two partitions under two owners,
/// and bulk history numbered as the batch paths number it, recorded over the last three days.
async fn populate(pg: &tokio_postgres::Client) {
    pg.batch_execute(
        "INSERT INTO cluster_settings (partition_count) VALUES (2);
         INSERT INTO leases (name, partition) VALUES ('partition/0', 0), ('partition/1', 1),
                ('job/settlement', NULL) ON CONFLICT (name) DO NOTHING;
         INSERT INTO ledger_positions VALUES (0, 0), (1, 0) ON CONFLICT DO NOTHING;
         INSERT INTO event_relay_progress (stream) VALUES ('partition/0'), ('partition/1')
                ON CONFLICT DO NOTHING;",
    )
    .await
    .expect("cluster rows");
    for (partition, sku) in [(0, "conv-a"), (1, "conv-b")] {
        let lease = format!("partition/{partition}");
        let e1 = acquire(pg, &lease, "old-a").await;
        let r1 = format!("{sku}-r1");
        let r2 = format!("{sku}-r2");
        batch(
            pg,
            "old-a",
            partition,
            e1,
            &[
                ("adjust", &format!("{sku}-adj"), sku, 100),
                ("reserve", &r1, sku, 3),
                ("reserve", &r2, sku, 4),
            ],
        )
        .await;
        let e2 = acquire(pg, &lease, "old-b").await;
        batch(
            pg,
            "old-b",
            partition,
            e2,
            &[("confirm", &r1, sku, 0), ("release", &r2, sku, 0)],
        )
        .await;
    }
    pg.execute(
        "WITH bump AS (
             UPDATE ledger_positions SET last_position = last_position + $1 WHERE partition = 0
             RETURNING last_position - $1 AS base)
         INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available, d_held,
                             d_confirmed, epoch, recorded_at, position, client)
         SELECT 'conv-hist-' || (g % 50), 0, 'restock', 'hist-' || g, 1, 1, 0, 0, 1,
                now() - interval '3 days' + g * interval '10 seconds', bump.base + g,
                'client-' || (g % 3)
           FROM bump, generate_series(1, $1::bigint) AS g",
        &[&HISTORY_ROWS],
    )
    .await
    .expect("bulk history");
}

#[tokio::test]
async fn a_populated_ledger_is_converted_with_every_row_and_column() {
    let url = fresh_database("ledger-conv").await.unwrap();
    let mut pg = client(&url).await;
    before_partitioning::migrations::runner()
        .set_target(refinery::Target::Version(16))
        .run_async(&mut pg)
        .await
        .expect("the migrations before V17");
    // A column and an index added to the ledger before V17 (as V16 adds `client`).
    pg.batch_execute(
        "ALTER TABLE ledger ADD COLUMN IF NOT EXISTS client text;
         CREATE INDEX ledger_test_client ON ledger (client) WHERE client IS NOT NULL;",
    )
    .await
    .unwrap();
    populate(&pg).await;
    let before = digest(&pg, "ledger").await;
    assert_eq!(before.0, HISTORY_ROWS + 10);
    let columns = "SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) ||
                                     CASE WHEN attnotnull THEN ' not null' ELSE '' END, ', '
                                     ORDER BY attnum)
                     FROM pg_attribute WHERE attrelid = 'ledger'::regclass AND attnum > 0
                      AND NOT attisdropped";
    let columns_before: String = pg.query_one(columns, &[]).await.unwrap().get(0);

    let options = schema::InitOptions {
        partitions: None,
        ledger_partition_span: Some(Duration::from_secs(3600)),
        ..Default::default()
    };
    schema::initialise_with(&mut pg, options)
        .await
        .expect("V17 on a populated ledger");

    let kind: i8 = pg
        .query_one(
            "SELECT relkind FROM pg_class WHERE oid = 'ledger'::regclass",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind as u8, b'p', "the ledger is a partitioned table");
    assert_eq!(digest(&pg, "ledger").await, before, "every row, unchanged");
    let columns_after: String = pg.query_one(columns, &[]).await.unwrap().get(0);
    assert_eq!(columns_after, columns_before, "every column, in order");
    let first = first_partition(&pg).await;
    assert_eq!(
        digest(&pg, &first).await,
        before,
        "the old table is the first partition"
    );
    // The later migrations ran too: V20 replaced ledger_sku by ledger_sku_position.
    let carried: i64 = pg
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'ledger'
                AND indexname IN ('ledger_sku_position', 'ledger_adjustment_id',
                                  'ledger_confirmed_at', 'ledger_test_client')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(carried, 4, "the old indexes are the parent's");
    let ahead: bool = pg
        .query_one(
            "SELECT max(range_end) >= now() + interval '3 hours' FROM ledger_partitions",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ahead, "partitions three spans ahead");

    // Writing goes on where it stopped: the next entry id and the next position of the stream.
    let (max_entry, max_position): (i64, i64) = {
        let r = pg
            .query_one(
                "SELECT max(entry_id), max(position) FILTER (WHERE partition = 0) FROM ledger",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let e3 = acquire(&pg, "partition/0", "new-c").await;
    batch(
        &pg,
        "new-c",
        0,
        e3,
        &[("reserve", "conv-a-r3", "conv-a", 1)],
    )
    .await;
    let r = pg
        .query_one(
            "SELECT entry_id, position, tableoid::regclass::text FROM ledger
              WHERE reservation_id = 'conv-a-r3'",
            &[],
        )
        .await
        .unwrap();
    assert!(r.get::<_, i64>(0) > max_entry);
    assert_eq!(r.get::<_, i64>(1), max_position + 1);
    // A row stamped two hours on lands in a later partition, numbered by the row trigger.
    let later: String = pg
        .query_one(
            "INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available,
                                 d_held, d_confirmed, epoch, recorded_at)
             VALUES ('conv-a', 0, 'restock', 'conv-later', 1, 1, 0, 0, 1,
                     now() + interval '2 hours')
             RETURNING tableoid::regclass::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_ne!(later, first);
    let events = schema::events::read::ledger_after(&pg, &[(0, max_position - 1)], 10)
        .await
        .unwrap();
    let positions: Vec<i64> = events
        .iter()
        .map(|e| match e {
            schema::events::Event::Ledger(l) => l.position,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        positions,
        [max_position, max_position + 1, max_position + 2],
        "the relay's read path crosses partitions, in position order"
    );

    refuses_changes_on_every_partition(&pg).await;
}

/// UPDATE and DELETE of a row and TRUNCATE are refused on the parent and on every partition
/// (the row guards come from the parent, TRUNCATE is guarded per table).
async fn refuses_changes_on_every_partition(pg: &tokio_postgres::Client) {
    let mut tables: Vec<String> = pg
        .query("SELECT name FROM ledger_partitions", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    tables.push("ledger".into());
    let mut rows_refused = 0;
    for table in &tables {
        let truncate = pg.execute(&format!("TRUNCATE {table}"), &[]).await;
        assert!(truncate.is_err(), "TRUNCATE {table} was allowed");
        let has_rows: bool = pg
            .query_one(&format!("SELECT EXISTS (SELECT 1 FROM {table})"), &[])
            .await
            .unwrap()
            .get(0);
        if has_rows {
            for change in [
                format!("UPDATE {table} SET epoch = epoch + 1"),
                format!("DELETE FROM {table}"),
            ] {
                let err = pg.execute(&change, &[]).await.expect_err(&change);
                assert_eq!(err.code().map(|c| c.code()), Some("FA003"), "{change}");
            }
            rows_refused += 1;
        }
    }
    assert!(rows_refused >= 3, "the parent and two partitions had rows");
    // A partition created later gets the same guards: a longer span takes the partitions
    // further ahead.
    pg.execute(
        "UPDATE ledger_partitioning SET span = interval '1 day'",
        &[],
    )
    .await
    .unwrap();
    let made: i32 = pg
        .query_one("SELECT ledger_ensure_partitions()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(made > 0, "a longer span creates partitions further ahead");
    let last: String = pg
        .query_one(
            "SELECT name FROM ledger_partitions ORDER BY range_end DESC LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(pg.execute(&format!("TRUNCATE {last}"), &[]).await.is_err());
}
