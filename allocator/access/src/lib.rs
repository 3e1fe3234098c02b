//! Who may call the allocator's and the router's HTTP APIs.
//!
//! * [`table`]: the auth file (`NAME SCOPE[,SCOPE] SHA256_HEX [OPTION=VALUE ...]` per line) and
//!   the constant-time lookup of a presented bearer token.
//! * [`policy`]: a client's SKU namespaces and quotas (options of its line).
//! * [`gate`]: the decision for one request: open path, authentication, the scope the route
//!   requires ([`schema::routes::ACCESS`]), the client's namespaces and quantity cap (`check`,
//!   by [`schema::routes::SKU_IN`]), and the per-client limits of [`limits`].
//! * [`audit`]: the `audit` log lines of refusals and administrative writes.
//! * [`middleware`]: the actix middleware both services wrap their API in.
//! * [`upstream`]: the token a router presents to allocators; [`reload`]: SIGHUP re-reads both.
//!
//! With no auth file, authentication is off (every caller is `anonymous`) and only the limits,
//! if configured, apply.

pub mod audit;
mod check;
pub mod error;
pub mod gate;
pub mod limits;
pub mod middleware;
pub mod policy;
pub mod reload;
pub mod table;
pub mod tls;
pub mod upstream;

pub use check::BodyCheck;
pub use error::AccessError;
pub use gate::{Flags, Gate, MetricNames, Role, Settings, ANONYMOUS};
pub use middleware::{
    current_client, current_policy, sku_visible, with_current_client, AccessControl,
};
pub use policy::{Policy, Quota};
pub use reload::spawn_sighup_reloader;
pub use upstream::UpstreamToken;
