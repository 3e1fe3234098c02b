//! The relay's flags, flattened into `allocator serve`'s command line.

use std::num::NonZeroUsize;
use std::time::Duration;

use anyhow::{anyhow, bail};
use clap::Args;

/// `--events` with its variable, for refusals.
pub const EVENTS_FLAG: &str = "--events (ALLOCATOR_EVENTS)";

#[derive(Debug, Clone, Args)]
pub struct EventsArgs {
    /// Relay every ledger row and settled window to Redis Streams (`events:partition:P`,
    /// `events:settlement`, or `events:settlement:<shard>` off the catalog shard); needs
    /// `--redis-url`. Runs on the replica holding the job lease.
    #[arg(long, env = "ALLOCATOR_EVENTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub events: bool,
    /// Most entries the relay appends per stream per round.
    #[arg(long, env = "ALLOCATOR_EVENTS_BATCH", default_value_t = 500)]
    pub events_batch: usize,
    /// Approximate bound on each Redis stream's length (`XADD MAXLEN ~`); also how far back the
    /// relay republishes a stream Redis lost.
    #[arg(long, env = "ALLOCATOR_EVENTS_MAX_LEN", default_value_t = 100_000)]
    pub events_max_len: usize,
    /// Pause between relay rounds that found every stream caught up (a round that filled a
    /// stream's batch is followed at once, up to 50 in a row).
    #[arg(long, env = "ALLOCATOR_EVENTS_INTERVAL_MS", default_value_t = 100)]
    pub events_interval_ms: u64,
}

/// The change-event relay's validated settings (DESIGN.md §14).
#[derive(Debug, Clone)]
pub struct EventsConfig {
    pub batch: NonZeroUsize,
    pub max_len: NonZeroUsize,
    pub interval: Duration,
}

impl EventsArgs {
    /// `None` when `--events` is off; a zero count or interval is refused, naming the flag.
    pub fn validated(self) -> anyhow::Result<Option<EventsConfig>> {
        if !self.events {
            return Ok(None);
        }
        let count = |value: usize, flag: &str| {
            NonZeroUsize::new(value).ok_or_else(|| anyhow!("{flag} must be at least 1, got 0"))
        };
        if self.events_interval_ms == 0 {
            bail!("--events-interval-ms (ALLOCATOR_EVENTS_INTERVAL_MS) must be positive, got 0");
        }
        Ok(Some(EventsConfig {
            batch: count(self.events_batch, "--events-batch (ALLOCATOR_EVENTS_BATCH)")?,
            max_len: count(
                self.events_max_len,
                "--events-max-len (ALLOCATOR_EVENTS_MAX_LEN)",
            )?,
            interval: Duration::from_millis(self.events_interval_ms),
        }))
    }
}
