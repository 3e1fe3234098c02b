//! What the cluster says about itself: Patroni's `GET /cluster` and the leader's
//! `pg_stat_replication`, and waiting (with a deadline) until it says what a test needs.

use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use serde::Deserialize;

use super::{connect, PatroniCluster, REQUEST_TIMEOUT};

/// One member as Patroni's `GET /cluster` lists it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Member {
    pub name: String,
    /// `leader`, `sync_standby` or `replica`.
    pub role: String,
    /// `running`, `starting`, `stopped`, `crashed`, `creating replica`, ...
    pub state: String,
    #[serde(default)]
    pub port: Option<u16>,
    #[serde(default)]
    pub timeline: Option<i64>,
    /// Bytes behind the leader, or `"unknown"`.
    #[serde(default)]
    pub lag: Option<serde_json::Value>,
}

impl PatroniCluster {
    /// The members as the first node that answers `GET /cluster` sees them.
    pub async fn members(&self) -> Result<Vec<Member>> {
        #[derive(Deserialize)]
        struct ClusterJson {
            members: Vec<Member>,
        }
        let mut last = anyhow!("no node to ask");
        for node in &self.nodes {
            let url = format!("http://127.0.0.1:{}/cluster", node.api_port);
            match self.http.get(&url).send().await {
                Ok(response) => match response.json::<ClusterJson>().await {
                    Ok(cluster) => return Ok(cluster.members),
                    Err(e) => last = anyhow!("{url}: {e}"),
                },
                Err(e) => last = anyhow!("{url}: {e}"),
            }
        }
        Err(last)
    }

    /// The leader, which must be running.
    pub async fn leader(&self) -> Result<Member> {
        let members = self.members().await?;
        members
            .into_iter()
            .find(|m| m.role == "leader" && m.state == "running")
            .ok_or_else(|| anyhow!("no running leader"))
    }

    /// `Ok` when node `i`'s agent answers `GET /primary` with 200 (it leads and its server runs).
    pub(super) async fn primary_api(&self, i: usize) -> Result<()> {
        let url = format!("http://127.0.0.1:{}/primary", self.nodes[i].api_port);
        let status = self.http.get(&url).send().await?.status();
        if status.is_success() {
            Ok(())
        } else {
            bail!("{url} answered {status}")
        }
    }

    /// Waits until the cluster is whole: a running leader, every other node running on the
    /// leader's timeline and streaming from it (`pg_stat_replication`), one of them synchronous.
    /// Returns the members then.
    pub async fn wait_healthy(&self, timeout: Duration) -> Result<Vec<Member>> {
        self.wait_for(timeout, "the cluster to be healthy", |c| async move {
            c.healthy().await
        })
        .await
    }

    async fn healthy(&self) -> Result<Vec<Member>> {
        let members = self.members().await?;
        if members.len() != self.nodes.len() {
            bail!(
                "{} of {} members registered",
                members.len(),
                self.nodes.len()
            );
        }
        let leader = members
            .iter()
            .find(|m| m.role == "leader" && m.state == "running")
            .ok_or_else(|| anyhow!("no running leader: {members:?}"))?;
        if !members.iter().any(|m| m.role == "sync_standby") {
            bail!("no synchronous standby: {members:?}");
        }
        let client = connect(&self.node(&leader.name)?.url_for("postgres")).await?;
        let streaming: Vec<String> = client
            .query(
                "SELECT application_name FROM pg_stat_replication WHERE state = 'streaming'",
                &[],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        for member in members.iter().filter(|m| m.name != leader.name) {
            if member.state != "running" || member.timeline != leader.timeline {
                bail!(
                    "{} is not a running replica on the leader's timeline: {members:?}",
                    member.name
                );
            }
            if !streaming.contains(&member.name) {
                bail!(
                    "{} does not stream from {} ({streaming:?})",
                    member.name,
                    leader.name
                );
            }
        }
        Ok(members)
    }

    /// Polls `check` every 200 ms until it succeeds or `timeout` passes; the error names what
    /// was awaited, the last failure and the agents' log tails.
    pub async fn wait_for<'a, T, F, Fut>(
        &'a self,
        timeout: Duration,
        what: &str,
        check: F,
    ) -> Result<T>
    where
        F: Fn(&'a PatroniCluster) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + 'a,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match tokio::time::timeout(REQUEST_TIMEOUT * 2, check(self)).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(e)) => format!("{e:#}"),
                Err(_) => "check timed out".to_owned(),
            };
            if Instant::now() >= deadline {
                bail!(
                    "waited {timeout:?} for {what}; last: {last}\n{}",
                    self.log_tails(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last `n` lines of every agent's log.
    pub fn log_tails(&self, n: usize) -> String {
        self.nodes
            .iter()
            .map(|node| format!("--- {} ---\n{}\n", node.name, node.log_tail(n)))
            .collect()
    }
}
