//! The owner check inside the fenced transaction (`V18__owners.sql`), without the handler's read
//! in front of it.

use std::time::Duration;

use crate::common::*;
use crate::owners::stored_owner;
use access::Owner;
use allocator::fenced::{apply_function, fenced_transaction, read_reservation, Command, Fence};
use allocator::fenced::{Outcome, PartitionBatch, ReservationRecord};
use allocator::lease::{store, FenceToken};
use allocator::sessions::{build_pool, PoolSettings};
use schema::partition::partition_for;

/// A migrated database, a pool on it, the fence of partition 3 held by "owner", and a SKU of
/// that partition (named after `prefix`).
pub async fn partition_owned(prefix: &str) -> (String, deadpool_postgres::Pool, Fence, String) {
    let db = migrated_database(PARTITIONS).await;
    let pool = build_pool(
        &db,
        &PoolSettings {
            size: 2,
            wait: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(300),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: "owners-test".into(),
        },
    )
    .unwrap();
    let conn = pool.get().await.unwrap();
    let partition = 3;
    let sku = (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == partition)
        .unwrap();
    let lease = store::acquire(
        &**conn,
        partition,
        "owner",
        "http://owner",
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .unwrap();
    let fence = Fence::new(FenceToken::new(partition, lease.epoch), "owner");
    drop(conn);
    (db, pool, fence, sku)
}

/// The check inside the fenced transaction, without the handler's read in front of it: both
/// statements (the set-based reserve and `apply_fenced_batch`) record the owner, and the
/// function refuses another client's id to every command as an unknown one.
#[tokio::test]
async fn the_fenced_batch_records_and_checks_the_owner() {
    let (db, pool, fence, sku) = partition_owned("owned").await;
    let conn = pool.get().await.unwrap();
    let pg = client(&db).await;
    let alice = Owner::client("alice", false);
    let bob = Owner::client("bob", false);
    let reserve = |id: &str, owner: &Owner| Command::Reserve {
        reservation_id: id.into(),
        sku: sku.clone(),
        quantity: 2,
        ttl_seconds: 60,
        owner: owner.clone(),
    };
    let seed = Command::Adjust {
        adjustment_id: "seed".into(),
        sku: sku.clone(),
        delta: 10,
        owner: access::Owner::ANYONE,
    };
    fenced_transaction(&conn, &fence, &[seed]).await.unwrap();
    // The set-based statement (a new id alone) and the function (beside a confirm).
    fenced_transaction(&conn, &fence, &[reserve("fast-1", &alice)])
        .await
        .unwrap();
    let commands = [reserve("slow-1", &alice)];
    let batch = PartitionBatch {
        fence: &fence,
        commands: &commands,
    };
    apply_function(&conn, &[batch]).await.unwrap();
    for id in ["fast-1", "slow-1"] {
        assert_eq!(
            stored_owner(&pg, id).await.as_deref(),
            Some("alice"),
            "{id}"
        );
    }

    let not_found = |outcome: &Outcome, id: &str| match outcome {
        Outcome::NotFound { detail } => {
            assert_eq!(detail, &format!("reservation {id} does not exist"))
        }
        other => panic!("{id}: expected not found, got {other:?}"),
    };
    let bobs = [
        reserve("fast-1", &bob),
        Command::Confirm {
            reservation_id: "fast-1".into(),
            owner: bob.clone(),
        },
        Command::Release {
            reservation_id: "slow-1".into(),
            owner: bob.clone(),
        },
    ];
    let outcomes = fenced_transaction(&conn, &fence, &bobs).await.unwrap();
    not_found(&outcomes[0], "fast-1");
    not_found(&outcomes[1], "fast-1");
    not_found(&outcomes[2], "slow-1");
    let held: i64 = pg
        .query_one("SELECT held FROM inventory WHERE sku = $1", &[&sku])
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 4, "both holds are still held");

    // The owner replays; an admin changes it.
    let mine = fenced_transaction(&conn, &fence, &[reserve("fast-1", &alice)])
        .await
        .unwrap();
    assert!(
        matches!(&mine[0], Outcome::Reservation { replayed: true, .. }),
        "{mine:?}"
    );
    let admin = Command::Release {
        reservation_id: "fast-1".into(),
        owner: Owner::client("ops", true),
    };
    let released = fenced_transaction(&conn, &fence, &[admin]).await.unwrap();
    assert!(matches!(
        &released[0],
        Outcome::Reservation {
            created: false,
            replayed: false,
            ..
        }
    ));
    // The read by id answers the owner only (outside a request: as anyone).
    let read = read_reservation(&**conn, "slow-1").await.unwrap();
    assert!(matches!(read, Some(ReservationRecord::Current(_))));
}

/// `max_held_per_sku` inside one batch and across batches (`V19__hold_quota_per_sku.sql`): in
/// arrival order, a reserve over the quota answers `quota` and is stored as refused (V21), a release in the
/// same batch makes room, holds from earlier batches count, other clients are not held to it.
#[tokio::test]
async fn the_fenced_batch_holds_a_client_to_its_per_sku_quota() {
    let (db, pool, fence, sku) = partition_owned("quota").await;
    let conn = pool.get().await.unwrap();
    let pg = client(&db).await;
    let seed = Command::Adjust {
        adjustment_id: "seed".into(),
        sku: sku.clone(),
        delta: 100,
        owner: access::Owner::ANYONE,
    };
    fenced_transaction(&conn, &fence, &[seed]).await.unwrap();
    let buyer = Owner {
        max_held_per_sku: Some(3),
        ..Owner::client("buyer", false)
    };
    let reserve = |id: &str, quantity: i64, owner: &Owner| Command::Reserve {
        reservation_id: id.into(),
        sku: sku.clone(),
        quantity,
        ttl_seconds: 60,
        owner: owner.clone(),
    };
    let earlier = fenced_transaction(&conn, &fence, &[reserve("q-0", 1, &buyer)])
        .await
        .unwrap();
    assert!(matches!(
        &earlier[0],
        Outcome::Reservation { created: true, .. }
    ));
    let batch = [
        reserve("q-1", 2, &buyer),
        reserve("q-2", 1, &buyer),
        Command::Release {
            reservation_id: "q-1".into(),
            owner: buyer.clone(),
        },
        reserve("q-3", 2, &buyer),
        reserve("q-4", 1, &buyer),
        reserve("q-5", 50, &Owner::client("other", false)),
    ];
    let outcomes = fenced_transaction(&conn, &fence, &batch).await.unwrap();
    let results: Vec<&str> = outcomes.iter().map(Outcome::result).collect();
    assert_eq!(
        results,
        [
            "held",
            "quota_exceeded",
            "transitioned",
            "held",
            "quota_exceeded",
            "held"
        ],
        "{outcomes:?}"
    );
    match &outcomes[1] {
        Outcome::HoldQuotaExceeded { limit, held, .. } => assert_eq!((*limit, *held), (3, 3)),
        other => panic!("{other:?}"),
    }
    let refused: Vec<(String, Option<i64>, Option<i64>)> = pg
        .query(
            "SELECT status, refused_quota, available_at_refusal FROM reservations
              WHERE reservation_id IN ('q-2', 'q-4') ORDER BY reservation_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let stored = ("rejected".to_owned(), Some(3), Some(3));
    assert_eq!(
        refused,
        [stored.clone(), stored],
        "a refusal is stored (V21)"
    );
    // Once the client holds less, the refused id replays its refusal; a new id goes through.
    let release = Command::Release {
        reservation_id: "q-0".into(),
        owner: buyer.clone(),
    };
    let batch = [
        release,
        reserve("q-4", 1, &buyer),
        reserve("q-6", 1, &buyer),
    ];
    let outcomes = fenced_transaction(&conn, &fence, &batch).await.unwrap();
    match &outcomes[1] {
        Outcome::HoldQuotaExceeded { limit, held, .. } => assert_eq!((*limit, *held), (3, 3)),
        other => panic!("the refusal replayed: {other:?}"),
    }
    assert!(
        matches!(&outcomes[2], Outcome::Reservation { created: true, .. }),
        "{outcomes:?}"
    );
    // A refusal and its replay in one batch answer alike.
    let batch = [reserve("q-7", 1, &buyer), reserve("q-7", 1, &buyer)];
    let outcomes = fenced_transaction(&conn, &fence, &batch).await.unwrap();
    let results: Vec<&str> = outcomes.iter().map(Outcome::result).collect();
    assert_eq!(
        results,
        ["quota_exceeded", "quota_exceeded"],
        "{outcomes:?}"
    );
}
