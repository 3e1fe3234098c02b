//! Fencing at the database (I4): a write under a stale epoch never commits, also on rows the new
//! owner never touched, and a stale partition in a group batch fails alone. Lease exclusivity
//! and the table-level guards are in `lease_exclusivity`.

use std::time::Duration;

use crate::common::*;
use allocator::fenced::{
    apply_group, fenced_transaction, Command, Fence, FencedError, Outcome, PartitionBatch,
};
use allocator::lease::{store, FenceToken};

#[tokio::test]
async fn older_epoch_cannot_write_a_row_the_new_owner_never_touched() {
    let db = migrated_database(PARTITIONS).await;
    let pool = fencing_pool(&db);
    let pg = client(&db).await;
    let partition = 3;
    let untouched = sku_in(partition, "fence");
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
            owner: access::Owner::ANYONE,
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
            owner: access::Owner::ANYONE,
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
async fn a_stale_partition_is_dropped_from_a_group_without_failing_the_others() {
    let db = migrated_database(PARTITIONS).await;
    let pool = fencing_pool(&db);
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
    let skus: Vec<String> = [4, 5].iter().map(|p| sku_in(*p, "fence")).collect();
    for (fence, sku) in fences.iter().zip(&skus) {
        fenced_transaction(
            &conn,
            fence,
            &[Command::Adjust {
                adjustment_id: format!("seed-{sku}"),
                sku: sku.clone(),
                delta: 10,
                owner: access::Owner::ANYONE,
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
