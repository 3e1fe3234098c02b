//! The set-based reserve statement (`allocator::fenced::fast`, DESIGN.md §6): it writes a group of
//! plain reserves exactly as `apply_fenced_batch` would, and writes nothing at all whenever it
//! cannot decide every reserve, so that the function decides instead.

use std::time::Duration;

use crate::common::*;
use allocator::fenced::fast::reserve_group;
use allocator::fenced::{fenced_transaction, Command, Fence, Outcome, PartitionBatch};
use allocator::lease::{store, FenceToken};

fn reserve(id: &str, sku: &str, quantity: i64) -> Command {
    Command::Reserve {
        reservation_id: id.into(),
        sku: sku.into(),
        quantity,
        ttl_seconds: 60,
        owner: Default::default(),
    }
}

struct Fixture {
    pool: deadpool_postgres::Pool,
    pg: tokio_postgres::Client,
    fences: [Fence; 2],
    skus: [String; 2],
}

async fn fixture() -> Fixture {
    let db = migrated_database(PARTITIONS).await;
    let pool = allocator::sessions::build_pool(
        &db,
        &allocator::sessions::PoolSettings {
            size: 2,
            wait: Duration::from_secs(2),
            statement_timeout: Duration::from_secs(5),
            idle_in_transaction_timeout: Duration::from_secs(5),
            lock_timeout: Duration::from_millis(500),
            connect_timeout: allocator::sessions::CONNECT_TIMEOUT,
            application_name: "fast-path-test".into(),
        },
    )
    .unwrap();
    let conn = pool.get().await.unwrap();
    let mut fences = Vec::new();
    let mut skus = Vec::new();
    for partition in [2, 3] {
        let lease = store::acquire(
            &**conn,
            partition,
            "fast",
            "http://f",
            Duration::from_secs(60),
        )
        .await
        .unwrap()
        .unwrap();
        let fence = Fence::new(FenceToken::new(partition, lease.epoch), "fast");
        let sku = sku_in(partition, "fast");
        fenced_transaction(
            &conn,
            &fence,
            &[Command::Adjust {
                adjustment_id: format!("seed-{sku}"),
                sku: sku.clone(),
                delta: 10,
                owner: access::Owner::ANYONE,
            }],
        )
        .await
        .unwrap();
        fences.push(fence);
        skus.push(sku);
    }
    drop(conn);
    Fixture {
        pool,
        pg: client(&db).await,
        fences: fences.try_into().unwrap(),
        skus: skus.try_into().unwrap(),
    }
}

impl Fixture {
    /// (available, held) of both SKUs, reservations and ledger rows written so far.
    async fn state(&self) -> (Vec<(i64, i64)>, i64, i64) {
        let rows = self
            .pg
            .query(
                "SELECT available, held FROM inventory WHERE sku = ANY($1) ORDER BY partition",
                &[&self.skus.to_vec()],
            )
            .await
            .unwrap();
        let count = |sql: &'static str| async move {
            self.pg.query_one(sql, &[]).await.unwrap().get::<_, i64>(0)
        };
        (
            rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
            count("SELECT count(*) FROM reservations").await,
            count("SELECT count(*) FROM ledger WHERE kind = 'reserve'").await,
        )
    }
}

#[tokio::test]
async fn plain_reserves_are_written_by_one_set_based_statement() {
    let f = fixture().await;
    let conn = f.pool.get().await.unwrap();
    let a = [reserve("a1", &f.skus[0], 3), reserve("a2", &f.skus[0], 7)];
    let b = [reserve("b1", &f.skus[1], 4)];
    let group = [
        PartitionBatch {
            fence: &f.fences[0],
            commands: &a,
        },
        PartitionBatch {
            fence: &f.fences[1],
            commands: &b,
        },
    ];
    let results = reserve_group(&conn, &group)
        .await
        .unwrap()
        .expect("decided by the set-based statement");
    let created: Vec<(String, i64)> = results
        .iter()
        .flat_map(|r| r.as_ref().unwrap())
        .map(|o| match o {
            Outcome::Reservation {
                reservation,
                created: true,
                replayed: false,
            } => {
                assert!(reservation.expires_at.is_some());
                (reservation.reservation_id.clone(), reservation.epoch)
            }
            other => panic!("not a new hold: {other:?}"),
        })
        .collect();
    assert_eq!(
        created,
        vec![
            ("a1".into(), f.fences[0].token.epoch),
            ("a2".into(), f.fences[0].token.epoch),
            ("b1".into(), f.fences[1].token.epoch)
        ]
    );
    // The first SKU's whole stock in one row update; a row and a ledger row per reserve.
    assert_eq!(f.state().await, (vec![(0, 10), (6, 4)], 3, 3));
    for sku in &f.skus {
        let (row, ledger) = ledger_balance(&f.pg, sku).await;
        assert_eq!(row, ledger, "{sku}: the ledger sums to the row");
    }
}

#[tokio::test]
async fn anything_it_cannot_decide_leaves_nothing_written() {
    let f = fixture().await;
    let conn = f.pool.get().await.unwrap();
    fenced_transaction(&conn, &f.fences[0], &[reserve("taken", &f.skus[0], 1)])
        .await
        .unwrap();
    let before = f.state().await;
    let fine = [reserve("fine", &f.skus[1], 1)];
    for (case, commands) in [
        ("an id that exists", vec![reserve("taken", &f.skus[0], 1)]),
        (
            "a SKU that is not stocked",
            vec![reserve("x", "fast-unknown", 1)],
        ),
        (
            "more than the stock in sum, though each would fit",
            vec![reserve("y1", &f.skus[0], 6), reserve("y2", &f.skus[0], 6)],
        ),
    ] {
        let group = [
            PartitionBatch {
                fence: &f.fences[0],
                commands: &commands,
            },
            PartitionBatch {
                fence: &f.fences[1],
                commands: &fine,
            },
        ];
        let answer = reserve_group(&conn, &group).await.unwrap();
        assert!(answer.is_none(), "{case}: must be left to the function");
        assert_eq!(f.state().await, before, "{case}: nothing written");
    }
}

#[tokio::test]
async fn a_stale_partition_is_answered_stale_and_the_others_commit() {
    let f = fixture().await;
    let conn = f.pool.get().await.unwrap();
    f.pg.execute(
        "UPDATE leases SET expires_at = now() - interval '1 ms' WHERE partition = $1",
        &[&(f.fences[0].token.partition as i32)],
    )
    .await
    .unwrap();
    let taken = store::acquire(
        &**conn,
        f.fences[0].token.partition,
        "usurper",
        "http://u",
        Duration::from_secs(60),
    )
    .await
    .unwrap()
    .unwrap();
    let a = [reserve("s1", &f.skus[0], 1)];
    let b = [reserve("s2", &f.skus[1], 1)];
    let group = [
        PartitionBatch {
            fence: &f.fences[0],
            commands: &a,
        },
        PartitionBatch {
            fence: &f.fences[1],
            commands: &b,
        },
    ];
    let results = reserve_group(&conn, &group).await.unwrap().unwrap();
    match &results[0] {
        Err(allocator::fenced::FencedError::StaleEpoch { current, .. }) => {
            assert_eq!(*current, Some(taken.epoch))
        }
        other => panic!("the taken partition must be stale: {other:?}"),
    }
    assert!(matches!(
        results[1].as_ref().unwrap()[0],
        Outcome::Reservation { created: true, .. }
    ));
    assert_eq!(f.state().await, (vec![(10, 0), (9, 1)], 1, 1));
}

#[tokio::test]
async fn a_sweep_rides_along_only_while_nothing_is_due() {
    let f = fixture().await;
    let conn = f.pool.get().await.unwrap();
    let sweep = Command::ExpireDue { limit: 10 };
    let a = [sweep.clone(), reserve("w1", &f.skus[0], 1)];
    let group = [PartitionBatch {
        fence: &f.fences[0],
        commands: &a,
    }];
    let results = reserve_group(&conn, &group).await.unwrap().unwrap();
    let outcomes = results[0].as_ref().unwrap();
    assert_eq!(outcomes[0], Outcome::Expired { count: 0 });
    assert!(matches!(
        outcomes[1],
        Outcome::Reservation { created: true, .. }
    ));

    // A hold falls due: the sweep has work to do, which only the function does.
    let short = Command::Reserve {
        reservation_id: "short".into(),
        sku: f.skus[0].clone(),
        quantity: 1,
        ttl_seconds: 1,
        owner: Default::default(),
    };
    fenced_transaction(&conn, &f.fences[0], &[short])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let before = f.state().await;
    let b = [sweep, reserve("w2", &f.skus[0], 1)];
    let group = [PartitionBatch {
        fence: &f.fences[0],
        commands: &b,
    }];
    assert!(reserve_group(&conn, &group).await.unwrap().is_none());
    assert_eq!(f.state().await, before, "nothing written");
}

/// The statement is planned once per connection, not once per call: a lone reserve must not pay
/// for planning eight CTEs, which PostgreSQL's default does for as long as a connection has seen
/// only one-element groups (their custom plans look cheaper than the generic one).
#[tokio::test]
async fn lone_reserves_reuse_one_generic_plan() {
    let f = fixture().await;
    let conn = f.pool.get().await.unwrap();
    for i in 0..8 {
        let lone = [reserve(&format!("lone-{i}"), &f.skus[0], 1)];
        let group = [PartitionBatch {
            fence: &f.fences[0],
            commands: &lone,
        }];
        reserve_group(&conn, &group)
            .await
            .unwrap()
            .expect("decided by the set-based statement");
    }
    let row = conn
        .query_one(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements
              WHERE statement LIKE '%WITH fence AS MATERIALIZED%'
                AND statement NOT LIKE '%pg_prepared_statements%'",
            &[],
        )
        .await
        .unwrap();
    let (generic, custom): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        (generic, custom),
        (8, 0),
        "eight lone reserves, each with the connection's one generic plan"
    );
    assert_eq!(f.state().await.0[0], (2, 8));
}
