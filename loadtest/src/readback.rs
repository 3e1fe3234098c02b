//! The end-of-run reads: inventories (the snapshot before the load and the state after it) and
//! the status of reservations whose outcome the client does not know or whose hold may have
//! expired meanwhile.

use std::collections::{BTreeMap, BTreeSet};

use futures::StreamExt;
use rand::rngs::StdRng;
use rand::SeedableRng;
use schema::path::encode_segment;
use schema::wire::{Inventory, Reservation, ReservationStatus};

use crate::client::{Api, Final};
use crate::iteration::sku_name;
use crate::stats::{SkuTally, Tracked};

/// GET /v1/inventory/{sku} with retries: `Ok(None)` for 404.
async fn fetch_inventory(api: &Api, sku: &str, seed: u64) -> Result<Option<Inventory>, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let path = format!("/v1/inventory/{}", encode_segment(sku));
    match api.get(&path, &mut rng).await {
        Final::Answer { status: 200, body } => serde_json::from_slice::<Inventory>(&body)
            .map(Some)
            .map_err(|e| format!("GET inventory {sku}: unparsable body: {e}")),
        Final::Answer { status: 404, .. } => Ok(None),
        Final::Answer { status, body } => Err(format!(
            "GET inventory {sku}: HTTP {status}: {}",
            String::from_utf8_lossy(&body)
        )),
        Final::GaveUp { cause } => Err(format!("GET inventory {sku}: gave up ({cause})")),
    }
}

pub type InventoryReads = BTreeMap<usize, Result<Option<Inventory>, String>>;

pub async fn fetch_inventories(
    api: &Api,
    prefix: &str,
    indexes: Vec<usize>,
    concurrency: usize,
) -> InventoryReads {
    futures::stream::iter(indexes)
        .map(|k| async move {
            (
                k,
                fetch_inventory(api, &sku_name(prefix, k), k as u64).await,
            )
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await
}

/// GET /v1/reservations/{id} for each: `Ok(None)` when nothing is held under the id (never
/// created: 404; refused for stock: 409).
pub async fn read_statuses(
    api: &Api,
    tracked: &[Tracked],
    concurrency: usize,
) -> Vec<Result<Option<ReservationStatus>, String>> {
    futures::stream::iter(tracked.iter().enumerate())
        .map(|(i, t)| async move {
            let mut rng = StdRng::seed_from_u64(i as u64);
            let path = format!("/v1/reservations/{}", encode_segment(&t.reservation_id));
            match api.get(&path, &mut rng).await {
                Final::Answer { status: 200, body } => serde_json::from_slice::<Reservation>(&body)
                    .map(|r| Some(r.status))
                    .map_err(|e| e.to_string()),
                Final::Answer {
                    status: 404 | 409, ..
                } => Ok(None),
                Final::Answer { status, .. } => Err(format!("HTTP {status}")),
                Final::GaveUp { cause } => Err(format!("gave up ({cause})")),
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
