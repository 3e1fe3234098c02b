//! What a service tells its [`crate::Gate`]: its role, its access settings from the command line
//! (with the flags that set them, to name in refusals) and the names of its metrics.

use std::num::NonZeroUsize;
use std::path::PathBuf;

/// Which service enforces: the scope `router` means something only to an allocator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Router,
    Allocator,
}

/// Access settings of one service, from its command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `None` turns authentication off.
    pub auth_file: Option<PathBuf>,
    /// Requests per second per client; `None` for no rate limit.
    pub rate: Option<f64>,
    /// Burst per client; default: one second's worth of the rate (at least 1).
    pub burst: Option<u32>,
    /// Requests in flight per client; `None` for no cap.
    pub concurrency: Option<NonZeroUsize>,
    /// Allocator only: refuse callers that do not hold the `router` scope.
    pub require_router: bool,
}

impl Settings {
    /// No authentication, no limits.
    pub const fn off() -> Settings {
        Settings {
            auth_file: None,
            rate: None,
            burst: None,
            concurrency: None,
            require_router: false,
        }
    }
}

/// The flags (with their environment variables) that set [`Settings`], for refusals.
pub struct Flags {
    pub auth_file: &'static str,
    pub rate: &'static str,
    pub burst: &'static str,
    pub require_router: Option<&'static str>,
}

impl Settings {
    /// Refuse what cannot work, naming the flag.
    pub fn validate(&self, flags: &Flags) -> Result<(), String> {
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                return Err(format!(
                    "{} must be a positive number of requests per second, got {rate}",
                    flags.rate
                ));
            }
        }
        if self.burst == Some(0) {
            return Err(format!("{} must be at least 1, got 0", flags.burst));
        }
        if self.require_router && self.auth_file.is_none() {
            return Err(format!(
                "{} needs {}: without authentication no caller can show it is a router",
                flags.require_router.unwrap_or("--require-router"),
                flags.auth_file
            ));
        }
        Ok(())
    }
}

/// Metric names of the service that owns the gate (declared in its `metrics.rs`: they are a
/// contract with the alerts and dashboards). What each counts is the same in both services.
#[derive(Debug, Clone, Copy)]
pub struct MetricNames {
    /// Counter: requests by `client` (the authenticated caller; `anonymous` with authentication
    /// off, `(none)` when no valid token was shown) and `outcome`: `ok`, `unauthenticated`,
    /// `forbidden`, `namespace_forbidden`, `rate_limited`, `concurrency_limited`,
    /// `quota_exceeded`. Client names come from auth files, so the label stays as small as they
    /// are.
    pub client_requests: &'static str,
    /// Counter: auth file reloads (SIGHUP) by `outcome`: `ok`, `failed` (the previous table
    /// stays).
    pub auth_reloads: &'static str,
    /// Gauge: clients in the auth table in force.
    pub auth_clients: &'static str,
    /// Counter: requests refused by a quota of the client's auth-file line, by `client` and
    /// `quota` (`max_quantity`; `max_held_per_sku` and `max_held_units` once the fenced batch
    /// decides them).
    pub quota_refusals: &'static str,
    /// Counter: TLS certificate, key and CA reloads (SIGHUP) by `outcome`: `ok`, `failed` (the
    /// material in force stays).
    pub tls_reloads: &'static str,
    /// Counter: requests refused `401` by `reason`: `missing_token`, `malformed_token`,
    /// `unknown_token`; each one, whether or not its audit line was written.
    pub unauthenticated: &'static str,
    /// Counter: audit lines of unauthenticated refusals not written because the service's budget
    /// of [`crate::audit::UNAUTHENTICATED_LINES_PER_SECOND`] was spent.
    pub audit_suppressed: &'static str,
}
