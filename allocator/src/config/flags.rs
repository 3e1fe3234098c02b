//! The serve command's flags, named in refusals as `--flag (VARIABLE)`. Each is looked up by
//! its field in [`ServeArgs`], so the name and the variable are clap's, never restated here;
//! the few another crate takes as text are checked against clap by a test.

use clap::{Args, Command};

use super::ServeArgs;

/// A `serve` flag, by the [`ServeArgs`] field that holds it, for error messages.
pub(super) struct Flag(&'static str);

impl std::fmt::Display for Flag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let command = ServeArgs::augment_args(Command::new("serve"));
        let Some(arg) = command
            .get_arguments()
            .find(|arg| arg.get_id().as_str() == self.0)
        else {
            return write!(f, "{}", self.0);
        };
        write!(f, "--{}", arg.get_long().unwrap_or(self.0))?;
        match arg.get_env() {
            Some(env) => write!(f, " ({})", env.to_string_lossy()),
            None => Ok(()),
        }
    }
}

pub(super) const LEASE_TTL: Flag = Flag("lease_ttl_ms");
pub(super) const RENEW_INTERVAL: Flag = Flag("renew_interval_ms");
pub(super) const LEASE_MARGIN: Flag = Flag("lease_margin_ms");
pub(super) const CAMPAIGN_INTERVAL: Flag = Flag("campaign_interval_ms");
pub(super) const POOL_SIZE: Flag = Flag("pool_size");
pub(super) const POOL_WAIT: Flag = Flag("pool_wait_ms");
pub(super) const STATEMENT_TIMEOUT: Flag = Flag("statement_timeout_ms");
pub(super) const IDLE_IN_TX_TIMEOUT: Flag = Flag("idle_in_transaction_timeout_ms");
pub(super) const LOCK_TIMEOUT: Flag = Flag("lock_timeout_ms");
pub(super) const COMMIT_LANES: Flag = Flag("commit_lanes");
pub(super) const GROUP_MAX_PARTITIONS: Flag = Flag("group_max_partitions");
pub(super) const BATCH_MAX: Flag = Flag("batch_max");
pub(super) const QUEUE_CAPACITY: Flag = Flag("queue_capacity");
pub(super) const REQUEST_TIMEOUT: Flag = Flag("request_timeout_ms");
pub(super) const EXPIRY_INTERVAL: Flag = Flag("expiry_interval_ms");
pub(super) const EXPIRY_BATCH: Flag = Flag("expiry_batch");
pub(super) const HTTP_WORKERS: Flag = Flag("http_workers");
pub(super) const REPLICA_ID: Flag = Flag("replica_id");
pub(super) const SETTLEMENT_WINDOW: Flag = Flag("settlement_window_secs");
pub(super) const SETTLEMENT_GRACE: Flag = Flag("settlement_grace_ms");
pub(super) const IDEMPOTENCY_HORIZON: Flag = Flag("idempotency_horizon_secs");
pub(super) const RETENTION_BATCH: Flag = Flag("retention_batch");
pub(super) const CLIENT_CONCURRENCY: Flag = Flag("client_concurrency");

/// The access flags, for refusals (the `access` crate takes them as text).
pub const ACCESS_FLAGS: access::Flags = access::Flags {
    auth_file: "--auth-file (ALLOCATOR_AUTH_FILE)",
    rate: "--client-rate (ALLOCATOR_CLIENT_RATE)",
    burst: "--client-burst (ALLOCATOR_CLIENT_BURST)",
    require_router: Some("--require-router (ALLOCATOR_REQUIRE_ROUTER)"),
};

/// The TLS flags, for refusals (the `access` crate takes them as text).
pub const TLS_CERT_FLAG: &str = "--tls-cert (ALLOCATOR_TLS_CERT)";
pub const TLS_KEY_FLAG: &str = "--tls-key (ALLOCATOR_TLS_KEY)";
pub const TLS_CLIENT_CA_FLAG: &str = "--tls-client-ca (ALLOCATOR_TLS_CLIENT_CA)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_names_its_option_and_variable() {
        let all = [
            LEASE_TTL,
            RENEW_INTERVAL,
            LEASE_MARGIN,
            CAMPAIGN_INTERVAL,
            POOL_SIZE,
            POOL_WAIT,
            STATEMENT_TIMEOUT,
            IDLE_IN_TX_TIMEOUT,
            LOCK_TIMEOUT,
            COMMIT_LANES,
            GROUP_MAX_PARTITIONS,
            BATCH_MAX,
            QUEUE_CAPACITY,
            REQUEST_TIMEOUT,
            EXPIRY_INTERVAL,
            EXPIRY_BATCH,
            HTTP_WORKERS,
            REPLICA_ID,
            SETTLEMENT_WINDOW,
            SETTLEMENT_GRACE,
            IDEMPOTENCY_HORIZON,
            RETENTION_BATCH,
            CLIENT_CONCURRENCY,
        ];
        for flag in all {
            let shown = flag.to_string();
            assert!(
                shown.starts_with("--") && shown.ends_with(')') && shown.contains(" (ALLOCATOR_"),
                "{} is not a serve flag with a variable: {shown}",
                flag.0
            );
        }
        assert_eq!(
            LEASE_TTL.to_string(),
            "--lease-ttl-ms (ALLOCATOR_LEASE_TTL_MS)"
        );
    }

    #[test]
    fn the_flags_given_as_text_are_clap_s() {
        let texts = [
            ("auth_file", ACCESS_FLAGS.auth_file),
            ("client_rate", ACCESS_FLAGS.rate),
            ("client_burst", ACCESS_FLAGS.burst),
            (
                "require_router",
                ACCESS_FLAGS.require_router.unwrap_or_default(),
            ),
            ("tls_cert", TLS_CERT_FLAG),
            ("tls_key", TLS_KEY_FLAG),
            ("tls_client_ca", TLS_CLIENT_CA_FLAG),
        ];
        for (field, text) in texts {
            assert_eq!(Flag(field).to_string(), text);
        }
    }
}
