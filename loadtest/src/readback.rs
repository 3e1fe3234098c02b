//! The end-of-run reads: inventories (the snapshot before the load and the state after it) and
//! the status of reservations whose outcome the client does not know or whose hold may have
//! expired meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use allocator_client::{Client, Error};
use futures::StreamExt;
use schema::wire::{Inventory, ReservationStatus};

use crate::iteration::sku_name;
use crate::stats::{SkuTally, Tracked};

/// GET /v1/inventory/{sku} with retries: `Ok(None)` for 404.
async fn fetch_inventory(api: &Client, sku: &str) -> Result<Option<Inventory>, String> {
    match api.inventory(sku).await {
        Ok(reply) => Ok(Some(reply.value)),
        Err(Error::NotFound(_)) => Ok(None),
        Err(error) => Err(format!("GET inventory {sku}: {error}")),
    }
}

pub type InventoryReads = BTreeMap<usize, Result<Option<Inventory>, String>>;

pub async fn fetch_inventories(
    api: &Client,
    prefix: &str,
    indexes: Vec<usize>,
    concurrency: usize,
) -> InventoryReads {
    futures::stream::iter(indexes)
        .map(|k| async move { (k, fetch_inventory(api, &sku_name(prefix, k)).await) })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// GET /v1/reservations/{id} for each: `Ok(None)` when nothing is held under the id (never
/// created: 404; refused for stock: 409).
pub async fn read_statuses(
    api: &Client,
    tracked: &[Tracked],
    concurrency: usize,
) -> Vec<Result<Option<ReservationStatus>, String>> {
    futures::stream::iter(tracked)
        .map(|t| async move {
            match api.reservation(&t.reservation_id).await {
                Ok(reply) => Ok(Some(reply.value.status)),
                Err(Error::NotFound(_) | Error::InsufficientStock(_) | Error::InvalidState(_)) => {
                    Ok(None)
                }
                Err(error) => Err(error.to_string()),
            }
        })
        .buffered(concurrency.max(1))
        .collect()
        .await
}

/// Read back holds the client counted as held: expired (or otherwise moved) ones are moved in
/// the tallies. Keeps the still-held ones in `held`; returns the SKUs that changed and the read
/// errors.
pub fn apply_readback(
    held: &mut Vec<Tracked>,
    statuses: Vec<Result<Option<ReservationStatus>, String>>,
    tallies: &mut BTreeMap<usize, SkuTally>,
) -> (BTreeSet<usize>, usize, Vec<String>) {
    let mut changed = BTreeSet::new();
    let mut expired = 0;
    let mut errors = Vec::new();
    let mut still = Vec::new();
    for (t, status) in std::mem::take(held).into_iter().zip(statuses) {
        match status {
            Ok(Some(ReservationStatus::Held)) => still.push(t),
            Ok(Some(moved)) => {
                if moved == ReservationStatus::Expired {
                    expired += 1;
                }
                tallies
                    .entry(t.sku_index)
                    .or_default()
                    .leave_held(moved, t.quantity);
                changed.insert(t.sku_index);
            }
            Ok(None) => errors.push(format!("hold {} is gone", t.reservation_id)),
            Err(e) => errors.push(format!("reading hold {}: {e}", t.reservation_id)),
        }
    }
    *held = still;
    (changed, expired, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked(id: &str, k: usize) -> Tracked {
        Tracked {
            reservation_id: id.into(),
            sku_index: k,
            quantity: 1,
        }
    }

    #[test]
    fn readback_moves_expired_holds_and_keeps_the_rest() {
        let mut tallies = BTreeMap::new();
        for k in [1, 2] {
            let t: &mut SkuTally = tallies.entry(k).or_default();
            t.account(ReservationStatus::Held, 1);
            t.account(ReservationStatus::Held, 1);
        }
        let mut held = vec![
            tracked("a", 1),
            tracked("b", 1),
            tracked("c", 2),
            tracked("d", 2),
        ];
        let statuses = vec![
            Ok(Some(ReservationStatus::Expired)),
            Ok(Some(ReservationStatus::Held)),
            Ok(Some(ReservationStatus::Held)),
            Err("HTTP 500".into()),
        ];
        let (changed, expired, errors) = apply_readback(&mut held, statuses, &mut tallies);
        assert_eq!(changed, BTreeSet::from([1]));
        assert_eq!(expired, 1);
        assert_eq!(errors.len(), 1);
        assert_eq!(held, vec![tracked("b", 1), tracked("c", 2)]);
        assert_eq!(tallies[&1].expired, 1);
        assert_eq!(tallies[&1].held(), 1);
        assert_eq!(tallies[&2].held(), 2);
    }
}
