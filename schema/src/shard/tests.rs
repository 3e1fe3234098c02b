use super::*;

fn names(list: &[&str]) -> Vec<ShardName> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn names_parse_and_refuse() {
    assert_eq!("a-1_b".parse::<ShardName>().unwrap().as_str(), "a-1_b");
    for bad in ["", "-a", "_a", "A", "a b", "a/b", &"x".repeat(64)] {
        assert!(bad.parse::<ShardName>().is_err(), "{bad:?} accepted");
    }
}

#[test]
fn targets_parse_name_equals_url() {
    let t: ShardTarget = "b=postgres://h:1/db?x=y".parse().unwrap();
    assert_eq!(t.name.as_str(), "b");
    assert_eq!(t.url, "postgres://h:1/db?x=y");
    assert!("b".parse::<ShardTarget>().is_err());
    assert!("b=".parse::<ShardTarget>().is_err());
    assert!("B=postgres://h".parse::<ShardTarget>().is_err());
    let twice: Vec<ShardTarget> = vec!["a=u".parse().unwrap(), "a=v".parse().unwrap()];
    assert_eq!(
        target_names(&twice),
        Err(ShardError::Duplicate("a".to_owned()))
    );
    assert_eq!(target_names(&[]), Err(ShardError::Empty));
}

#[test]
fn plan_gives_contiguous_ranges_covering_every_partition() {
    let map = ShardMap::plan(names(&["a", "b", "c"]), 8).unwrap();
    assert_eq!(map.partitions_of(&"a".parse().unwrap()), vec![0, 1, 2]);
    assert_eq!(map.partitions_of(&"b".parse().unwrap()), vec![3, 4, 5]);
    assert_eq!(map.partitions_of(&"c".parse().unwrap()), vec![6, 7]);
    assert_eq!(map.shard_index(7), Some(2));
    assert_eq!(map.shard_index(8), None);
    let one = ShardMap::plan(vec![ShardName::default_shard()], 4).unwrap();
    assert_eq!(
        one.partitions_of(&ShardName::default_shard()),
        vec![0, 1, 2, 3]
    );
    assert!(matches!(
        ShardMap::plan(names(&["a", "b", "c"]), 2),
        Err(ShardError::TooManyShards { .. })
    ));
}

#[test]
fn rows_must_cover_every_partition_with_known_shards() {
    let rows = vec![(0, "a".parse().unwrap()), (1, "b".parse().unwrap())];
    let map = ShardMap::from_rows(names(&["a", "b"]), &rows, 2, 5).unwrap();
    assert_eq!(map.revision, 5);
    assert_eq!(map.shard_index(1), Some(1));
    assert_eq!(
        ShardMap::from_rows(names(&["a", "b"]), &rows, 3, 5),
        Err(ShardError::Unmapped(2))
    );
    assert_eq!(
        ShardMap::from_rows(names(&["a"]), &rows, 2, 5),
        Err(ShardError::UnknownShard("b".to_owned()))
    );
}

#[test]
fn a_record_that_disagrees_with_the_map_is_refused() {
    let map = ShardMap::plan(names(&["a", "b"]), 4).unwrap();
    let record = |shard: &str, partitions: Vec<u32>| ShardRecord {
        shard: shard.parse().unwrap(),
        catalog: false,
        partitions,
    };
    map.check_record(&record("b", vec![2, 3])).unwrap();
    // A partition the map places elsewhere, one missing, or a shard the map does not know.
    assert!(map.check_record(&record("b", vec![1, 2, 3])).is_err());
    assert!(map.check_record(&record("b", vec![3])).is_err());
    assert!(map.check_record(&record("c", vec![])).is_err());
}

#[test]
fn configured_shards_must_be_the_catalogs_in_order() {
    let map = ShardMap::plan(names(&["a", "b"]), 4).unwrap();
    map.check_shards(&names(&["a", "b"])).unwrap();
    assert!(map.check_shards(&names(&["b", "a"])).is_err());
    assert!(map.check_shards(&names(&["a"])).is_err());
}

#[test]
fn orders_spread_over_shards_by_their_id() {
    let mut seen = [0usize; 2];
    for i in 0..100 {
        seen[order_shard(&format!("order-{i}"), 2)] += 1;
    }
    assert!(seen[0] > 20 && seen[1] > 20, "{seen:?}");
    assert_eq!(order_shard("x", 1), 0);
}
