//! An archive and a row put into the partition it is archiving (V25). The allocators never
//! write into a partition past the horizon, but a partition move appends a moved partition's
//! older rows into the target's time partitions, the oldest included, while the target's
//! retention job may be archiving it.

use std::time::{Duration, Instant};

use allocator::retention::archive::{self, ArchiveSettings};

use crate::common::*;
use crate::ledger_support::*;

/// Waits until some session of the database waits for a lock.
async fn until_a_lock_wait(pg: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = pg
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the archive never waited for a lock"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn a_row_put_into_a_partition_being_archived_is_never_dropped_unrecorded() {
    let db = migrated_database_with_span(PARTITIONS, 1).await;
    let pg = client(&db).await;
    pg.batch_execute(
        "INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available,
                             d_held, d_confirmed, epoch, recorded_at)
         SELECT 'old-' || g, g % 8, 'restock', 'old-adj-' || g, 5, 5, 0, 0, 1,
                now() - interval '1 minute'
           FROM generate_series(1, 10) AS g",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    settle_until_now(&pg).await;
    publish_everything(&pg).await;

    // A move's copy: the ledger's ROW EXCLUSIVE lock, then a row in the oldest partition,
    // committed while the archive waits.
    let mover = client(&db).await;
    mover
        .batch_execute(
            "BEGIN;
             LOCK TABLE ledger IN ROW EXCLUSIVE MODE;
             INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available,
                                 d_held, d_confirmed, epoch, recorded_at)
             VALUES ('late', 1, 'restock', 'late-adj', 7, 7, 0, 0, 1,
                     now() - interval '1 minute')",
        )
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let settings = ArchiveSettings {
        dir: dir.path().to_path_buf(),
        horizon: Duration::from_secs(1),
        require_relay: false,
    };
    let archiving = {
        let db = db.clone();
        tokio::spawn(async move {
            let pg = client(&db).await;
            archive::archive_oldest(&pg, &settings, None, None)
                .await
                .map_err(|e| format!("{e:#}"))
        })
    };
    until_a_lock_wait(&pg).await;
    mover.batch_execute("COMMIT").await.unwrap();
    let outcome = archiving.await.unwrap();

    // The late row is in the ledger still, or in the archive's totals: never in neither.
    let live: i64 = pg
        .query_one(
            "SELECT coalesce(sum(d_on_hand), 0)::bigint FROM ledger WHERE sku = 'late'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let archived: i64 = pg
        .query_one(
            "SELECT coalesce(sum(d_on_hand), 0)::bigint FROM ledger_archived_totals
              WHERE sku = 'late'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        live + archived,
        7,
        "the late row was dropped unrecorded (archive: {outcome:?})"
    );
    // Once no move is in the way (and the late row relayed), the partition is archived whole.
    publish_everything(&pg).await;
    let outcome = archive::archive_oldest(
        &pg,
        &ArchiveSettings {
            dir: dir.path().to_path_buf(),
            horizon: Duration::from_secs(1),
            require_relay: false,
        },
        None,
        None,
    )
    .await
    .unwrap();
    assert!(matches!(outcome, archive::Archived::Done(_)), "{outcome:?}");
    assert_eq!(sums(&pg, "ledger_archived_totals").await.1[0], 10 * 5 + 7);
}
