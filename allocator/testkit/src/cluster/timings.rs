//! Short lease timings and small pools for the allocators of a test cluster, so that a fault
//! outlasts a lease within seconds: the flags after an allocator's own.

/// The allocator flags a test cluster changes from their defaults.
#[derive(Debug, Clone, Copy)]
pub struct ShortTimings {
    pub lease_ttl_ms: u64,
    pub lease_margin_ms: u64,
    pub renew_interval_ms: u64,
    /// Also the expiry sweep's interval.
    pub campaign_interval_ms: u64,
    /// Also the idle-in-transaction timeout.
    pub statement_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub pool_size: u32,
    pub http_workers: u32,
}

impl ShortTimings {
    /// `--lease-ttl-ms …` and the rest, for [`super::ClusterBuilder::allocator_args`].
    pub fn args(&self) -> Vec<String> {
        [
            ("--lease-ttl-ms", self.lease_ttl_ms),
            ("--lease-margin-ms", self.lease_margin_ms),
            ("--renew-interval-ms", self.renew_interval_ms),
            ("--campaign-interval-ms", self.campaign_interval_ms),
            ("--expiry-interval-ms", self.campaign_interval_ms),
            ("--statement-timeout-ms", self.statement_timeout_ms),
            (
                "--idle-in-transaction-timeout-ms",
                self.statement_timeout_ms,
            ),
            ("--request-timeout-ms", self.request_timeout_ms),
            ("--pool-size", self.pool_size.into()),
            ("--http-workers", self.http_workers.into()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_owned(), value.to_string()])
        .collect()
    }
}
