//! Unit tests of the placement and of the routing view over several shards.

use super::*;
use crate::assignment_cache::MapSlot;

pub(crate) fn names(list: &[&str]) -> Vec<ShardName> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// A read of one shard holding `partitions` (each owned by `owner` at epoch 1), of a cluster of
/// `count` partitions.
pub(crate) fn shard_read(
    revision: i64,
    read_seq: u64,
    count: u32,
    partitions: &[u32],
    owner: Option<&str>,
) -> RoutingMap {
    RoutingMap {
        map: PartitionMap {
            partition_count: count,
            revision,
            partitions: partitions
                .iter()
                .map(|p| PartitionAssignment {
                    partition: *p,
                    owner_id: owner.map(str::to_owned),
                    owner_url: owner.map(|o| format!("http://{o}/")),
                    epoch: 1,
                    revision,
                    lease_remaining_ms: owner.map(|_| 1000),
                })
                .collect(),
        },
        read_seq,
    }
}

/// Four partitions, 0–1 on `a`, 2–3 on `b`.
fn two_shards() -> Placement {
    Placement::from_catalog(
        Some(ShardMap::plan(names(&["a", "b"]), 4).unwrap()),
        &names(&["a", "b"]),
    )
}

#[test]
fn the_catalog_must_name_the_configured_shards() {
    let configured = names(&["a", "b"]);
    assert!(matches!(two_shards(), Placement::Mapped(_)));
    // Other names, another order, a missing shard: refused, with the reason.
    for catalog in [&["a", "c"][..], &["b", "a"], &["a"]] {
        let map = ShardMap::plan(names(catalog), 4).unwrap();
        let placement = Placement::from_catalog(Some(map), &configured);
        let problem = placement.problem().unwrap().to_owned();
        assert!(problem.contains("configured"), "{problem}");
    }
    // Several shards need a map; one database may predate shard maps.
    assert!(Placement::from_catalog(None, &configured)
        .problem()
        .is_some());
    let main = names(&["main"]);
    assert!(matches!(
        Placement::from_catalog(None, &main),
        Placement::Single
    ));
    let one = ShardMap::plan(main.clone(), 4).unwrap();
    assert!(matches!(
        Placement::from_catalog(Some(one), &main),
        Placement::Single
    ));
    assert!(Placement::Unread.problem().is_some());
}

#[test]
fn nothing_is_routed_by_an_unread_or_refused_placement() {
    let reads = || {
        vec![
            Some(Arc::new(shard_read(1, 1, 4, &[0, 1], Some("x")))),
            None,
        ]
    };
    assert!(ClusterMap::compose(&Placement::Unread, reads()).is_none());
    let refused = Placement::Refused("other shards".to_owned());
    assert!(ClusterMap::compose(&refused, reads()).is_none());
    // Nor before any shard has been read.
    assert!(ClusterMap::compose(&two_shards(), vec![None, None]).is_none());
    assert!(ClusterMap::compose(&two_shards(), reads()).is_some());
}

#[test]
fn a_partition_is_routed_by_its_own_shard_and_revision() {
    let a = Arc::new(shard_read(40, 1, 4, &[0, 1], Some("x")));
    let b = Arc::new(shard_read(3, 2, 4, &[2, 3], Some("y")));
    let view = ClusterMap::compose(&two_shards(), vec![Some(a), Some(b)]).unwrap();
    assert_eq!(view.partition_count(), 4);
    assert_eq!(view.shard_of(1), Some(0));
    assert_eq!(view.shard_of(2), Some(1));
    let d0 = view.destination(0).unwrap();
    assert_eq!((d0.owner_id.as_str(), d0.map_revision), ("x", 40));
    // The revision sent with a request is its shard's, never the other shard's higher one.
    let d3 = view.destination(3).unwrap();
    assert_eq!((d3.owner_id.as_str(), d3.map_revision), ("y", 3));
    assert!(view.destination(4).is_none());
    // The merged map: partition order, the highest revision as a summary.
    let merged = view.merged();
    assert_eq!(merged.revision, 40);
    let order: Vec<u32> = merged.partitions.iter().map(|p| p.partition).collect();
    assert_eq!(order, [0, 1, 2, 3]);
    assert_eq!(merged.partitions[2].revision, 3);
}

#[test]
fn a_shard_not_read_leaves_only_its_own_partitions_without_owner() {
    let a = Arc::new(shard_read(5, 1, 4, &[0, 1], Some("x")));
    let view = ClusterMap::compose(&two_shards(), vec![Some(a), None]).unwrap();
    assert!(view.destination(0).is_some() && view.destination(1).is_some());
    assert!(view.destination(2).is_none() && view.destination(3).is_none());
    assert_eq!(view.unread_shards(), [1]);
    assert_eq!(view.merged().partitions.len(), 2);
    assert_eq!(view.revision(), 5);
}

#[test]
fn a_shard_never_routes_a_partition_the_catalog_places_elsewhere() {
    // A read of `b` that still shows partition 1 (moved away, or a stale record) is not used
    // for it: the catalog says partition 1 is on `a`.
    let a = Arc::new(shard_read(5, 1, 4, &[0], Some("x")));
    let b = Arc::new(shard_read(9, 2, 4, &[1, 2, 3], Some("y")));
    let view = ClusterMap::compose(&two_shards(), vec![Some(a), Some(b)]).unwrap();
    assert!(view.destination(1).is_none());
    assert_eq!(view.destination(2).unwrap().owner_id, "y");
}

#[test]
fn each_shard_slot_is_ordered_by_its_own_revision() {
    let slots = [MapSlot::default(), MapSlot::default()];
    assert!(matches!(
        slots[0].offer(shard_read(40, 1, 4, &[0, 1], Some("x"))),
        crate::assignment_cache::Offer::Accepted { .. }
    ));
    // Shard b's revision 3 is far below a's 40, and still accepted: its own sequence.
    assert!(matches!(
        slots[1].offer(shard_read(3, 2, 4, &[2, 3], Some("y"))),
        crate::assignment_cache::Offer::Accepted { .. }
    ));
    // Within one shard the rules hold: an older revision never replaces a newer one, and an
    // equal revision needs a later read.
    assert!(matches!(
        slots[1].offer(shard_read(2, 3, 4, &[2, 3], Some("z"))),
        crate::assignment_cache::Offer::Stale { current: 3 }
    ));
    assert!(matches!(
        slots[1].offer(shard_read(3, 4, 4, &[2, 3], None)),
        crate::assignment_cache::Offer::Accepted { .. }
    ));
    let view =
        ClusterMap::compose(&two_shards(), slots.iter().map(MapSlot::get).collect()).unwrap();
    assert_eq!(view.destination(0).unwrap().map_revision, 40);
    // The expiry seen by b's later read at the same revision is what is routed by.
    assert!(view.destination(2).is_none());
}

#[test]
fn one_shard_routes_as_one_database() {
    let main = Arc::new(shard_read(7, 1, 3, &[0, 1, 2], Some("x")));
    let view = ClusterMap::compose(&Placement::Single, vec![Some(main)]).unwrap();
    assert_eq!(view.partition_count(), 3);
    assert_eq!(view.revision(), 7);
    assert_eq!(view.shard_of(2), Some(0));
    assert_eq!(view.shard_of(3), None);
    assert_eq!(view.destination(2).unwrap().map_revision, 7);
    assert!(view.unread_shards().is_empty());
}
