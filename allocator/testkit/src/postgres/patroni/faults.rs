//! The faults operators meet: a crashed postmaster, a planned switchover (`patronictl`), a frozen
//! Patroni agent, and a node cut off from etcd.

use anyhow::{anyhow, bail, Context, Result};
use nix::sys::signal::Signal;

use super::{patroni_bin, PatroniCluster, PATRONICTL_TIMEOUT};
use crate::procfs;
use crate::proxy::ProxyMode;

impl PatroniCluster {
    /// `SIGKILL`s the postmaster of node `name` (only the postmaster: its backends notice and
    /// exit, as after a crash). Returns the killed pid.
    pub fn kill_postmaster(&self, name: &str) -> Result<i32> {
        let pm = self
            .node(name)?
            .postmaster()
            .ok_or_else(|| anyhow!("{name} has no running postmaster"))?;
        procfs::signal(&pm, Signal::SIGKILL);
        Ok(pm.pid)
    }

    /// Runs `patronictl -c <config> <args...>` (bounded by 60 s) and returns its output.
    pub async fn patronictl(&self, args: &[&str]) -> Result<String> {
        let mut cmd = tokio::process::Command::new(patroni_bin("patronictl"));
        cmd.arg("-c")
            .arg(&self.nodes[0].config_path)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(PATRONICTL_TIMEOUT, cmd.output())
            .await
            .map_err(|_| {
                anyhow!("patronictl {args:?} did not finish within {PATRONICTL_TIMEOUT:?}")
            })?
            .context("running patronictl")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            bail!("patronictl {args:?} failed with {}:\n{text}", out.status);
        }
        Ok(text)
    }

    /// A planned switchover from `leader` to `candidate`, as an operator runs it
    /// (`patronictl switchover --force`).
    pub async fn switchover(&self, leader: &str, candidate: &str) -> Result<String> {
        let scope = self.scope.clone();
        self.patronictl(&[
            "switchover",
            &scope,
            "--leader",
            leader,
            "--candidate",
            candidate,
            "--force",
        ])
        .await
    }

    /// Freezes node `name`'s Patroni agent (`SIGSTOP`): its PostgreSQL runs on, but nothing
    /// renews its leader key or acts on the cluster's state, like a stalled agent or a paused VM
    /// that spared the database. A frozen leader loses its key after `ttl`.
    pub fn freeze_agent(&mut self, name: &str) -> Result<()> {
        let node = self.node_mut(name)?;
        node.agent
            .as_mut()
            .ok_or_else(|| anyhow!("{name}'s agent is not running"))?
            .sigstop()
    }

    /// Undoes [`PatroniCluster::freeze_agent`].
    pub fn thaw_agent(&mut self, name: &str) -> Result<()> {
        let node = self.node_mut(name)?;
        node.agent
            .as_mut()
            .ok_or_else(|| anyhow!("{name}'s agent is not running"))?
            .sigcont()
    }

    /// Cuts node `name`'s agent off from every etcd member (a network partition: its requests
    /// go unanswered, open connections are reset). Its PostgreSQL stays reachable to clients and
    /// to the other nodes. Needs [`super::PatroniOptions::etcd_proxies`].
    pub fn cut_from_etcd(&self, name: &str) -> Result<()> {
        let node = self.node(name)?;
        if node.etcd_proxies.is_empty() {
            bail!("{name} reaches etcd directly; start the cluster with etcd_proxies");
        }
        for proxy in &node.etcd_proxies {
            proxy.set_mode(ProxyMode::Blackhole);
            proxy.cut_all();
        }
        Ok(())
    }

    /// Undoes [`PatroniCluster::cut_from_etcd`].
    pub fn reconnect_etcd(&self, name: &str) -> Result<()> {
        for proxy in &self.node(name)?.etcd_proxies {
            proxy.set_mode(ProxyMode::Pass);
        }
        Ok(())
    }
}
