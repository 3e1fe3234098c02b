//! Who may call the allocator's and the router's HTTP APIs.
//!
//! * [`table`]: the auth file (`NAME SCOPE[,SCOPE] SHA256_HEX [OPTION=VALUE ...]` per line) and
//!   the constant-time lookup of a presented bearer token.
//! * [`policy`]: a client's SKU namespaces and quotas (options of its line).
//! * [`gate`]: the decision for one request: open path, authentication, the scope the route
//!   requires ([`schema::routes::ACCESS`]), the client's namespaces and quantity cap (`check`,
//!   by [`schema::routes::SKU_IN`]), and the per-client limits of [`limits`].
//! * [`owner`]: who owns a stored reservation or order, and who may act on it.
//! * [`audit`]: the `audit` log lines of refusals and administrative writes.
//! * [`middleware`]: the actix middleware both services wrap their API in.
//! * [`tls`]: HTTPS listeners and a router's TLS towards allocators, with rustls.
//! * [`upstream`]: the token a router presents to allocators; [`reload`]: SIGHUP re-reads the
//!   auth file, that token and the TLS material.
//!
//! With no auth file, authentication is off (every caller is `anonymous`) and only the limits,
//! if configured, apply. Without the default `http` feature only the parsers ([`table`],
//! [`policy`]) are built, which is what the fuzz targets (`allocator/access/fuzz`) link.

/// Items of the `http` feature (the services' side: the gate, its middleware, TLS, reloads),
/// under one attribute instead of one each.
macro_rules! http_only {
    ($($item:item)*) => {
        $(#[cfg(feature = "http")] $item)*
    };
}

pub mod owner;
pub mod policy;
/// A service's access settings, role and metric names.
pub mod settings;
pub mod table;

pub use owner::Owner;
pub use policy::{HoldQuotas, Policy, Quota};

http_only! {
    pub mod audit;
    mod check;
    pub mod error;
    mod forwarded;
    pub mod gate;
    pub mod limits;
    pub mod middleware;
    pub mod reload;
    /// What the gate looks at in one request.
    pub mod request;
    pub mod tls;
    pub mod upstream;

    pub use {
        check::BodyCheck,
        error::AccessError,
        gate::{Flags, Gate, MetricNames, Role, Settings, TrustedRouter, ANONYMOUS},
        middleware::{
            current_client, current_hold_quotas, current_owner, current_policy, owner_visible,
            sku_visible, with_current_client, AccessControl,
        },
        reload::spawn_sighup_reloader,
        upstream::UpstreamToken,
    };
}
