//! The access decision for one request: open path, authentication, scope, the client's SKU
//! namespaces and quotas ([`crate::policy`]), limits.
//!
//! [`Gate::admit`] decides everything the request line and headers tell. A request whose body
//! names SKUs or quantities, from a client whose policy looks at them, is admitted with a
//! [`BodyCheck`] still to do: the middleware reads the body and calls [`Gate::check_body`]
//! before anything is served. Every request is counted once, by its final outcome.

use std::num::NonZeroUsize;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use actix_web::http::header::{HeaderMap, AUTHORIZATION};
use schema::routes::{self, Access, Scope};

use crate::audit;
use crate::check::{self, BodyCheck};
use crate::error::AccessError;
use crate::limits::{ClientLimits, InFlight, Limited};
use crate::owner::Owner;
use crate::forwarded::{effective_client, owner, Forwarded};
use crate::policy::Policy;
pub use crate::request::Request;
pub use crate::settings::{Flags, MetricNames, Role, Settings};
use crate::table::{AuthFileError, Client, Scopes, TokenTable};

/// The client name used when authentication is off.
pub const ANONYMOUS: &str = "anonymous";
/// The `client` label of requests whose caller could not be authenticated: not a valid client
/// name, so it never collides with one.
pub const UNAUTHENTICATED: &str = "(none)";

/// A request let through, and the slot it holds until it is answered.
#[derive(Debug, Default)]
pub struct Admitted {
    /// The client the request is for: the caller, or on an allocator the client a router named.
    /// `None` on open paths.
    pub client: Option<String>,
    /// The client's namespaces and quotas, if it has any.
    pub policy: Option<Arc<Policy>>,
    /// The owner the request records and whose reservations and orders it may act on.
    pub owner: Owner,
    pub slot: Option<InFlight>,
    /// The body still has to pass [`Gate::check_body`]; the request is not counted yet.
    pub body_check: Option<BodyCheck>,
    /// An administrative write: audited once answered ([`audit::admin_write`]).
    pub admin_write: bool,
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
    /// Audit lines of unauthenticated refusals, by whole seconds since `started`.
    unauthenticated_lines: audit::UnauthenticatedBudget,
    started: Instant,
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
            unauthenticated_lines: audit::UnauthenticatedBudget::default(),
            started: Instant::now(),
        })
    }

    pub fn metric_names(&self) -> &MetricNames {
        &self.metrics
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

    /// Decide about one request from its line and headers.
    pub fn admit(&self, request: &Request<'_>) -> Result<Admitted, AccessError> {
        if routes::is_open_path(request.path) {
            return Ok(Admitted::default());
        }
        let decision = self.decide(request);
        match &decision {
            Ok(admitted) if admitted.body_check.is_some() => {}
            Ok(admitted) => self.count(admitted.client.as_deref().unwrap_or(ANONYMOUS), "ok"),
            Err((client, error)) => {
                let sku = check::path_sku(request);
                self.refused(client, request, sku.as_deref(), error)
            }
        }
        decision.map_err(|(_, error)| error)
    }

    /// The body check [`Gate::admit`] left: the SKUs and quantities in `body` against the
    /// client's policy. A body that does not parse passes: the handler refuses it with the
    /// same types and words (`400`, `413`).
    pub fn check_body(
        &self,
        admitted: &Admitted,
        request: &Request<'_>,
        body: &[u8],
    ) -> Result<(), AccessError> {
        let client = admitted.client.as_deref().unwrap_or(ANONYMOUS);
        let (Some(check), Some(policy)) = (admitted.body_check, &admitted.policy) else {
            return Ok(());
        };
        match check::body(check, policy, client, body) {
            Ok(()) => {
                self.count(client, "ok");
                Ok(())
            }
            Err((sku, error)) => {
                self.refused(client, request, sku.as_deref(), &error);
                Err(error)
            }
        }
    }

    fn count(&self, client: &str, outcome: &'static str) {
        metrics::counter!(
            self.metrics.client_requests,
            "client" => client.to_owned(),
            "outcome" => outcome
        )
        .increment(1);
    }

    fn refused(&self, client: &str, request: &Request<'_>, sku: Option<&str>, error: &AccessError) {
        self.count(client, error.outcome());
        if let AccessError::QuotaExceeded { quota, .. } = error {
            metrics::counter!(
                self.metrics.quota_refusals,
                "client" => client.to_owned(),
                "quota" => quota.as_str()
            )
            .increment(1);
        }
        let mut suppressed_before = 0;
        if let Some(reason) = error.unauthenticated_reason() {
            metrics::counter!(self.metrics.unauthenticated, "reason" => reason).increment(1);
            // Anyone can send these, as fast as they like: their lines are capped.
            let second = self.started.elapsed().as_secs();
            match self.unauthenticated_lines.take(second) {
                audit::Sample::Write {
                    suppressed_before: n,
                } => suppressed_before = n,
                audit::Sample::Suppress => {
                    metrics::counter!(self.metrics.audit_suppressed).increment(1);
                    return;
                }
            }
        }
        audit::refused(client, request, sku, error, suppressed_before);
    }

    fn decide(&self, request: &Request<'_>) -> Result<Admitted, (String, AccessError)> {
        let (method, template, headers) = (request.method, request.template, request.headers);
        // Looked up once: the scope check and the audit of administrative writes both need it.
        let access = routes::access_for(method, template);
        let table = self.current();
        let caller = match &table {
            None => None,
            Some(table) => Some(
                authenticate(table, headers)
                    .map_err(|e| (UNAUTHENTICATED.to_owned(), e))?
                    .clone(),
            ),
        };
        // Every header a router speaks for its client with, read once, believed only from it.
        let forwarded = Forwarded::read(self.role, caller.as_ref(), headers);
        if let Some(caller) = &caller {
            self.authorise(caller, forwarded.from_router, access)
                .map_err(|e| (caller.name.clone(), e))?;
        }
        let client = caller.as_ref().map_or_else(
            || ANONYMOUS.to_owned(),
            |caller| effective_client(caller, &forwarded),
        );
        let mut owner = owner(caller.as_ref(), &client, &forwarded);
        let policy = forwarded
            .policy(caller.as_ref())
            .map_err(|e| (client.clone(), e))?;
        let quotas = policy.as_ref().map(|p| p.hold_quotas()).unwrap_or_default();
        owner.max_held_per_sku = quotas.per_sku;
        owner.max_held_units = quotas.units;
        owner.held_elsewhere = forwarded.held_elsewhere;
        let body_check = match &policy {
            Some(policy) => {
                check::before_body(policy, &client, request).map_err(|e| (client.clone(), e))?
            }
            None => None,
        };
        let rate = self.rate_for(caller.as_ref(), &client);
        let slot = if rate.is_some() || self.settings.concurrency.is_some() {
            let concurrency = self.settings.concurrency.map(NonZeroUsize::get);
            let slot = self
                .limits
                .admit(&client, rate, concurrency)
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
        let admin_write =
            access == Some(Access::Requires(Scope::Admin)) && !method.eq_ignore_ascii_case("GET");
        let trusted_router = forwarded.from_router;
        Ok(Admitted {
            client: Some(client),
            policy,
            owner,
            slot,
            body_check,
            admin_write,
            trusted_router,
        })
    }

    /// `is_router`: an allocator's caller holding the `router` scope ([`Forwarded::from_router`]).
    fn authorise(
        &self,
        caller: &Client,
        is_router: bool,
        access: Option<Access>,
    ) -> Result<(), AccessError> {
        if self.role == Role::Allocator && self.settings.require_router && !is_router {
            return Err(AccessError::RouterRequired {
                client: caller.name.clone(),
            });
        }
        match access {
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
#[path = "gate_tests.rs"]
pub(crate) mod tests;
