//! Fencing and lease exclusivity at the database: I4 (stale epochs never commit, also on rows
//! the new owner never touched), I5 (one holder, strictly increasing epochs) and the table-level
//! guards that protect against any writer.

use std::time::Duration;

use crate::common::*;
use allocator::fenced::{
    apply_group, fenced_transaction, Command, Fence, FencedError, Outcome, PartitionBatch,
};
use allocator::lease::{store, FenceToken};
use allocator::sessions::{build_pool, PoolSettings};
use schema::partition::partition_for;

fn pool(url: &str) -> deadpool_postgres::Pool {
    build_pool(
        url,
        &PoolSettings {
            size: 4,
            wait: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(300),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: "fencing-test".into(),
        },
    )
    .expect("pool")
}

/// A SKU that lands in `partition`.
fn sku_in(partition: u32) -> String {
    (0..)
        .map(|i| format!("fence-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap()
}

async fn expire_lease_now(pg: &tokio_postgres::Client, partition: u32) {
    pg.execute(
        "UPDATE leases SET expires_at = now() - interval '1 millisecond' WHERE partition = $1",
        &[&(partition as i32)],
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn older_epoch_cannot_write_a_row_the_new_owner_never_touched() {
    let db = migrated_database(PARTITIONS).await;
    let pool = pool(&db);
    let pg = client(&db).await;
    let partition = 3;
    let untouched = sku_in(partition);
    let ttl = Duration::from_secs(30);

    let old = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "old",
        "http://old",
        ttl,
    )
    .await
    .unwrap()
    .expect("old acquires");
    let old_fence = Fence {
        token: FenceToken::new(partition, old.epoch),
        replica_id: "old".into(),
    };
    let conn = pool.get().await.unwrap();
    let seeded = fenced_transaction(
        &conn,
        &old_fence,
        &[Command::Adjust {
            adjustment_id: "seed".into(),
            sku: untouched.clone(),
            delta: 5,
        }],
    )
    .await
    .unwrap();
    assert!(matches!(seeded[0], Outcome::Adjusted { .. }));

    // The old owner's lease lapses (it is paused, say) and a new owner takes over. The new owner
    // never writes `untouched`, so that row still carries the old epoch.
    expire_lease_now(&pg, partition).await;
    let new = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "new",
        "http://new",
        ttl,
    )
    .await
    .unwrap()
    .expect("new owner acquires the expired lease");
    assert!(new.epoch > old.epoch, "epochs strictly increase");
    assert!(new.revision > old.revision);

    // The old owner wakes up and tries to reserve, restock and expire on that row.
    for command in [
        Command::Reserve {
            reservation_id: "late".into(),
            sku: untouched.clone(),
            quantity: 1,
            ttl_seconds: 60,
            owner: Default::default(),
        },
        Command::Adjust {
            adjustment_id: "late-adj".into(),
            sku: untouched.clone(),
            delta: 7,
        },
        Command::ExpireDue { limit: 10 },
    ] {
        let result = fenced_transaction(&conn, &old_fence, &[command]).await;
        assert!(
            matches!(result, Err(FencedError::StaleEpoch { current: Some(e), .. }) if e == new.epoch),
            "stale epoch must be refused: {result:?}"
        );
    }
    let row = pg
        .query_one(
            "SELECT available, on_hand, highest_epoch FROM inventory WHERE sku = $1",
            &[&untouched],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (5, 5),
        "nothing changed"
    );
    assert_eq!(row.get::<_, i64>(2), old.epoch);
    let late: i64 = pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE reservation_id = 'late'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        late, 0,
        "no reservation without its decrement, and none at all from a stale owner"
    );

    // The new owner writes fine.
    let new_fence = Fence {
        token: FenceToken::new(partition, new.epoch),
        replica_id: "new".into(),
    };
    let ok = fenced_transaction(
        &conn,
        &new_fence,
        &[Command::Reserve {
            reservation_id: "fresh".into(),
            sku: untouched.clone(),
            quantity: 1,
            ttl_seconds: 60,
            owner: Default::default(),
        }],
    )
    .await
    .unwrap();
    assert!(matches!(ok[0], Outcome::Reservation { created: true, .. }));
}

#[tokio::test]
async fn an_acquire_cannot_interleave_with_an_owner_transaction() {
    let db = migrated_database(PARTITIONS).await;
    let pool = pool(&db);
    let partition = 1;
    let ttl = Duration::from_secs(30);
    let old = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "old",
        "http://old",
        ttl,
    )
    .await
    .unwrap()
    .unwrap();

    // The owner's batch is in flight: it has passed its fence inside the batch function (run
    // here in an explicit transaction that stays open, as a slow batch would)...
    let mut owner = client(&db).await;
    let tx = owner.transaction().await.unwrap();
    let fenced = tx
        .query_one(
            "SELECT o_result FROM apply_fenced_batch('old', ARRAY[$1::int], ARRAY[$2::bigint],
                    ARRAY[$1::int], ARRAY['expire'], ARRAY[NULL::text], ARRAY[NULL::text],
                    ARRAY[10::bigint], ARRAY[0])",
            &[&(partition as i32), &old.epoch],
        )
        .await
        .unwrap();
    assert_eq!(fenced.get::<_, String>(0), "expired", "the fence passed");
    // ...and the lease lapses meanwhile. That update (like a renewal, a non-key update) does
    // not wait for the batch's fence lock, so a stuck batch can never fail renewals.
    let renewer = client(&db).await;
    renewer
        .execute("SET lock_timeout = '300ms'", &[])
        .await
        .unwrap();
    expire_lease_now(&renewer, partition).await;
    // ...when a newer owner tries to acquire: the acquire has to wait for the owner's
    // transaction (here it gives up on its short lock timeout), so it can never commit in the
    // middle of it.
    let blocked = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "new",
        "http://new",
        ttl,
    )
    .await;
    let error = blocked.expect_err("acquire must wait for the owner's transaction");
    assert_eq!(
        allocator::error::classify(&error),
        allocator::error::DbFailure::Unavailable,
        "lock timeout: {error:?}"
    );
    tx.commit().await.unwrap();
    let new = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "new",
        "http://new",
        ttl,
    )
    .await
    .unwrap()
    .expect("acquire succeeds once the owner's transaction ended");
    assert_eq!(new.epoch, old.epoch + 1);
}

#[tokio::test]
async fn only_one_of_many_concurrent_acquirers_wins_and_epochs_increase() {
    let db = migrated_database(PARTITIONS).await;
    let pool = pool(&db);
    let ttl = Duration::from_secs(30);
    let attempts = (0..16).map(|i| {
        let pool = pool.clone();
        tokio::spawn(async move {
            let client = pool.get().await.unwrap();
            store::acquire(&**client, 0, &format!("r{i}"), "http://x", ttl)
                .await
                .unwrap()
        })
    });
    let winners: Vec<_> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .filter_map(|r| r.unwrap())
        .collect();
    assert_eq!(winners.len(), 1, "exactly one holder: {winners:?}");
    let first = winners[0];

    // Renewal needs holder and epoch; another replica's renewal is refused.
    let c = pool.get().await.unwrap();
    assert_eq!(
        store::renew(&**c, "intruder", &[first.token()], ttl)
            .await
            .unwrap(),
        Vec::<u32>::new()
    );
    // Release by the holder, then re-acquire by the same holder: a new, higher epoch (I5).
    let owner: String = client(&db)
        .await
        .query_one("SELECT holder_id FROM leases WHERE partition = 0", &[])
        .await
        .unwrap()
        .get(0);
    assert!(store::release(&**c, first.token(), "intruder")
        .await
        .unwrap()
        .is_none());
    assert!(store::release(&**c, first.token(), &owner)
        .await
        .unwrap()
        .is_some());
    let again = store::acquire(&**c, 0, &owner, "http://x", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.epoch, first.epoch + 1);
    let restart = store::acquire(&**c, 0, &owner, "http://x", ttl)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        restart.epoch,
        again.epoch + 1,
        "a restart under the same id still bumps the epoch"
    );
    assert!(store::acquire(&**c, 0, "other", "http://y", ttl)
        .await
        .unwrap()
        .is_none());
}

#[tokio::test]
async fn tables_refuse_negative_stock_stale_epochs_and_ledger_edits() {
    let db = migrated_database(PARTITIONS).await;
    let pool = pool(&db);
    let pg = client(&db).await;
    let partition = 2;
    let sku = sku_in(partition);
    let lease = store::acquire(
        &**pool.get().await.unwrap(),
        partition,
        "o",
        "http://o",
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .unwrap();
    let fence = Fence {
        token: FenceToken::new(partition, lease.epoch),
        replica_id: "o".into(),
    };
    let conn = pool.get().await.unwrap();
    fenced_transaction(
        &conn,
        &fence,
        &[Command::Adjust {
            adjustment_id: "s".into(),
            sku: sku.clone(),
            delta: 3,
        }],
    )
    .await
    .unwrap();

    let negative = pg
        .execute(
            "UPDATE inventory SET available = available - 4, held = held + 4 WHERE sku = $1",
            &[&sku],
        )
        .await
        .expect_err("CHECK (available >= 0)");
    assert_eq!(negative.code().unwrap().code(), "23514");
    let unbalanced = pg
        .execute(
            "UPDATE inventory SET available = available - 1 WHERE sku = $1",
            &[&sku],
        )
        .await
        .expect_err("on_hand = available + held + confirmed");
    assert_eq!(unbalanced.code().unwrap().code(), "23514");
    let stale = pg
        .execute(
            "UPDATE inventory SET highest_epoch = highest_epoch - 1 WHERE sku = $1",
            &[&sku],
        )
        .await
        .expect_err("epoch fence trigger");
    assert_eq!(
        stale.code().unwrap().code(),
        allocator::error::SQLSTATE_STALE_EPOCH
    );
    let edit = pg
        .execute(
            "UPDATE ledger SET d_available = 100 WHERE sku = $1",
            &[&sku],
        )
        .await
        .expect_err("append-only ledger");
    assert_eq!(edit.code().unwrap().code(), "FA003");
    let delete = pg
        .execute("DELETE FROM ledger", &[])
        .await
        .expect_err("append-only ledger");
    assert_eq!(delete.code().unwrap().code(), "FA003");
    let truncate = pg
        .execute("TRUNCATE ledger", &[])
        .await
        .expect_err("append-only ledger, also for TRUNCATE");
    assert_eq!(truncate.code().unwrap().code(), "FA003");
    let lopsided = pg
        .execute(
            "INSERT INTO ledger (sku, partition, kind, adjustment_id, d_on_hand, d_available,
                                 d_held, d_confirmed, epoch)
             VALUES ($1, $2, 'restock', 's', 5, 4, 0, 0, $3)",
            &[&sku, &(partition as i32), &lease.epoch],
        )
        .await
        .expect_err("every ledger row balances");
    assert_eq!(lopsided.code().unwrap().code(), "23514");
    let endless = pg
        .execute(
            "INSERT INTO reservations (reservation_id, sku, partition, quantity, status, epoch,
                                       ttl_seconds, request_fingerprint, expires_at)
             VALUES ('endless', $1, $2, 1, 'held', $3, 60, 'x', NULL)",
            &[&sku, &(partition as i32), &lease.epoch],
        )
        .await
        .expect_err("a hold has an expiry");
    assert_eq!(endless.code().unwrap().code(), "23514");
    let lease_back = pg
        .execute(
            "UPDATE leases SET epoch = 0 WHERE partition = $1",
            &[&(partition as i32)],
        )
        .await
        .expect_err("lease epochs never decrease");
    assert_eq!(lease_back.code().unwrap().code(), "FA002");
}

#[tokio::test]
async fn migrations_are_idempotent_and_keep_the_partition_count() {
    let url = testkit::shared::fresh_database("mig").await.unwrap();
    // Several replicas migrating at once serialise on the advisory lock.
    let runs = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move {
            let mut c = allocator::sessions::connect(&url).await.unwrap();
            schema::initialise(&mut c, Some(12)).await
        })
    });
    for run in futures::future::join_all(runs).await {
        assert_eq!(run.unwrap().unwrap().partition_count, 12);
    }
    let mut c = allocator::sessions::connect(&url).await.unwrap();
    let again = schema::initialise(&mut c, None).await.unwrap();
    assert_eq!(again.partition_count, 12);
    assert!(again.applied.is_empty());
    assert!(matches!(
        schema::initialise(&mut c, Some(16)).await,
        Err(schema::SchemaError::PartitionCountMismatch {
            existing: 12,
            requested: 16
        })
    ));
    let leases: i64 = c
        .query_one(
            "SELECT count(*) FROM leases WHERE partition IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(leases, 12);
}

#[tokio::test]
async fn a_stale_partition_is_dropped_from_a_group_without_failing_the_others() {
    let db = migrated_database(PARTITIONS).await;
    let pool = pool(&db);
    let pg = client(&db).await;
    let ttl = Duration::from_secs(30);
    let conn = pool.get().await.unwrap();
    let mut fences = Vec::new();
    for partition in [4, 5] {
        let lease = store::acquire(&**conn, partition, "owner", "http://owner", ttl)
            .await
            .unwrap()
            .unwrap();
        fences.push(Fence {
            token: FenceToken::new(partition, lease.epoch),
            replica_id: "owner".into(),
        });
    }
    let skus: Vec<String> = [4, 5].iter().map(|p| sku_in(*p)).collect();
    for (fence, sku) in fences.iter().zip(&skus) {
        fenced_transaction(
            &conn,
            fence,
            &[Command::Adjust {
                adjustment_id: format!("seed-{sku}"),
                sku: sku.clone(),
                delta: 10,
            }],
        )
        .await
        .unwrap();
    }
    // Partition 4 is taken over by somebody else; partition 5 is still ours.
    expire_lease_now(&pg, 4).await;
    store::acquire(&**conn, 4, "usurper", "http://usurper", ttl)
        .await
        .unwrap()
        .unwrap();

    let reserve = |id: &str, sku: &str| Command::Reserve {
        reservation_id: id.into(),
        sku: sku.into(),
        quantity: 2,
        ttl_seconds: 60,
        owner: Default::default(),
    };
    let stale_cmds = [reserve("g-stale", &skus[0])];
    let live_cmds = [reserve("g-live-1", &skus[1]), reserve("g-live-2", &skus[1])];
    let results = apply_group(
        &conn,
        &[
            PartitionBatch {
                fence: &fences[0],
                commands: &stale_cmds,
            },
            PartitionBatch {
                fence: &fences[1],
                commands: &live_cmds,
            },
        ],
    )
    .await
    .expect("the group statement itself succeeds");
    assert!(matches!(
        results[0],
        Err(FencedError::StaleEpoch { partition: 4, .. })
    ));
    let live = results[1].as_ref().expect("the live partition committed");
    assert_eq!(live.len(), 2);
    assert!(live
        .iter()
        .all(|o| matches!(o, Outcome::Reservation { created: true, .. })));
    let held: Vec<i64> = pg
        .query(
            "SELECT held FROM inventory WHERE sku = ANY($1) ORDER BY partition",
            &[&skus],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        held,
        vec![0, 4],
        "nothing of the stale partition was written"
    );
    let stale_rows: i64 = pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE reservation_id = 'g-stale'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(stale_rows, 0);
}
