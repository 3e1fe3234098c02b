//! A move as a recorded state machine (DESIGN.md §12, I13): stopped after any state it is
//! finished by running it again (a new attempt, a new holder id, a higher epoch) or given back
//! to its source by `--abort` before the flip; two movers of one partition at once are refused;
//! an interrupted move never leaves a lease row on the target that its allocators would
//! campaign for; and an id on both sides is refused before the fence.
//!
//! Two shards of [`PARTITIONS`] partitions (s0 holds 0–3, s1 4–7), one replica on each.

use std::time::{Duration, Instant};

use allocator::shard::{MoveOptions, MoveState};
use reqwest::StatusCode;
use schema::partition::lease_name;
use schema::shard::{ShardName, ShardTarget};

use crate::common::*;
use crate::shard_moves::two_shards;

struct Cluster {
    shards: Vec<ShardTarget>,
    db0: tokio_postgres::Client,
    db1: tokio_postgres::Client,
    r0: TestReplica,
    r1: TestReplica,
}

async fn cluster(name: &str) -> Cluster {
    let (a, b, shards) = two_shards(name, None).await;
    let r0 = TestReplica::start(fast_config(&a, "r0")).await;
    let r1 = TestReplica::start(fast_config_with(&b, "r1", &["--catalog-url", &a])).await;
    Cluster {
        shards,
        db0: client(&a).await,
        db1: client(&b).await,
        r0,
        r1,
    }
}

fn s(name: &str) -> ShardName {
    name.parse().unwrap()
}

fn stop_after(state: MoveState) -> MoveOptions {
    MoveOptions {
        stop_after: Some(state),
        ..MoveOptions::default()
    }
}

/// The partition's lease row on `db`: (holder, epoch, moving_in, unexpired).
async fn lease_row(
    db: &tokio_postgres::Client,
    partition: u32,
) -> Option<(Option<String>, i64, bool, bool)> {
    db.query_opt(
        "SELECT holder_id, epoch, moving_in, coalesce(expires_at > now(), false)
           FROM leases WHERE name = $1",
        &[&lease_name(partition)],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
}

/// The catalog's latest move of `partition`: (state, attempt).
async fn recorded(db0: &tokio_postgres::Client, partition: u32) -> Option<(String, i32)> {
    db0.query_opt(
        "SELECT state, attempt FROM shard_moves WHERE partition = $1
          ORDER BY move_id DESC LIMIT 1",
        &[&(partition as i32)],
    )
    .await
    .unwrap()
    .map(|r| (r.get(0), r.get(1)))
}

async fn wait_owns(replica: &TestReplica, partition: u32) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !replica
        .ownership
        .held()
        .iter()
        .any(|t| t.partition == partition)
    {
        assert!(
            Instant::now() < deadline,
            "{} did not take partition {partition}",
            replica.replica_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `replica` owns `partition` again at an epoch above `above`: the database names it
/// and it serves under that epoch (an owner fenced by a mover may not have noticed yet).
async fn wait_owns_above(replica: &TestReplica, partition: u32, above: i64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !replica
        .ownership
        .held()
        .iter()
        .any(|t| t.partition == partition && t.epoch > above)
    {
        assert!(
            Instant::now() < deadline,
            "{} did not take partition {partition} back above epoch {above}",
            replica.replica_id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A held reservation `id` of a SKU in `partition` through `replica`.
async fn hold(replica: &TestReplica, partition: u32, id: &str) -> String {
    wait_owns(replica, partition).await;
    let sku = sku_in(partition, "st");
    restock(&replica.url, &sku, 10).await;
    assert_eq!(
        reserve(&replica.api, id, &sku, 1).await.status,
        StatusCode::CREATED
    );
    sku
}

const STOPS: [MoveState; 4] = [
    MoveState::Fenced,
    MoveState::Copied,
    MoveState::Retired,
    MoveState::Flipped,
];

#[tokio::test]
async fn a_move_stopped_after_any_state_is_finished_by_running_it_again() {
    let c = cluster("mvstate-rerun").await;
    for (partition, state) in (0..).zip(STOPS) {
        let sku = hold(&c.r0, partition, &format!("rerun-{partition}")).await;
        let stopped = allocator::shard::move_partition_with(
            &c.shards,
            partition,
            &s("s1"),
            &stop_after(state),
        )
        .await;
        assert!(stopped.is_err(), "the move did not stop after {state}");
        assert_eq!(
            recorded(&c.db0, partition).await,
            Some((state.to_string(), 1))
        );
        let moved = allocator::shard::move_partition(&c.shards, partition, &s("s1"))
            .await
            .unwrap_or_else(|e| panic!("re-run after {state}: {e:#}"));
        assert_eq!(moved.attempt, 2, "after {state}");
        assert_eq!(
            recorded(&c.db0, partition).await,
            Some(("released".into(), 2))
        );
        assert_eq!(lease_row(&c.db0, partition).await, None, "after {state}");
        let (holder, _, incoming, _) = lease_row(&c.db1, partition).await.unwrap();
        assert!(!incoming, "still incoming after {state}");
        assert!(
            holder.as_deref().is_none_or(|h| h == "r1"),
            "after {state}: held by {holder:?}"
        );
        wait_owns(&c.r1, partition).await;
        assert_eq!(
            reserve(&c.r1.api, &format!("after-{partition}"), &sku, 1)
                .await
                .status,
            StatusCode::CREATED,
            "after {state}"
        );
    }
    c.r0.stop().await;
    c.r1.stop().await;
}

#[tokio::test]
async fn an_aborted_move_gives_the_partition_back_to_its_source_from_every_state_before_the_flip() {
    let c = cluster("mvstate-abort").await;
    let before_flip = [MoveState::Fenced, MoveState::Copied, MoveState::Retired];
    for (partition, state) in (0..).zip(before_flip) {
        let sku = hold(&c.r0, partition, &format!("abort-{partition}")).await;
        let epoch_before = lease_row(&c.db0, partition).await.unwrap().1;
        allocator::shard::move_partition_with(&c.shards, partition, &s("s1"), &stop_after(state))
            .await
            .expect_err("stopped");
        let aborted = allocator::shard::abort_move(&c.shards, partition)
            .await
            .unwrap_or_else(|e| panic!("abort after {state}: {e:#}"));
        assert_eq!(aborted.was, state);
        assert_eq!(
            recorded(&c.db0, partition).await,
            Some(("aborted".into(), 2))
        );
        assert_eq!(lease_row(&c.db1, partition).await, None, "after {state}");
        // Back at an epoch above every epoch the move wrote (the fence's, the copy's).
        wait_owns_above(&c.r0, partition, epoch_before + 1).await;
        assert_eq!(
            reserve(&c.r0.api, &format!("back-{partition}"), &sku, 1)
                .await
                .status,
            StatusCode::CREATED,
            "after {state}"
        );
    }
    // Past the flip an abort is refused; running the move again finishes it.
    allocator::shard::move_partition_with(&c.shards, 3, &s("s1"), &stop_after(MoveState::Flipped))
        .await
        .expect_err("stopped");
    let refused = allocator::shard::abort_move(&c.shards, 3)
        .await
        .unwrap_err();
    assert!(
        format!("{refused:#}").contains("past the map's flip"),
        "{refused:#}"
    );
    allocator::shard::move_partition(&c.shards, 3, &s("s1"))
        .await
        .expect("finish");
    c.r0.stop().await;
    c.r1.stop().await;
}

#[tokio::test]
async fn two_movers_of_one_partition_at_once_one_is_refused() {
    let c = cluster("mvstate-two").await;
    hold(&c.r0, 1, "two").await;
    let slow = MoveOptions {
        pause_after: Some((MoveState::Fenced, Duration::from_secs(2))),
        ..MoveOptions::default()
    };
    let first = {
        let shards = c.shards.clone();
        tokio::spawn(async move {
            allocator::shard::move_partition_with(&shards, 1, &s("s1"), &slow).await
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    for to in ["s1", "s0"] {
        let second = allocator::shard::move_partition(&c.shards, 1, &s(to))
            .await
            .expect_err("a second mover ran");
        assert!(
            format!("{second:#}").contains("another mover"),
            "{second:#}"
        );
    }
    let abort = allocator::shard::abort_move(&c.shards, 1)
        .await
        .unwrap_err();
    assert!(format!("{abort:#}").contains("another mover"), "{abort:#}");
    let moved = first.await.unwrap().expect("the first mover finishes");
    assert_eq!(moved.attempt, 1);
    wait_owns(&c.r1, 1).await;
    c.r0.stop().await;
    c.r1.stop().await;
}

#[tokio::test]
async fn a_mover_killed_between_copy_and_retire_then_cancelled_leaves_no_target_lease_row() {
    let c = cluster("mvstate-killed").await;
    hold(&c.r0, 2, "killed").await;
    let epoch_before = lease_row(&c.db0, 2).await.unwrap().1;
    allocator::shard::move_partition_with(&c.shards, 2, &s("s1"), &stop_after(MoveState::Copied))
        .await
        .expect_err("stopped");
    // `allocator shards status` lists it: copied, attempt 1, no mover at work.
    let listed = allocator::shard::in_flight(&c.db0).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let m = &listed[0];
    assert_eq!((m.partition, m.state, m.attempt), (2, MoveState::Copied, 1));
    assert_eq!((m.from.as_str(), m.to.as_str()), ("s0", "s1"));
    assert!(!m.claimed, "no mover holds the claim");
    // Cancelling by moving it to the shard the map names is refused: the move is in flight.
    let back = allocator::shard::move_partition(&c.shards, 2, &s("s0"))
        .await
        .unwrap_err();
    assert!(format!("{back:#}").contains("--abort"), "{back:#}");
    allocator::shard::abort_move(&c.shards, 2)
        .await
        .expect("abort");
    assert_eq!(
        lease_row(&c.db1, 2).await,
        None,
        "a target lease row is left"
    );
    wait_owns_above(&c.r0, 2, epoch_before).await;
    c.r0.stop().await;
    c.r1.stop().await;
}

#[tokio::test]
async fn an_incoming_lease_row_that_expires_never_makes_the_target_campaign() {
    let c = cluster("mvstate-orphan").await;
    hold(&c.r0, 3, "orphan").await;
    allocator::shard::move_partition_with(&c.shards, 3, &s("s1"), &stop_after(MoveState::Copied))
        .await
        .expect_err("stopped");
    // The mover's hour on the target runs out (the mover is gone).
    c.db1
        .execute(
            "UPDATE leases SET expires_at = now() WHERE name = $1",
            &[&lease_name(3)],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !c.r1.ownership.held().iter().any(|t| t.partition == 3),
        "the target's allocator took a partition the map does not give its shard"
    );
    let (holder, _, incoming, _) = lease_row(&c.db1, 3).await.unwrap();
    assert!(incoming && holder.is_some_and(|h| h.starts_with("move/3/")));
    c.r0.stop().await;
    c.r1.stop().await;
}

#[tokio::test]
async fn an_id_on_both_shards_is_refused_before_the_fence() {
    let c = cluster("mvstate-ids").await;
    // One id on s0 in partition 0 and on s1 in partition 5 (each database accepts it).
    hold(&c.r0, 0, "both-sides").await;
    hold(&c.r1, 5, "both-sides").await;
    let refused = allocator::shard::move_partition(&c.shards, 0, &s("s1"))
        .await
        .unwrap_err();
    assert!(format!("{refused:#}").contains("both-sides"), "{refused:#}");
    // Nothing changed: r0 still holds the partition's lease on s0, no move is recorded.
    let (holder, ..) = lease_row(&c.db0, 0).await.unwrap();
    assert_eq!(holder.as_deref(), Some("r0"));
    assert_eq!(recorded(&c.db0, 0).await, None);
    assert_eq!(lease_row(&c.db1, 0).await, None);
    c.r0.stop().await;
    c.r1.stop().await;
}
