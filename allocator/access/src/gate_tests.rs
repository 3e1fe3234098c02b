//! Unit tests of [`super::Gate`]'s decisions, with real auth files and a made-up clock.

use super::*;
use crate::table::hash_hex;
use actix_web::http::header::{HeaderName, HeaderValue};
use schema::wire::{HEADER_CLIENT, HEADER_CLIENT_POLICY};
use std::io::Write;

/// Metric names for gates built in tests.
pub(crate) const METRICS: MetricNames = MetricNames {
    client_requests: "test_client_requests_total",
    auth_reloads: "test_auth_reloads_total",
    auth_clients: "test_auth_clients",
    quota_refusals: "test_quota_refusals_total",
    tls_reloads: "test_tls_reloads_total",
    unauthenticated: "test_unauthenticated_requests_total",
    audit_suppressed: "test_audit_lines_suppressed_total",
};

/// `admit` as the middleware calls it.
fn admit_at(
    gate: &Gate,
    method: &str,
    path: &str,
    template: Option<&str>,
    headers: &HeaderMap,
) -> Result<Admitted, AccessError> {
    let request = Request {
        method,
        path,
        template,
        headers,
    };
    gate.admit(&request)
}

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
    admit_at(gate, method, "/v1/x", Some(template), headers)
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
    admit_at(&gate, "GET", "/nope", None, &shop).unwrap();
    assert_eq!(
        admit_at(&gate, "GET", "/nope", None, &HeaderMap::new()).unwrap_err(),
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
    admit_at(&gate, "GET", "/healthz", Some("/healthz"), &basic).unwrap();
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
    admit_at(&gate, "GET", "/readyz", Some("/readyz"), &HeaderMap::new()).unwrap();
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

fn ask_sku(
    gate: &Gate,
    (method, template): (&str, &str),
    sku: Option<&str>,
    headers: &HeaderMap,
) -> Result<Admitted, AccessError> {
    let path = match sku {
        Some(sku) => template.replace("{sku}", sku),
        None => template.to_owned(),
    };
    let request = Request {
        method,
        path: &path,
        template: Some(template),
        headers,
    };
    gate.admit(&request)
}

const INVENTORY: (&str, &str) = ("GET", "/v1/inventory/{sku}");

#[test]
fn a_namespaced_client_is_held_to_its_skus_and_cap() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        file,
        "acme reserve,admin {} skus=acme:* max_quantity=2",
        hash_hex(b"t-acme")
    )
    .unwrap();
    writeln!(file, "shop reserve {}", hash_hex(b"t-shop")).unwrap();
    let gate = gate(Role::Router, &file, |_| {});
    let acme = headers(Some("t-acme"), None);
    assert_eq!(
        ask_sku(&gate, INVENTORY, Some("other:1"), &acme).unwrap_err(),
        AccessError::OutsideNamespace {
            client: "acme".into(),
            sku: "other:1".into()
        }
    );
    let read = ask_sku(&gate, INVENTORY, Some("acme:1"), &acme).unwrap();
    assert_eq!(read.body_check, None);
    assert!(!read.admin_write);
    let adjust = ask_sku(&gate, ADJUST, Some("acme:1"), &acme).unwrap();
    assert!(adjust.admin_write, "adjustments are audited");
    // A body route asks for the body, then decides on it.
    let reserve = ask_sku(&gate, RESERVE, None, &acme).unwrap();
    assert_eq!(reserve.body_check, Some(BodyCheck::Reserve));
    let request = Request {
        method: "POST",
        path: "/v1/reservations",
        template: Some(RESERVE.1),
        headers: &acme,
    };
    let body = br#"{"reservation_id": "r", "sku": "acme:1", "quantity": 3}"#;
    assert!(matches!(
        gate.check_body(&reserve, &request, body),
        Err(AccessError::QuotaExceeded { limit: 2, .. })
    ));
    let body = br#"{"reservation_id": "r", "sku": "acme:1", "quantity": 2}"#;
    gate.check_body(&reserve, &request, body).unwrap();
    // An unrestricted client's requests are never held for their body.
    let shop = headers(Some("t-shop"), None);
    let free = ask_sku(&gate, RESERVE, None, &shop).unwrap();
    assert!(free.body_check.is_none() && free.policy.is_none());
    assert!(ask_sku(&gate, INVENTORY, Some("other:1"), &shop).is_ok());
}

fn with_policy(mut map: HeaderMap, policy: &str) -> HeaderMap {
    map.insert(
        HeaderName::from_static(HEADER_CLIENT_POLICY),
        HeaderValue::from_str(policy).unwrap(),
    );
    map
}

#[test]
fn an_allocator_takes_the_policy_a_router_forwards_and_only_from_a_router() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "router-1 router {}", hash_hex(b"t-router")).unwrap();
    writeln!(file, "acme reserve {} skus=acme:*", hash_hex(b"t-acme")).unwrap();
    let gate = gate(Role::Allocator, &file, |_| {});
    let routed = with_policy(headers(Some("t-router"), Some("acme")), "skus=acme:*");
    assert!(matches!(
        ask_sku(&gate, INVENTORY, Some("other:1"), &routed),
        Err(AccessError::OutsideNamespace { client, .. }) if client == "acme"
    ));
    let admitted = ask_sku(&gate, INVENTORY, Some("acme:1"), &routed).unwrap();
    assert_eq!(admitted.policy.unwrap().header(), "skus=acme:*");
    // A direct caller keeps its own namespaces whatever it sends.
    let loosening = with_policy(headers(Some("t-acme"), None), "skus=other:*");
    assert!(ask_sku(&gate, INVENTORY, Some("other:1"), &loosening).is_err());
    // A router that sends nonsense is refused, not trusted with less.
    let broken = with_policy(headers(Some("t-router"), Some("acme")), "skus=*");
    assert!(matches!(
        ask_sku(&gate, INVENTORY, Some("acme:1"), &broken),
        Err(AccessError::MalformedPolicy { .. })
    ));
    // With authentication off a forwarded policy still narrows.
    let open = Gate::new(Role::Allocator, Settings::off(), METRICS).unwrap();
    let anonymous = with_policy(HeaderMap::new(), "skus=acme:*");
    assert!(ask_sku(&open, INVENTORY, Some("other:1"), &anonymous).is_err());
    assert!(ask_sku(&open, INVENTORY, Some("other:1"), &HeaderMap::new()).is_ok());
}

#[test]
fn the_owner_is_the_client_and_admin_comes_from_its_scopes_or_its_router() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let (router, shop, ops) = (
        hash_hex(b"t-router"),
        hash_hex(b"t-shop"),
        hash_hex(b"t-ops"),
    );
    let shop_line = format!("shop reserve {shop} max_held_per_sku=2 max_held_units=7");
    writeln!(file, "r router {router}\n{shop_line}\nops reserve,admin {ops}").unwrap();
    let owner = |gate: &Gate, map: HeaderMap| ask(gate, RESERVE, &map).map(|a| a.owner);
    let admin = |mut map: HeaderMap| {
        let name = HeaderName::from_static(schema::wire::HEADER_CLIENT_ADMIN);
        map.insert(name, HeaderValue::from_static("true"));
        map
    };
    let router = gate(Role::Router, &file, |_| {});
    let shop = owner(&router, headers(Some("t-shop"), None)).unwrap();
    assert_eq!(
        (shop.client.as_deref(), shop.held_per_sku_quota()),
        (Some("shop"), Some(2))
    );
    assert_eq!(shop.held_units_quota(), Some(7));
    assert!(!shop.any);
    let allocator = gate(Role::Allocator, &file, |_| {});
    let routed = owner(&allocator, admin(headers(Some("t-router"), Some("bob")))).unwrap();
    assert_eq!((routed.client.as_deref(), routed.any), (Some("bob"), true));
    let plain = owner(&allocator, headers(Some("t-router"), Some("bob"))).unwrap();
    assert!(!plain.any);
    let spoofed = owner(&allocator, admin(headers(Some("t-shop"), Some("ops")))).unwrap();
    assert_eq!(
        (spoofed.client.as_deref(), spoofed.any),
        (Some("shop"), false)
    );
    assert!(owner(&allocator, headers(Some("t-ops"), None)).unwrap().any);
    let open = Gate::new(Role::Allocator, Settings::off(), METRICS).unwrap();
    assert_eq!(owner(&open, HeaderMap::new()).unwrap(), Owner::ANYONE);
}

#[path = "gate_limits_tests.rs"]
mod limits;
