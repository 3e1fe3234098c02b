//! Lease exclusivity at the database (I5: one holder, strictly increasing epochs; an acquire
//! never commits in the middle of an owner's batch) and the table-level guards that protect
//! against any writer, migrations included. Fencing of stale writes (I4) is in `fencing`.

use std::time::Duration;

use crate::common::*;
use allocator::fenced::{fenced_transaction, Command, Fence};
use allocator::lease::{store, FenceToken};

#[tokio::test]
async fn an_acquire_cannot_interleave_with_an_owner_transaction() {
    let db = migrated_database(PARTITIONS).await;
    let pool = fencing_pool(&db);
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
    let pool = fencing_pool(&db);
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
    let pool = fencing_pool(&db);
    let pg = client(&db).await;
    let partition = 2;
    let sku = sku_in(partition, "fence");
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
            owner: access::Owner::ANYONE,
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
