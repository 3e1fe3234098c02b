//! The access decision for one request: open path, authentication, scope, limits.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use actix_web::http::header::{HeaderMap, AUTHORIZATION};
use schema::routes::{self, Access, Scope};
use schema::wire::HEADER_CLIENT;

use crate::error::AccessError;
use crate::limits::{ClientLimits, InFlight, Limited};
use crate::table::{valid_name, AuthFileError, Client, Scopes, TokenTable};

/// The client name used when authentication is off.
pub const ANONYMOUS: &str = "anonymous";
/// The `client` label of requests whose caller could not be authenticated: not a valid client
/// name, so it never collides with one.
pub const UNAUTHENTICATED: &str = "(none)";

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

/// Metric names of the service that owns the gate (declared in its `metrics.rs`).
#[derive(Debug, Clone, Copy)]
pub struct MetricNames {
    /// Counter by `client` and `outcome` (`ok`, `unauthenticated`, `forbidden`, `rate_limited`,
    /// `concurrency_limited`).
    pub client_requests: &'static str,
    /// Counter of auth file reloads by `outcome` (`ok`, `failed`).
    pub auth_reloads: &'static str,
    /// Gauge: clients in the table in force.
    pub auth_clients: &'static str,
}

/// A request let through, and the slot it holds until it is answered.
#[derive(Debug)]
pub struct Admitted {
    /// The client the request is for: the caller, or on an allocator the client a router named.
    /// `None` on open paths.
    pub client: Option<String>,
    pub slot: Option<InFlight>,
    /// On an allocator: the caller may do what only routers do (place order lines). True for a
    /// caller holding the `router` scope, and for everyone when authentication is off (then only
    /// the network protects the allocators). Always false on a router.
    pub trusted_router: bool,
}

/// Request extension set by [`crate::AccessControl`] on an allocator when the caller is
/// [`Admitted::trusted_router`]; handlers check for it with `HttpRequest::extensions`.
#[derive(Debug, Clone, Copy)]
pub struct TrustedRouter;

/// One per service; shared by every HTTP worker.
pub struct Gate {
    role: Role,
    settings: Settings,
    /// `None` when authentication is off. Swapped whole on reload, so a request sees either the
    /// old table or the new one.
    table: RwLock<Option<Arc<TokenTable>>>,
    limits: ClientLimits,
    metrics: MetricNames,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("role", &self.role)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl Gate {
    /// Load the auth file (if any). Refuses a file it cannot read or parse.
    pub fn new(
        role: Role,
        settings: Settings,
        metrics: MetricNames,
    ) -> Result<Gate, AuthFileError> {
        let table = match &settings.auth_file {
            Some(path) => {
                let table = TokenTable::load(path)?;
                metrics::gauge!(metrics.auth_clients).set(table.len() as f64);
                tracing::info!(
                    auth_file = %path.display(),
                    clients = table.len(),
                    "bearer-token authentication on"
                );
                Some(Arc::new(table))
            }
            None => {
                tracing::warn!(
                    "authentication is OFF (no auth file): every caller may reserve, restock and \
                     shrink; run only inside a trusted network"
                );
                None
            }
        };
        Ok(Gate {
            role,
            settings,
            table: RwLock::new(table),
            limits: ClientLimits::default(),
            metrics,
        })
    }

    pub fn enabled(&self) -> bool {
        self.settings.auth_file.is_some()
    }

    fn current(&self) -> Option<Arc<TokenTable>> {
        self.table
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Re-read the auth file. A file that cannot be read or parsed leaves the table in force
    /// unchanged: a typo during a rotation must not lock every client out. Returns the number of
    /// clients now in force; with authentication off there is nothing to reload.
    pub fn reload(&self) -> Result<Option<usize>, AuthFileError> {
        let Some(path) = &self.settings.auth_file else {
            return Ok(None);
        };
        match TokenTable::load(path) {
            Ok(table) => {
                let clients = table.len();
                let names: Vec<&str> = table.names().collect();
                tracing::info!(auth_file = %path.display(), clients, names = ?names, "auth file reloaded");
                *self
                    .table
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(table));
                metrics::counter!(self.metrics.auth_reloads, "outcome" => "ok").increment(1);
                metrics::gauge!(self.metrics.auth_clients).set(clients as f64);
                Ok(Some(clients))
            }
            Err(error) => {
                tracing::error!(%error, "auth file reload refused; keeping the previous table");
                metrics::counter!(self.metrics.auth_reloads, "outcome" => "failed").increment(1);
                Err(error)
            }
        }
    }

    /// Decide about one request: `path` as requested, `template` the route it matched.
    pub fn admit(
        &self,
        method: &str,
        path: &str,
        template: Option<&str>,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<Admitted, AccessError> {
        if routes::is_open_path(path) {
            return Ok(Admitted {
                client: None,
                slot: None,
                trusted_router: false,
            });
        }
        let decision = self.decide(method, template, headers, now);
        let (client, outcome) = match &decision {
            Ok(admitted) => (admitted.client.as_deref().unwrap_or(ANONYMOUS), "ok"),
            Err((client, error)) => (client.as_str(), error.outcome()),
        };
        metrics::counter!(
            self.metrics.client_requests,
            "client" => client.to_owned(),
            "outcome" => outcome
        )
        .increment(1);
        decision.map_err(|(client, error)| {
            tracing::info!(client, %error, method, path, "request refused");
            error
        })
    }

    fn decide(
        &self,
        method: &str,
        template: Option<&str>,
        headers: &HeaderMap,
        now: Instant,
    ) -> Result<Admitted, (String, AccessError)> {
        let table = self.current();
        let caller = match &table {
            None => None,
            Some(table) => Some(
                authenticate(table, headers)
                    .map_err(|e| (UNAUTHENTICATED.to_owned(), e))?
                    .clone(),
            ),
        };
        if let Some(caller) = &caller {
            self.authorise(caller, method, template)
                .map_err(|e| (caller.name.clone(), e))?;
        }
        let client = self.effective_client(caller.as_ref(), headers);
        let rate = self.rate_for(caller.as_ref(), &client);
        let slot = if rate.is_some() || self.settings.concurrency.is_some() {
            let concurrency = self.settings.concurrency.map(NonZeroUsize::get);
            let slot = self
                .limits
                .admit(&client, rate, concurrency, now)
                .map_err(|limited| {
                    let error = match limited {
                        Limited::Rate { rate, retry_after } => AccessError::RateLimited {
                            client: client.clone(),
                            rate,
                            retry_after,
                        },
                        Limited::Concurrency { limit } => AccessError::ConcurrencyLimited {
                            client: client.clone(),
                            limit,
                        },
                    };
                    (client.clone(), error)
                })?;
            Some(slot)
        } else {
            None
        };
        let trusted_router = self.role == Role::Allocator
            && caller
                .as_ref()
                .is_none_or(|c| c.scopes.contains(Scope::Router));
        Ok(Admitted {
            client: Some(client),
            slot,
            trusted_router,
        })
    }

    fn authorise(
        &self,
        caller: &Client,
        method: &str,
        template: Option<&str>,
    ) -> Result<(), AccessError> {
        let is_router = self.role == Role::Allocator && caller.scopes.contains(Scope::Router);
        if self.role == Role::Allocator && self.settings.require_router && !is_router {
            return Err(AccessError::RouterRequired {
                client: caller.name.clone(),
            });
        }
        match routes::access_for(method, template) {
            None | Some(Access::Open) => Ok(()),
            // A router checked its client's scopes before it forwarded.
            Some(Access::Requires(_)) if is_router => Ok(()),
            Some(Access::Requires(scope)) if granted(caller.scopes, scope) => Ok(()),
            Some(Access::Requires(scope)) => Err(AccessError::MissingScope {
                client: caller.name.clone(),
                scope,
            }),
        }
    }

    /// The caller's name, or on an allocator the client a router says it forwards for.
    fn effective_client(&self, caller: Option<&Client>, headers: &HeaderMap) -> String {
        let Some(caller) = caller else {
            return ANONYMOUS.to_owned();
        };
        if self.role == Role::Allocator && caller.scopes.contains(Scope::Router) {
            let named = headers
                .get(HEADER_CLIENT)
                .and_then(|v| v.to_str().ok())
                .filter(|name| valid_name(name));
            if let Some(name) = named {
                return name.to_owned();
            }
        }
        caller.name.clone()
    }

    /// The caller's own override from the auth file (only when the client is the caller itself),
    /// else the service's.
    fn rate_for(&self, caller: Option<&Client>, client: &str) -> Option<(f64, u32)> {
        let own = caller.filter(|c| c.name == client);
        let rate = own.and_then(|c| c.rate).or(self.settings.rate)?;
        let burst = own
            .and_then(|c| c.burst)
            .or(self.settings.burst)
            .unwrap_or_else(|| default_burst(rate));
        Some((rate, burst))
    }
}

/// One second's worth of requests, at least one.
fn default_burst(rate: f64) -> u32 {
    // Saturating float-to-int conversion; `rate` is positive and finite.
    (rate.ceil() as u32).max(1)
}

fn granted(scopes: Scopes, required: Scope) -> bool {
    scopes.contains(required)
}

/// The client whose bearer token the request carries.
fn authenticate<'t>(table: &'t TokenTable, headers: &HeaderMap) -> Result<&'t Client, AccessError> {
    let value = headers
        .get(AUTHORIZATION)
        .ok_or(AccessError::MissingToken)?;
    let token = bearer_token(value.as_bytes()).ok_or(AccessError::MalformedToken)?;
    table.lookup(token).ok_or(AccessError::UnknownToken)
}

/// The token of `Bearer <token>` (scheme case-insensitive, RFC 7235 §2.1): one run of visible
/// ASCII characters.
pub fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let scheme = value.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = value[7..].trim_ascii();
    (!token.is_empty() && token.iter().all(u8::is_ascii_graphic)).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::hash_hex;
    use actix_web::http::header::{HeaderName, HeaderValue};
    use std::io::Write;

    const METRICS: MetricNames = MetricNames {
        client_requests: "test_client_requests_total",
        auth_reloads: "test_auth_reloads_total",
        auth_clients: "test_auth_clients",
    };

    fn auth_file(lines: &[(&str, &str, &str)]) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        for (name, scopes, token) in lines {
            writeln!(file, "{name} {scopes} {}", hash_hex(token.as_bytes())).unwrap();
        }
        file
    }

    fn gate(role: Role, file: &tempfile::NamedTempFile, tweak: impl FnOnce(&mut Settings)) -> Gate {
        let mut settings = Settings {
            auth_file: Some(file.path().to_owned()),
            ..Settings::off()
        };
        tweak(&mut settings);
        Gate::new(role, settings, METRICS).unwrap()
    }

    fn headers(token: Option<&str>, client: Option<&str>) -> HeaderMap {
        let mut map = HeaderMap::new();
        if let Some(token) = token {
            map.insert(
                AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
        }
        if let Some(client) = client {
            map.insert(
                HeaderName::from_static(HEADER_CLIENT),
                HeaderValue::from_str(client).unwrap(),
            );
        }
        map
    }

    const RESERVE: (&str, &str) = ("POST", "/v1/reservations");
    const ADJUST: (&str, &str) = ("POST", "/v1/inventory/{sku}/adjustments");

    fn ask(
        gate: &Gate,
        (method, template): (&str, &str),
        headers: &HeaderMap,
    ) -> Result<Admitted, AccessError> {
        gate.admit(method, "/v1/x", Some(template), headers, Instant::now())
    }

    #[test]
    fn scopes_decide_per_route() {
        let file = auth_file(&[("shop", "reserve", "t-shop"), ("ops", "admin", "t-ops")]);
        let gate = gate(Role::Router, &file, |_| {});
        let shop = headers(Some("t-shop"), None);
        let ops = headers(Some("t-ops"), None);
        assert_eq!(
            ask(&gate, RESERVE, &shop).unwrap().client.as_deref(),
            Some("shop")
        );
        assert_eq!(
            ask(&gate, ADJUST, &shop).unwrap_err(),
            AccessError::MissingScope {
                client: "shop".into(),
                scope: Scope::Admin
            }
        );
        ask(&gate, ADJUST, &ops).unwrap();
        assert!(matches!(
            ask(&gate, RESERVE, &ops),
            Err(AccessError::MissingScope { .. })
        ));
        // Unmatched paths (404) need only a valid token.
        gate.admit("GET", "/nope", None, &shop, Instant::now())
            .unwrap();
        assert_eq!(
            gate.admit("GET", "/nope", None, &HeaderMap::new(), Instant::now())
                .unwrap_err(),
            AccessError::MissingToken
        );
    }

    #[test]
    fn tokens_missing_malformed_or_unknown_are_401() {
        let file = auth_file(&[("shop", "reserve", "t-shop")]);
        let gate = gate(Role::Router, &file, |_| {});
        assert_eq!(
            ask(&gate, RESERVE, &HeaderMap::new()).unwrap_err(),
            AccessError::MissingToken
        );
        assert_eq!(
            ask(&gate, RESERVE, &headers(Some("t-other"), None)).unwrap_err(),
            AccessError::UnknownToken
        );
        let mut basic = HeaderMap::new();
        basic.insert(AUTHORIZATION, HeaderValue::from_static("Basic dDpzaG9w"));
        assert_eq!(
            ask(&gate, RESERVE, &basic).unwrap_err(),
            AccessError::MalformedToken
        );
        // Open paths need nothing, whatever is presented.
        gate.admit("GET", "/healthz", Some("/healthz"), &basic, Instant::now())
            .unwrap();
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer  abc "), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Bearer a b"), None);
        assert_eq!(bearer_token(b"Bearerabc"), None);
        assert_eq!(bearer_token(b"Token abc"), None);
        assert_eq!(bearer_token(b""), None);
    }

    #[test]
    fn allocator_trusts_the_client_name_only_from_routers() {
        let file = auth_file(&[
            ("router-1", "router", "t-router"),
            ("shop", "reserve", "t-shop"),
        ]);
        let gate = gate(Role::Allocator, &file, |_| {});
        let via_router = headers(Some("t-router"), Some("ops"));
        // A router stands in for its client's scopes, and names the client.
        let admitted = ask(&gate, ADJUST, &via_router).unwrap();
        assert_eq!(admitted.client.as_deref(), Some("ops"));
        assert!(admitted.trusted_router);
        // A direct caller cannot pretend to be someone else, nor to be a router.
        let spoofing = headers(Some("t-shop"), Some("ops"));
        assert!(!ask(&gate, RESERVE, &spoofing).unwrap().trusted_router);
        assert_eq!(
            ask(&gate, RESERVE, &spoofing).unwrap().client.as_deref(),
            Some("shop")
        );
        assert!(matches!(
            ask(&gate, ADJUST, &spoofing),
            Err(AccessError::MissingScope { .. })
        ));
        // A router token at a router grants nothing.
        let router_gate = self::gate(Role::Router, &file, |_| {});
        assert!(matches!(
            ask(&router_gate, RESERVE, &via_router),
            Err(AccessError::MissingScope { .. })
        ));
    }

    #[test]
    fn require_router_refuses_direct_callers() {
        let file = auth_file(&[
            ("router-1", "router", "t-router"),
            ("ops", "reserve,admin", "t-ops"),
        ]);
        let gate = gate(Role::Allocator, &file, |s| s.require_router = true);
        assert_eq!(
            ask(&gate, RESERVE, &headers(Some("t-ops"), None)).unwrap_err(),
            AccessError::RouterRequired {
                client: "ops".into()
            }
        );
        ask(&gate, RESERVE, &headers(Some("t-router"), Some("shop"))).unwrap();
        // Probes stay open.
        gate.admit(
            "GET",
            "/readyz",
            Some("/readyz"),
            &HeaderMap::new(),
            Instant::now(),
        )
        .unwrap();
    }

    #[test]
    fn reload_swaps_the_table_and_keeps_it_on_error() {
        let mut file = auth_file(&[("old", "reserve", "t-old")]);
        let gate = gate(Role::Router, &file, |_| {});
        ask(&gate, RESERVE, &headers(Some("t-old"), None)).unwrap();
        std::fs::write(file.path(), format!("new reserve {}\n", hash_hex(b"t-new"))).unwrap();
        assert_eq!(gate.reload().unwrap(), Some(1));
        ask(&gate, RESERVE, &headers(Some("t-new"), None)).unwrap();
        assert_eq!(
            ask(&gate, RESERVE, &headers(Some("t-old"), None)).unwrap_err(),
            AccessError::UnknownToken
        );
        // A broken file is refused and the table in force stays.
        file.write_all(b"broken line\n").unwrap();
        let error = gate.reload().unwrap_err().to_string();
        assert!(error.contains(":2:"), "{error}");
        ask(&gate, RESERVE, &headers(Some("t-new"), None)).unwrap();
    }

    #[test]
    fn limits_apply_by_client_with_overrides() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "slow reserve {} rate=1 burst=1", hash_hex(b"t-slow")).unwrap();
        writeln!(file, "fast reserve {}", hash_hex(b"t-fast")).unwrap();
        let gate = gate(Role::Router, &file, |s| {
            s.rate = Some(100.0);
            s.burst = Some(3);
        });
        let now = Instant::now();
        let slow = headers(Some("t-slow"), None);
        let fast = headers(Some("t-fast"), None);
        let ask_at =
            |h: &HeaderMap| gate.admit("POST", "/v1/reservations", Some(RESERVE.1), h, now);
        ask_at(&slow).unwrap();
        assert_eq!(
            ask_at(&slow).unwrap_err(),
            AccessError::RateLimited {
                client: "slow".into(),
                rate: 1.0,
                retry_after: 1
            }
        );
        for _ in 0..3 {
            ask_at(&fast).unwrap();
        }
        assert!(matches!(
            ask_at(&fast),
            Err(AccessError::RateLimited { .. })
        ));
    }

    #[test]
    fn with_authentication_off_everyone_is_anonymous() {
        let gate = Gate::new(
            Role::Router,
            Settings {
                concurrency: NonZeroUsize::new(1),
                ..Settings::off()
            },
            METRICS,
        )
        .unwrap();
        assert!(!gate.enabled());
        let first = ask(&gate, ADJUST, &HeaderMap::new()).unwrap();
        assert_eq!(first.client.as_deref(), Some(ANONYMOUS));
        // Only an allocator has routers to trust; with authentication off it trusts everyone.
        assert!(!first.trusted_router);
        let allocator = Gate::new(Role::Allocator, Settings::off(), METRICS).unwrap();
        assert!(
            ask(&allocator, RESERVE, &HeaderMap::new())
                .unwrap()
                .trusted_router
        );
        assert!(matches!(
            ask(&gate, RESERVE, &HeaderMap::new()),
            Err(AccessError::ConcurrencyLimited { limit: 1, .. })
        ));
        drop(first);
        ask(&gate, RESERVE, &HeaderMap::new()).unwrap();
        assert_eq!(gate.reload().unwrap(), None);
    }

    #[test]
    fn settings_refusals_name_the_flag() {
        let flags = Flags {
            auth_file: "--auth-file (X_AUTH_FILE)",
            rate: "--client-rate (X_CLIENT_RATE)",
            burst: "--client-burst (X_CLIENT_BURST)",
            require_router: Some("--require-router (X_REQUIRE_ROUTER)"),
        };
        let refuse = |settings: Settings| settings.validate(&flags).unwrap_err();
        assert!(refuse(Settings {
            rate: Some(0.0),
            ..Settings::off()
        })
        .contains("X_CLIENT_RATE"));
        assert!(refuse(Settings {
            rate: Some(f64::NAN),
            ..Settings::off()
        })
        .contains("--client-rate"));
        assert!(refuse(Settings {
            burst: Some(0),
            ..Settings::off()
        })
        .contains("X_CLIENT_BURST"));
        let error = refuse(Settings {
            require_router: true,
            ..Settings::off()
        });
        assert!(
            error.contains("X_REQUIRE_ROUTER") && error.contains("X_AUTH_FILE"),
            "{error}"
        );
        Settings::off().validate(&flags).unwrap();
    }
}
