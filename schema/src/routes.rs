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
pub const RESERVE_ORDER: Route =
    route("POST", "/v1/orders/{order_id}/reservations", Served::Router);
pub const PARTITIONS: Route = route("GET", "/v1/partitions", Served::Both);
pub const SETTLEMENT_STATUS: Route = route("GET", "/v1/jobs/settlement", Served::Both);
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
    RESERVE_ORDER,
    PARTITIONS,
    SETTLEMENT_STATUS,
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

impl Route {
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
                    "{} {} listed twice",
                    a.method,
                    a.path
                );
            }
        }
    }
}
