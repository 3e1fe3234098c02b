//! `max_held_units` inside the fenced transaction (`V22__hold_quota_units.sql`), without the
//! handler in front of it: the batch counts what the client holds over every partition, refuses
//! (and stores) a reserve that would pass the quota, names it, and counts its own grants and
//! releases; a reserve-only batch of such a client never takes the set-based statement (which
//! cannot decide the quota).

use std::time::Duration;

use crate::owners_fenced::partition_owned;
use access::{Owner, Quota};
use allocator::fenced::PartitionBatch;
use allocator::fenced::{apply_function, fenced_transaction, Command, Fence, Outcome};
use allocator::lease::{store, FenceToken};
use schema::partition::partition_for;

use crate::common::{client, PARTITIONS};

fn reserve(id: &str, sku: &str, quantity: i64, owner: &Owner) -> Command {
    Command::Reserve {
        reservation_id: id.into(),
        sku: sku.into(),
        quantity,
        ttl_seconds: 60,
        owner: owner.clone(),
    }
}

fn seed(id: &str, sku: &str) -> Command {
    Command::Adjust {
        adjustment_id: id.into(),
        sku: sku.into(),
        delta: 100,
        owner: Owner::ANYONE,
    }
}

fn assert_units_refused(outcome: &Outcome, limit: i64, held: i64) {
    match outcome {
        Outcome::HoldQuotaExceeded {
            quota,
            limit: l,
            held: h,
            ..
        } => assert_eq!((*quota, *l, *h), (Quota::MaxHeldUnits, limit, held)),
        other => panic!("refused by max_held_units: {other:?}"),
    }
}

#[tokio::test]
async fn the_fenced_batch_holds_a_client_to_its_units_over_partitions() {
    let (db, pool, fence, sku) = partition_owned("units").await;
    let conn = pool.get().await.unwrap();
    let pg = client(&db).await;
    // A second owned partition, and a SKU of it.
    let lease = store::acquire(&**conn, 2, "owner", "http://owner", Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let other_fence = Fence::new(FenceToken::new(2, lease.epoch), "owner");
    let other_sku = (0..)
        .map(|i| format!("units2-{i}"))
        .find(|s| partition_for(s, PARTITIONS) == 2)
        .unwrap();
    fenced_transaction(&conn, &fence, &[seed("u-seed", &sku)])
        .await
        .unwrap();
    fenced_transaction(&conn, &other_fence, &[seed("u-seed2", &other_sku)])
        .await
        .unwrap();
    let buyer = Owner {
        max_held_units: Some(4),
        ..Owner::client("buyer", false)
    };

    // 2 held in partition 3, then partition 2's batch sees them: 2 more fit, 1 more does not.
    let first = fenced_transaction(&conn, &fence, &[reserve("u-0", &sku, 2, &buyer)])
        .await
        .unwrap();
    assert!(
        matches!(&first[0], Outcome::Reservation { created: true, .. }),
        "{first:?}"
    );
    let batch = [
        reserve("u-1", &other_sku, 2, &buyer),
        reserve("u-2", &other_sku, 1, &buyer),
        reserve("u-big", &other_sku, 50, &Owner::client("other", false)),
    ];
    let outcomes = fenced_transaction(&conn, &other_fence, &batch)
        .await
        .unwrap();
    assert!(
        matches!(&outcomes[0], Outcome::Reservation { created: true, .. }),
        "{outcomes:?}"
    );
    assert_units_refused(&outcomes[1], 4, 4);
    assert!(
        matches!(&outcomes[2], Outcome::Reservation { created: true, .. }),
        "{outcomes:?}"
    );
    // A lone reserve-only batch of the client is decided by the function too.
    let lone = fenced_transaction(&conn, &fence, &[reserve("u-3", &sku, 1, &buyer)])
        .await
        .unwrap();
    assert_units_refused(&lone[0], 4, 4);
    let stored: Vec<(String, Option<i64>, Option<String>)> = pg
        .query(
            "SELECT status, refused_quota, refused_quota_name FROM reservations
              WHERE reservation_id IN ('u-2', 'u-3') ORDER BY reservation_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let refusal = (
        "rejected".to_owned(),
        Some(4),
        Some("max_held_units".to_owned()),
    );
    assert_eq!(
        stored,
        [refusal.clone(), refusal],
        "stored, naming the quota"
    );

    // One statement over both partitions counts its own release before the next reserve; the
    // refused id replays its refusal, naming the quota.
    let release = [Command::Release {
        reservation_id: "u-0".into(),
        owner: buyer.clone(),
    }];
    let after = [
        reserve("u-2", &other_sku, 1, &buyer),
        reserve("u-4", &other_sku, 2, &buyer),
        reserve("u-5", &other_sku, 1, &buyer),
    ];
    let group = [
        PartitionBatch {
            fence: &fence,
            commands: &release,
        },
        PartitionBatch {
            fence: &other_fence,
            commands: &after,
        },
    ];
    let results = apply_function(&conn, &group).await.unwrap();
    let outcomes = results[1].as_ref().unwrap();
    assert_units_refused(&outcomes[0], 4, 4);
    assert!(
        matches!(&outcomes[1], Outcome::Reservation { created: true, .. }),
        "{outcomes:?}"
    );
    assert_units_refused(&outcomes[2], 4, 4);
    let held: i64 = pg
        .query_one(
            "SELECT sum(quantity)::bigint FROM reservations WHERE owner = 'buyer' AND status = 'held'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 4);
}
