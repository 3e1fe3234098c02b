//! Who may call the allocator's and the router's HTTP APIs.
//!
//! * [`table`]: the auth file (`NAME SCOPE[,SCOPE] SHA256_HEX [rate=N] [burst=N]` per line) and
//!   the constant-time lookup of a presented bearer token.
//! * [`gate`]: the decision for one request: open path, authentication, the scope the route
//!   requires ([`schema::routes::ACCESS`]), and the per-client limits of [`limits`].
//! * [`middleware`]: the actix middleware both services wrap their API in.
//! * [`upstream`]: the token a router presents to allocators; [`reload`]: SIGHUP re-reads both.
//!
//! With no auth file, authentication is off (every caller is `anonymous`) and only the limits,
//! if configured, apply.

pub mod error;
pub mod gate;
pub mod limits;
pub mod middleware;
pub mod reload;
pub mod table;
pub mod upstream;

pub use error::AccessError;
pub use gate::{Flags, Gate, MetricNames, Role, Settings, TrustedRouter, ANONYMOUS};
pub use middleware::{current_client, with_current_client, AccessControl};
pub use reload::spawn_sighup_reloader;
pub use upstream::UpstreamToken;
