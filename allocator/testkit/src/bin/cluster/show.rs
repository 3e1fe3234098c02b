//! `status` and `map`: what a running cluster's processes and servers say.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use schema::wire::PartitionMap;

use crate::state;
use crate::ShowArgs;

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("http client")
}

/// The HTTP status of `GET url/readyz`, 0 when nothing answered.
async fn readyz(url: &str) -> u16 {
    match http().get(format!("{url}/readyz")).send().await {
        Ok(r) => r.status().as_u16(),
        Err(_) => 0,
    }
}

/// A router (else an allocator) that answers `/readyz`.
async fn first_ready(dir: &Path) -> Option<String> {
    let mut recorded = state::recorded(dir);
    recorded.sort_by_key(|r| !r.name.starts_with("router-"));
    for r in recorded {
        if let Some(url) = r.url {
            if readyz(&url).await == 200 {
                return Some(url);
            }
        }
    }
    None
}

async fn fetch_map(url: &str, token: Option<&str>) -> Result<PartitionMap> {
    let mut request = http().get(format!("{url}/v1/partitions"));
    if let Some(token) = token.filter(|t| !t.is_empty()) {
        request = request.bearer_auth(token);
    }
    let response = request.send().await?;
    if !response.status().is_success() {
        bail!("GET {url}/v1/partitions answered {}", response.status());
    }
    Ok(response.json().await?)
}

/// The ownership map: a line of totals, a table four partitions wide, partitions per owner.
pub fn format_map(map: &PartitionMap) -> String {
    let mut parts = map.partitions.clone();
    parts.sort_by_key(|p| p.partition);
    let unowned = parts.iter().filter(|p| p.owner_id.is_none()).count();
    let mut out = format!(
        "partition_count {}  revision {}  unowned {unowned}\n",
        map.partition_count, map.revision
    );
    let cell = |a: &str, b: &str, c: &str, d: &str| format!("{a:>4} {b:<10} {c:>5} {d:>6}");
    let cols = parts.len().clamp(1, 4);
    let header = vec![cell("part", "owner", "epoch", "lease"); cols];
    out.push_str(&header.join(" | "));
    out.push('\n');
    for row in parts.chunks(4) {
        let cells: Vec<String> = row
            .iter()
            .map(|p| {
                cell(
                    &p.partition.to_string(),
                    p.owner_id.as_deref().unwrap_or("-"),
                    &p.epoch.to_string(),
                    &p.lease_remaining_ms
                        .map_or("-".to_owned(), |ms| format!("{}s", ms / 1000)),
                )
            })
            .collect();
        out.push_str(&cells.join(" | "));
        out.push('\n');
    }
    let mut owners: Vec<(String, Vec<u32>)> = Vec::new();
    for p in &parts {
        let owner = p.owner_id.clone().unwrap_or_else(|| "(none)".to_owned());
        match owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, list)) => list.push(p.partition),
            None => owners.push((owner, vec![p.partition])),
        }
    }
    owners.sort();
    for (owner, list) in owners {
        let list: Vec<String> = list.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "  {owner}: {} partitions [{}]\n",
            list.len(),
            list.join(",")
        ));
    }
    out
}

pub async fn map(dir: &Path, args: &ShowArgs) -> Result<i32> {
    let url = first_ready(dir)
        .await
        .context("no router or allocator answers /readyz")?;
    print!(
        "{}",
        format_map(&fetch_map(&url, args.token.as_deref()).await?)
    );
    Ok(0)
}

/// Processes, servers and the map; with `services_only` only the servers. 1 when anything is
/// down.
pub async fn status(dir: &Path, args: &ShowArgs, services_only: bool) -> Result<i32> {
    let mut rc = services(dir).await;
    if services_only {
        return Ok(rc);
    }
    println!();
    println!("{:<9} {:<7} {:<24} readyz", "name", "pid", "url");
    let recorded = state::recorded(dir);
    for r in &recorded {
        let url = r.url.clone().unwrap_or_default();
        let (pid, code) = if r.alive() {
            (r.pid.to_string(), readyz(&url).await.to_string())
        } else {
            rc = 1;
            ("dead".to_owned(), "-".to_owned())
        };
        println!("{:<9} {pid:<7} {url:<24} {code}", r.name);
    }
    if recorded.is_empty() {
        println!("(no cluster processes recorded; run ops/cluster.sh up)");
        rc = 1;
    }
    println!();
    match first_ready(dir).await {
        Some(url) => match fetch_map(&url, args.token.as_deref()).await {
            Ok(m) => print!("{}", format_map(&m)),
            Err(e) => {
                println!("ownership map: {e:#}");
                rc = 1;
            }
        },
        None => {
            println!("ownership map: nothing answers /readyz");
            rc = 1;
        }
    }
    Ok(rc)
}

/// PostgreSQL and Redis of the env file, and whether they answer: 1 when not.
async fn services(dir: &Path) -> i32 {
    let mut rc = 0;
    match (
        state::env_value(dir, "DATABASE_URL"),
        state::env_value(dir, "REDIS_URL"),
    ) {
        (Some(db), Some(redis)) => {
            let pg_up = tokio::time::timeout(
                Duration::from_secs(3),
                tokio_postgres::connect(&db, tokio_postgres::NoTls),
            )
            .await
            .is_ok_and(|r| r.is_ok());
            let (host, port) = redis
                .trim_start_matches("redis://")
                .trim_end_matches('/')
                .rsplit_once(':')
                .unwrap_or(("127.0.0.1", "6379"));
            let redis_up = testkit::redis::answers_ping(host, port.parse().unwrap_or(6379)).await;
            let word = |up: bool| if up { "up" } else { "DOWN" };
            let mode = |key| state::env_value(dir, key).unwrap_or_else(|| "?".to_owned());
            println!(
                "postgresql  {:<16} {:<4} {db}",
                mode("CLUSTER_PG_MODE"),
                word(pg_up)
            );
            println!(
                "redis       {:<16} {:<4} {redis}",
                mode("CLUSTER_REDIS_MODE"),
                word(redis_up)
            );
            if !(pg_up && redis_up) {
                rc = 1;
            }
        }
        _ => {
            println!("services: not up (no {})", dir.join("env").display());
            rc = 1;
        }
    }
    rc
}

#[cfg(test)]
mod tests {
    use schema::wire::PartitionAssignment;

    use super::*;

    #[test]
    fn the_map_lists_every_partition_and_each_owners_share() {
        let p = |partition, owner: Option<&str>, left| PartitionAssignment {
            partition,
            owner_id: owner.map(str::to_owned),
            owner_url: None,
            epoch: 3,
            revision: 7,
            lease_remaining_ms: left,
        };
        let map = PartitionMap {
            partition_count: 5,
            revision: 7,
            partitions: vec![
                p(4, Some("alloc-2"), Some(1900)),
                p(0, Some("alloc-1"), Some(2500)),
                p(1, None, None),
                p(2, Some("alloc-1"), Some(900)),
                p(3, Some("alloc-2"), Some(100)),
            ],
        };
        let text = format_map(&map);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "partition_count 5  revision 7  unowned 1");
        assert_eq!(lines[1].matches("part").count(), 4);
        assert!(
            lines[2].starts_with("   0 alloc-1        3     2s |    1 -"),
            "{text}"
        );
        assert!(lines[3].starts_with("   4 alloc-2"), "{text}");
        assert_eq!(
            &lines[4..],
            [
                "  (none): 1 partitions [1]",
                "  alloc-1: 2 partitions [0,2]",
                "  alloc-2: 2 partitions [3,4]"
            ]
        );
    }
}
