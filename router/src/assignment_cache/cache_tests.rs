//! Unit tests of the cache's per-shard bookkeeping, against shards that cannot be reached (the
//! reads against live databases are the integration tests').

use std::time::{Duration, Instant};

use schema::shard::{ShardMap, ShardTarget};

use super::*;
use crate::assignment_cache::view::tests::{names, shard_read};
use crate::config::RouterConfig;

/// A cache over `shards`, every one at a port nothing listens on.
fn unreachable(shards: &[&str]) -> AssignmentCache {
    let mut config = RouterConfig::new("postgres://postgres@127.0.0.1:1/x");
    config.db_timeout = Duration::from_millis(500);
    let pools = names(shards)
        .into_iter()
        .map(|name| {
            let target = ShardTarget {
                name: name.clone(),
                url: "postgres://postgres@127.0.0.1:1/x".to_owned(),
            };
            (name, db::ShardDb::new(&config, &target).unwrap().pool)
        })
        .collect();
    AssignmentCache::with_shards(pools, config.db_timeout)
}

#[tokio::test]
async fn a_failed_refresh_keeps_every_shard_map_and_the_placement() {
    let cache = unreachable(&["a", "b"]);
    assert!(cache.current().is_none());
    assert_eq!(cache.shard_of(0), None);
    let map = ShardMap::plan(names(&["a", "b"]), 4).unwrap();
    cache.set_placement(Placement::from_catalog(Some(map), cache.shard_names()));
    // Placed, but no shard read yet: still nothing to route by.
    assert!(cache.current().is_none());
    assert_eq!(cache.shard_of(3), Some(1));
    cache.install(
        1,
        shard_read(3, 1, 4, &[2, 3], Some("y")),
        RefreshCause::Poll,
    );
    let view = cache.current().unwrap();
    assert!(view.destination(0).is_none());
    assert_eq!(view.destination(2).unwrap().owner_id, "y");
    cache.install(
        0,
        shard_read(40, 2, 4, &[0, 1], Some("x")),
        RefreshCause::Poll,
    );
    // An older read of shard b never replaces its newer one, whatever shard a's revision.
    cache.install(
        1,
        shard_read(2, 3, 4, &[2, 3], Some("z")),
        RefreshCause::Poll,
    );
    let view = cache.current().unwrap();
    assert_eq!(view.destination(2).unwrap().owner_id, "y");
    assert_eq!(view.destination(0).unwrap().map_revision, 40);

    // Every read fails (nothing listens), within the timeout: the last maps and the last
    // placement stay.
    let started = Instant::now();
    let result = cache.refresh(RefreshCause::Poll, Instant::now()).await;
    assert!(result.is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
    let view = cache.current().unwrap();
    assert_eq!(view.destination(0).unwrap().owner_id, "x");
    assert_eq!(view.destination(2).unwrap().owner_id, "y");
    assert!(matches!(cache.placement(), Placement::Mapped(_)));
    let result = cache
        .refresh_partition(2, RefreshCause::Misdirected, Instant::now())
        .await;
    assert!(result.is_err());
    assert!(cache.current().is_some());
}

#[tokio::test]
async fn a_catalog_naming_other_shards_stops_routing() {
    let cache = unreachable(&["a", "b"]);
    let agreeing = ShardMap::plan(names(&["a", "b"]), 4).unwrap();
    cache.set_placement(Placement::from_catalog(Some(agreeing), cache.shard_names()));
    cache.install(
        0,
        shard_read(4, 1, 4, &[0, 1], Some("x")),
        RefreshCause::Poll,
    );
    assert!(cache.current().is_some());
    let other = ShardMap::plan(names(&["a", "c"]), 4).unwrap();
    cache.set_placement(Placement::from_catalog(Some(other), cache.shard_names()));
    assert!(cache.current().is_none());
    assert!(cache.placement().problem().is_some());
    assert_eq!(cache.shard_of(0), None);
}

#[tokio::test]
async fn coalesced_waiters_do_not_read_again() {
    let cache = unreachable(&["main"]);
    let before = Instant::now();
    // The first read fails; a waiter asking for a read started after `before` is satisfied by
    // it and sees no error of its own.
    assert!(cache.refresh(RefreshCause::Poll, before).await.is_err());
    assert!(cache.refresh(RefreshCause::Poll, before).await.is_ok());
    assert!(cache
        .refresh_shards(&[0], RefreshCause::Hint, before)
        .await
        .is_ok());
    // A fresher demand reads again (and fails again).
    assert!(cache
        .refresh(RefreshCause::Poll, Instant::now())
        .await
        .is_err());
}
