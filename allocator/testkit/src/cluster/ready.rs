//! Waiting for a cluster: every process answers `/readyz`, every partition has a live owner.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use schema::wire::PartitionMap;

use super::Cluster;

impl Cluster {
    /// Waits until every running service answers `/readyz` with 200 and, with `whole_map`, every
    /// partition is owned by a running allocator under an unexpired lease. Fails at once when a
    /// process exits, with its log tail.
    pub async fn wait_ready(&mut self, timeout: Duration, whole_map: bool) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        loop {
            let mut waiting = Vec::new();
            for service in self.services() {
                let Some(process) = service.process.as_mut() else {
                    continue;
                };
                if let Some(status) = process.try_exit_status()? {
                    bail!(
                        "{} exited with {status} while the cluster started:\n{}",
                        service.id,
                        process.log_tail(20)
                    );
                }
                let ready = http
                    .get(format!("http://127.0.0.1:{}/readyz", service.port))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                if !ready {
                    waiting.push(service.id.clone());
                }
            }
            let owners: Vec<String> = self.allocators.iter().map(|a| a.id.clone()).collect();
            let map = match whole_map {
                true => Some(self.map().await.ok()),
                false => None,
            };
            let unowned = map.as_ref().map(|m| match m {
                Some(m) => unowned(m, self.partitions, &owners),
                None => self.partitions as usize,
            });
            if waiting.is_empty() && unowned.is_none_or(|n| n == 0) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "cluster not ready within {timeout:?}: not ready {waiting:?}; partitions \
                     without a live owner: {}; logs in {}",
                    unowned.map_or("not checked".to_owned(), |n| n.to_string()),
                    self.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until `pred` holds for the database's partition map and returns that map.
    pub async fn wait_map_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&PartitionMap) -> bool,
    ) -> Result<PartitionMap> {
        let deadline = Instant::now() + timeout;
        let client = self.db().await?;
        loop {
            let map = match self.shard_count() {
                1 => schema::assignment::read_map(&client).await?,
                _ => self.map().await?,
            };
            if pred(&map) {
                return Ok(map);
            }
            if Instant::now() > deadline {
                bail!(
                    "map condition not reached within {timeout:?}: {:?}; logs in {}",
                    map.partitions
                        .iter()
                        .map(|p| (p.partition, p.owner_id.clone()))
                        .collect::<Vec<_>>(),
                    self.log_dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Partitions of `0..partitions` that no one of `owners` holds under an unexpired lease.
pub fn unowned(map: &PartitionMap, partitions: u32, owners: &[String]) -> usize {
    (0..partitions)
        .filter(|n| {
            !map.partitions.iter().any(|p| {
                p.partition == *n
                    && p.lease_remaining_ms.is_some()
                    && p.owner_id.as_ref().is_some_and(|o| owners.contains(o))
            })
        })
        .count()
}

#[cfg(test)]
mod tests {
    use schema::wire::PartitionAssignment;

    use super::*;

    fn map(owners: &[(Option<&str>, Option<i64>)]) -> PartitionMap {
        PartitionMap {
            partition_count: owners.len() as u32,
            revision: 1,
            partitions: owners
                .iter()
                .enumerate()
                .map(|(i, (owner, left))| PartitionAssignment {
                    partition: i as u32,
                    owner_id: owner.map(str::to_owned),
                    owner_url: None,
                    epoch: 1,
                    revision: 1,
                    lease_remaining_ms: *left,
                })
                .collect(),
        }
    }

    #[test]
    fn a_partition_counts_as_owned_only_by_a_known_owner_under_a_live_lease() {
        let owners = ["a".to_owned(), "b".to_owned()];
        let m = map(&[
            (Some("a"), Some(100)),
            (Some("b"), None),
            (Some("gone"), Some(100)),
            (None, None),
        ]);
        assert_eq!(unowned(&m, 4, &owners), 3);
        assert_eq!(unowned(&m, 1, &owners), 0);
        // A partition missing from the map is unowned.
        assert_eq!(unowned(&map(&[]), 2, &owners), 2);
    }
}
