//! The HTTP route table.
//!
//! Both services register their handlers by these templates, the OpenAPI document must describe
//! exactly these operations, and its conformance test reads this table instead of the services'
//! source. A path added here without a handler, or a handler registered by a literal path, shows up
//! as a failing conformance test rather than as an undocumented endpoint.

/// A service that serves HTTP: the two kinds of process in a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    Allocator,
    Router,
}

impl Service {
    /// The name the API document uses for it in `x-served-by`.
    pub fn name(self) -> &'static str {
        match self {
            Service::Allocator => "allocator",
            Service::Router => "router",
        }
    }
}

/// Which service answers a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Both the router (public entry point) and every allocator replica.
    Both,
    /// Only the router.
    Router,
}

/// One operation: a method on a path template with `{name}` placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub served: Served,
}

const fn route(method: &'static str, path: &'static str, served: Served) -> Route {
    Route {
        method,
        path,
        served,
    }
}

pub const RESERVE: Route = route("POST", "/v1/reservations", Served::Both);
pub const GET_RESERVATION: Route = route("GET", "/v1/reservations/{reservation_id}", Served::Both);
pub const CONFIRM: Route = route(
    "POST",
    "/v1/reservations/{reservation_id}/confirm",
    Served::Both,
);
pub const RELEASE: Route = route(
    "POST",
    "/v1/reservations/{reservation_id}/release",
    Served::Both,
);
pub const GET_INVENTORY: Route = route("GET", "/v1/inventory/{sku}", Served::Both);
pub const ADJUST: Route = route("POST", "/v1/inventory/{sku}/adjustments", Served::Both);
/// One SKU's ledger in commit order, with the client of each movement ([`crate::history`]).
pub const INVENTORY_HISTORY: Route = route("GET", "/v1/inventory/{sku}/history", Served::Both);
pub const RESERVE_ORDER: Route =
    route("POST", "/v1/orders/{order_id}/reservations", Served::Router);
pub const PARTITIONS: Route = route("GET", "/v1/partitions", Served::Both);
pub const SETTLEMENT_STATUS: Route = route("GET", "/v1/jobs/settlement", Served::Both);
pub const EVENTS: Route = route("GET", "/v1/events", Served::Both);
pub const HEALTHZ: Route = route("GET", "/healthz", Served::Both);
pub const READYZ: Route = route("GET", "/readyz", Served::Both);
pub const METRICS: Route = route("GET", "/metrics", Served::Both);
/// The API document of the service answering (see [`crate::openapi`]).
pub const OPENAPI: Route = route("GET", "/openapi.json", Served::Both);
/// A browsable rendering of [`OPENAPI`], self-contained (no external scripts or styles).
pub const DOCS: Route = route("GET", "/docs", Served::Both);
/// The cluster as one router sees it: lease map, replicas, settlement job, its own traffic.
pub const CLUSTER_OVERVIEW: Route = route("GET", "/v1/cluster/overview", Served::Router);
/// The live operations page, drawn from [`CLUSTER_OVERVIEW`].
pub const UI: Route = route("GET", "/ui", Served::Router);

/// Every route, in the order the API document lists them.
pub const ALL: &[Route] = &[
    RESERVE,
    GET_RESERVATION,
    CONFIRM,
    RELEASE,
    GET_INVENTORY,
    ADJUST,
    INVENTORY_HISTORY,
    RESERVE_ORDER,
    PARTITIONS,
    SETTLEMENT_STATUS,
    EVENTS,
    HEALTHZ,
    READYZ,
    METRICS,
    OPENAPI,
    DOCS,
    CLUSTER_OVERVIEW,
    UI,
];

/// The `Allow` header value for a path template: every method the table lists for it, so a `405`
/// can say what would have worked (RFC 9110 §15.5.6). `None` for a template the table lacks.
pub fn allowed_methods(path: &str) -> Option<String> {
    let methods: Vec<&str> = ALL
        .iter()
        .filter(|route| route.path == path)
        .map(|route| route.method)
        .collect();
    (!methods.is_empty()).then(|| methods.join(", "))
}

/// A credential's permission. A caller holds a set of scopes (one line of an auth file); a route
/// requires at most one (see [`ACCESS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Reservations, orders and every read.
    Reserve,
    /// Stock adjustments (restock, shrink) and any administrative write.
    Admin,
    /// A router calling an allocator on behalf of the client it names in
    /// [`crate::wire::HEADER_CLIENT`]. The router checked that client's scopes, so on an
    /// allocator this scope stands in for every other one; a router itself grants it nothing.
    Router,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Reserve, Scope::Admin, Scope::Router];

    /// The name used in auth files, problem details and the API document.
    pub const fn as_str(self) -> &'static str {
        match self {
            Scope::Reserve => "reserve",
            Scope::Admin => "admin",
            Scope::Router => "router",
        }
    }

    pub fn parse(name: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// What a caller needs to be answered on a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential: probes and scrapers must work without one. Its path is in [`OPEN_PATHS`].
    Open,
    /// A valid bearer token holding this scope.
    Requires(Scope),
}

/// Every route with the access it requires: the one table both services enforce and the API
/// document's `x-required-scope` is checked against. A route missing here is refused to everyone
/// but admin callers at run time, and fails the test below.
pub const ACCESS: &[(Route, Access)] = &[
    (RESERVE, Access::Requires(Scope::Reserve)),
    (GET_RESERVATION, Access::Requires(Scope::Reserve)),
    (CONFIRM, Access::Requires(Scope::Reserve)),
    (RELEASE, Access::Requires(Scope::Reserve)),
    (GET_INVENTORY, Access::Requires(Scope::Reserve)),
    (ADJUST, Access::Requires(Scope::Admin)),
    // Who reserved and adjusted what: the audit of a SKU, for operators.
    (INVENTORY_HISTORY, Access::Requires(Scope::Admin)),
    (RESERVE_ORDER, Access::Requires(Scope::Reserve)),
    (PARTITIONS, Access::Requires(Scope::Reserve)),
    (SETTLEMENT_STATUS, Access::Requires(Scope::Reserve)),
    // Every SKU's movements, whatever namespaces a client is confined to: the operators' scope.
    (EVENTS, Access::Requires(Scope::Admin)),
    (HEALTHZ, Access::Open),
    (READYZ, Access::Open),
    (METRICS, Access::Open),
    (OPENAPI, Access::Open),
    (DOCS, Access::Open),
    // The overview names every owner's and replica's URL and the settlement totals, which
    // `PARTITIONS` and `SETTLEMENT_STATUS` guard with `reserve`: the same scope here. The page
    // that draws it is open (it holds no data) and asks for a token.
    (CLUSTER_OVERVIEW, Access::Requires(Scope::Reserve)),
    (UI, Access::Open),
];

/// Where a route names the SKUs it touches, for clients confined to SKU namespaces (`skus=` in
/// the auth file): the one table both services check a request's SKUs by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkuIn {
    /// The route touches no SKU's data (probes, documents, the cluster's own state).
    Nowhere,
    /// The `{sku}` path segment.
    Path,
    /// The `sku` of a reservation body ([`crate::wire::ReserveRequest`]).
    ReserveBody,
    /// The `sku` of every line of an order body ([`crate::wire::OrderRequest`]).
    OrderBody,
    /// The stored reservation the `{reservation_id}` names: only the allocator that reads it can
    /// tell, and answers `404` for a SKU outside the caller's namespaces (no existence leak).
    StoredReservation,
}

/// Every route with where its SKUs are. A route missing here is refused to a namespaced client
/// (fails closed), and fails the test below.
pub const SKU_IN: &[(Route, SkuIn)] = &[
    (RESERVE, SkuIn::ReserveBody),
    (GET_RESERVATION, SkuIn::StoredReservation),
    (CONFIRM, SkuIn::StoredReservation),
    (RELEASE, SkuIn::StoredReservation),
    (GET_INVENTORY, SkuIn::Path),
    (ADJUST, SkuIn::Path),
    (INVENTORY_HISTORY, SkuIn::Path),
    (RESERVE_ORDER, SkuIn::OrderBody),
    (PARTITIONS, SkuIn::Nowhere),
    (SETTLEMENT_STATUS, SkuIn::Nowhere),
    (EVENTS, SkuIn::Nowhere),
    (HEALTHZ, SkuIn::Nowhere),
    (READYZ, SkuIn::Nowhere),
    (METRICS, SkuIn::Nowhere),
    (OPENAPI, SkuIn::Nowhere),
    (DOCS, SkuIn::Nowhere),
    (CLUSTER_OVERVIEW, SkuIn::Nowhere),
    (UI, SkuIn::Nowhere),
];

/// Where the request matched by `method` and `template` names its SKUs: `Some(Nowhere)` when no
/// route matched (a `404`) or the method is not the route's (a `405`), `None` for a registered
/// route missing from [`SKU_IN`].
pub fn sku_in(method: &str, template: Option<&str>) -> Option<SkuIn> {
    let Some(template) = template else {
        return Some(SkuIn::Nowhere);
    };
    let mut known_path = false;
    for (route, sku_in) in SKU_IN {
        if route.path == template {
            if route.method.eq_ignore_ascii_case(method) {
                return Some(*sku_in);
            }
            known_path = true;
        }
    }
    known_path.then_some(SkuIn::Nowhere)
}

/// Paths answered without a credential, whatever the method: liveness and readiness probes,
/// the Prometheus scrape, the API description and its viewer, and the operations page (static;
/// the data it draws needs a token). A path here is open also when it is not (yet) in [`ALL`]; a
/// prefix ending in `/` opens everything below it.
pub const OPEN_PATHS: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/",
    "/ui",
    "/ui/",
];

/// Whether `path` (the request's path, not a template) is answered without a credential.
pub fn is_open_path(path: &str) -> bool {
    OPEN_PATHS.iter().any(|open| {
        if open.len() > 1 && open.ends_with('/') {
            path.starts_with(open)
        } else {
            path == *open
        }
    })
}

/// The access a request needs, given its method and the route template it matched (`None` when
/// no route matched: the answer will be `404`, which any authenticated caller may see).
///
/// A template in the table with another method is a `405` for any authenticated caller. A
/// template that matched a registered route but is missing from the table is refused to all but
/// admin callers: a route added without a decision fails closed.
pub fn access_for(method: &str, template: Option<&str>) -> Option<Access> {
    let template = template?;
    let mut known_path = false;
    for (route, access) in ACCESS {
        if route.path == template {
            if route.method.eq_ignore_ascii_case(method) {
                return Some(*access);
            }
            known_path = true;
        }
    }
    (!known_path).then_some(Access::Requires(Scope::Admin))
}

impl Route {
    /// The access this route requires, from [`ACCESS`]; a route missing there needs `admin`.
    pub fn access(&self) -> Access {
        ACCESS
            .iter()
            .find(|(route, _)| route == self)
            .map_or(Access::Requires(Scope::Admin), |(_, access)| *access)
    }

    /// Whether the allocator replica serves this route (the router serves all of them).
    pub fn served_by_allocator(&self) -> bool {
        self.served == Served::Both
    }

    /// Whether `service` serves this route.
    pub fn served_by(&self, service: Service) -> bool {
        match service {
            Service::Allocator => self.served_by_allocator(),
            Service::Router => true,
        }
    }
}

/// The routes `service` serves, in table order.
pub fn served_by(service: Service) -> impl Iterator<Item = &'static Route> {
    ALL.iter().filter(move |r| r.served_by(service))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route as messages name it: `POST /v1/reservations`.
    fn name(route: &Route) -> String {
        format!("{} {}", route.method, route.path)
    }

    #[test]
    fn allow_lists_the_methods_of_a_template() {
        assert_eq!(allowed_methods(RESERVE.path).as_deref(), Some("POST"));
        assert_eq!(
            allowed_methods(GET_RESERVATION.path).as_deref(),
            Some("GET")
        );
        assert_eq!(allowed_methods("/v1/nowhere"), None);
    }

    #[test]
    fn every_route_is_listed_once() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert!(
                    (a.method, a.path) != (b.method, b.path),
                    "{} listed twice",
                    name(a)
                );
            }
        }
    }

    #[test]
    fn access_table_covers_every_route_once() {
        for route in ALL {
            let entries = ACCESS.iter().filter(|(r, _)| r == route).count();
            assert_eq!(entries, 1, "{} in ACCESS", name(route));
        }
        for (route, _) in ACCESS {
            assert!(ALL.contains(route), "{} not in ALL", name(route));
        }
    }

    #[test]
    fn every_route_says_where_its_skus_are() {
        for route in ALL {
            let entries: Vec<_> = SKU_IN.iter().filter(|(r, _)| r == route).collect();
            assert_eq!(entries.len(), 1, "{} in SKU_IN", name(route));
            // A `{sku}` segment is where the SKU is, a `{reservation_id}` one means the stored
            // reservation's; no other route reads either from the path.
            for (segment, place) in [
                ("{sku}", SkuIn::Path),
                ("{reservation_id}", SkuIn::StoredReservation),
            ] {
                let here = entries[0].1 == place;
                assert_eq!(route.path.contains(segment), here, "{}", name(route));
            }
        }
        assert_eq!(sku_in("POST", Some(ADJUST.path)), Some(SkuIn::Path));
        assert_eq!(sku_in("post", Some(RESERVE.path)), Some(SkuIn::ReserveBody));
        assert_eq!(sku_in("DELETE", Some(ADJUST.path)), Some(SkuIn::Nowhere));
        assert_eq!(sku_in("GET", None), Some(SkuIn::Nowhere));
        assert_eq!(sku_in("POST", Some("/v1/admin/new")), None);
    }

    #[test]
    fn open_routes_are_exactly_the_open_paths_of_the_table() {
        for route in ALL {
            assert_eq!(
                route.access() == Access::Open,
                is_open_path(route.path),
                "{}",
                name(route)
            );
        }
    }

    #[test]
    fn open_path_matching() {
        for open in [
            "/healthz",
            "/metrics",
            "/openapi.json",
            "/docs",
            "/ui/index.html",
        ] {
            assert!(is_open_path(open), "{open}");
        }
        for closed in [
            "/healthz/x",
            "/v1/reservations",
            "/metricsx",
            "/",
            "/uix",
            "/docsx",
            "/v1/cluster/overview",
        ] {
            assert!(!is_open_path(closed), "{closed}");
        }
    }

    #[test]
    fn access_lookup_by_template() {
        assert_eq!(
            access_for("POST", Some(ADJUST.path)),
            Some(Access::Requires(Scope::Admin))
        );
        assert_eq!(
            access_for("get", Some(GET_INVENTORY.path)),
            Some(Access::Requires(Scope::Reserve))
        );
        assert_eq!(
            access_for("GET", Some(INVENTORY_HISTORY.path)),
            Some(Access::Requires(Scope::Admin))
        );
        // Another method on a known template: the answer is 405, no scope needed.
        assert_eq!(access_for("DELETE", Some(ADJUST.path)), None);
        // No route matched: 404.
        assert_eq!(access_for("GET", None), None);
        // A registered template nobody decided about fails closed.
        assert_eq!(
            access_for("POST", Some("/v1/admin/new")),
            Some(Access::Requires(Scope::Admin))
        );
        assert_eq!(Scope::parse("admin"), Some(Scope::Admin));
        assert_eq!(Scope::parse("Admin"), None);
    }
}
