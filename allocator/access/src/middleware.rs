//! The actix middleware that applies a [`Gate`] to every request of an `App`.
//!
//! Wrap it innermost (`.wrap(AccessControl::new(gate))` before the request-id and latency
//! middlewares) so that refusals are logged under the request's id and counted by route and
//! status like any other answer: the whole decision runs inside the future the request-id
//! middleware instruments.
//!
//! The body is read here only when the decision needs it: a request of a client whose policy
//! looks at SKUs or quantities on a route that names them in its body, and administrative writes
//! (for the ids in their audit line). It is read up to the services' body limit and handed on
//! unchanged; every other request streams to its handler as before.

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse, Transform};
use actix_web::web::{Bytes, BytesMut};
use actix_web::{Error, HttpMessage, ResponseError};
use futures::StreamExt;
use schema::wire::limits::BODY_MAX_BYTES;

use crate::audit;
use crate::check::{audited_ids, path_sku};
use crate::gate::{Gate, Request, ANONYMOUS};
use crate::limits::InFlight;
use crate::owner::Owner;
use crate::policy::{HoldQuotas, Policy};

/// The client a request is served for, and what it may touch.
#[derive(Debug, Clone)]
struct Current {
    client: String,
    policy: Option<Arc<Policy>>,
    owner: Owner,
    /// The request's in-flight slot: shared with the work it spawns ([`with_current_client`]),
    /// so the slot is free only once the answer is ready and every such task has ended, not
    /// when the client disconnects from work that goes on (an order). Held for its drop only.
    _slot: Option<Arc<InFlight>>,
}

tokio::task_local! {
    /// The client the current request is served for; the router's forwarder reads it.
    static CURRENT: Current;
}

/// The client the request being served by this task is for (`None` on open paths and outside a
/// request).
pub fn current_client() -> Option<String> {
    CURRENT.try_with(|c| c.client.clone()).ok()
}

/// The namespaces and quotas of the current request's client, if it has any: a router forwards
/// them ([`schema::wire::HEADER_CLIENT_POLICY`], [`Policy::header`]); an allocator hands the
/// held-unit quotas to the fenced batch.
pub fn current_policy() -> Option<Arc<Policy>> {
    CURRENT.try_with(|c| c.policy.clone()).ok().flatten()
}

/// The held-unit quotas of the current request's client (none outside a request or for a client
/// without them): what an allocator hands the fenced batch with a reservation, which alone can
/// decide them against what the client holds. `per_sku` is enforced there (it reaches the batch
/// through [`current_owner`]); `units` is not yet.
pub fn current_hold_quotas() -> HoldQuotas {
    current_policy().map_or_else(HoldQuotas::default, |p| p.hold_quotas())
}

/// Whether the current request's client may see a stored object of `sku` (a reservation read
/// or changed by id). `false` is audited; the caller answers `404`, so nothing tells the client
/// the object exists.
pub fn sku_visible(sku: &str) -> bool {
    CURRENT
        .try_with(|current| match &current.policy {
            Some(policy) if !policy.permits(sku) => {
                audit::hidden(&current.client, sku);
                false
            }
            _ => true,
        })
        .unwrap_or(true)
}

/// The owner the current request records on what it creates, and whose reservations and orders
/// it may act on ([`Owner::ANYONE`] outside a request and with authentication off).
pub fn current_owner() -> Owner {
    CURRENT
        .try_with(|c| c.owner.clone())
        .unwrap_or(Owner::ANYONE)
}

/// Whether the current request's client may see a stored reservation or order whose owner is
/// `stored` ([`Owner::may_act_on`]). `false` is audited; the caller answers exactly as for an
/// unknown id, so nothing tells the client the object exists.
pub fn owner_visible(stored: Option<&str>) -> bool {
    let owner = current_owner();
    if owner.may_act_on(stored) {
        return true;
    }
    audit::not_owner(owner.client.as_deref().unwrap_or(ANONYMOUS));
    false
}

/// Run `future` (spawned for the current request) as the current request's client, holding
/// the request's in-flight slot until it ends.
pub fn with_current_client<F: Future>(future: F) -> impl Future<Output = F::Output> {
    let current = CURRENT.try_with(Clone::clone).ok();
    async move {
        match current {
            Some(current) => CURRENT.scope(current, future).await,
            None => future.await,
        }
    }
}

/// `App::wrap(AccessControl::new(gate))`.
#[derive(Clone)]
pub struct AccessControl {
    gate: Arc<Gate>,
}

impl AccessControl {
    pub fn new(gate: Arc<Gate>) -> Self {
        AccessControl { gate }
    }
}

impl<S, B> Transform<S, ServiceRequest> for AccessControl
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Transform = AccessService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(AccessService {
            service: Rc::new(service),
            gate: self.gate.clone(),
        }))
    }
}

pub struct AccessService<S> {
    service: Rc<S>,
    gate: Arc<Gate>,
}

type LocalBoxFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// An administrative write's audit facts, kept past the request.
struct AdminWrite {
    client: String,
    method: String,
    path: String,
    sku: Option<String>,
    ids: String,
}

fn facts<'a>(request: &'a ServiceRequest, template: Option<&'a str>) -> Request<'a> {
    Request {
        method: request.method().as_str(),
        path: request.path(),
        template,
        headers: request.headers(),
    }
}

/// The route template of the path the router will dispatch on: the percent-decoded path (all but
/// `%2F`, `%25`, `%2B`), not the raw one `match_pattern` reads before routing. The services' edge
/// puts the raw path into its canonical form first (`edge::canonical`), which makes the two
/// agree; reading the template here from the dispatched path keeps the gate right on its own.
fn route_template(request: &ServiceRequest) -> Option<String> {
    request
        .resource_map()
        .match_pattern(request.match_info().as_str())
}

/// The request's body, up to one byte past the limit (the handler then answers `413`), put
/// back for the handler. A body that breaks off is handed on as far as it came, for the handler
/// to refuse.
async fn read_body(request: &mut ServiceRequest) -> Bytes {
    let mut payload = request.take_payload();
    let mut body = BytesMut::new();
    while let Some(Ok(chunk)) = payload.next().await {
        body.extend_from_slice(&chunk);
        if body.len() > BODY_MAX_BYTES {
            break;
        }
    }
    let body = body.freeze();
    request.set_payload(Payload::from(body.clone()));
    body
}

impl<S, B> Service<ServiceRequest> for AccessService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<B>>;
    type Error = Error;
    type Future = LocalBoxFuture<Result<Self::Response, Self::Error>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, mut request: ServiceRequest) -> Self::Future {
        let gate = self.gate.clone();
        let service = self.service.clone();
        Box::pin(async move {
            let template = route_template(&request);
            let decision = gate.admit(&facts(&request, template.as_deref()));
            let admitted = match decision {
                Ok(admitted) => admitted,
                Err(error) => {
                    let response = request.into_response(error.error_response());
                    return Ok(response.map_into_right_body());
                }
            };
            if admitted.trusted_router {
                use actix_web::HttpMessage;
                request.extensions_mut().insert(crate::gate::TrustedRouter);
            }
            let body = if admitted.body_check.is_some() || admitted.admin_write {
                Some(read_body(&mut request).await)
            } else {
                None
            };
            if let (Some(body), Some(_)) = (&body, admitted.body_check) {
                let checked =
                    gate.check_body(&admitted, &facts(&request, template.as_deref()), body);
                if let Err(error) = checked {
                    let response = request.into_response(error.error_response());
                    return Ok(response.map_into_right_body());
                }
            }
            // What the audit line of an administrative write needs once the request is gone.
            let audit = admitted.admin_write.then(|| AdminWrite {
                client: admitted
                    .client
                    .clone()
                    .unwrap_or_else(|| ANONYMOUS.to_owned()),
                method: request.method().as_str().to_owned(),
                path: request.path().to_owned(),
                sku: path_sku(&facts(&request, template.as_deref())),
                ids: body.as_deref().map(audited_ids).unwrap_or_default(),
            });
            let call = service.call(request);
            // The in-flight slot is held until the answer is ready, and by any task the
            // handler spawned as this client until it ends.
            let response = match admitted.client {
                Some(client) => {
                    let current = Current {
                        client,
                        policy: admitted.policy,
                        owner: admitted.owner,
                        _slot: admitted.slot.map(Arc::new),
                    };
                    CURRENT.scope(current, call).await
                }
                None => call.await,
            };
            if let Some(write) = audit {
                let status = match &response {
                    Ok(response) => response.status().as_u16(),
                    Err(error) => error.as_response_error().status_code().as_u16(),
                };
                audit::admin_write(
                    &write.client,
                    &write.method,
                    template.as_deref(),
                    &write.path,
                    write.sku.as_deref(),
                    &write.ids,
                    status,
                );
            }
            Ok(response?.map_into_left_body())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{Role, Settings};
    use crate::table::hash_hex;
    use actix_web::{test, web, App, HttpResponse};
    use std::io::Write;

    use crate::gate::tests::METRICS;

    /// Without the services' canonical-path edge in front, the gate still takes its decision on
    /// the path actix dispatches on: an escaped letter does not hide the route's scope (before,
    /// the raw path matched no template and the request was let through: `201`).
    #[actix_web::test]
    async fn the_scope_is_that_of_the_route_the_request_is_dispatched_to() {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        writeln!(file, "shop reserve {}", hash_hex(b"shop-token")).unwrap();
        let settings = Settings {
            auth_file: Some(file.path().to_owned()),
            ..Settings::off()
        };
        let gate = Arc::new(Gate::new(Role::Router, settings, METRICS).unwrap());
        let app = test::init_service(
            App::new().wrap(AccessControl::new(gate)).route(
                schema::routes::ADJUST.path,
                web::post().to(|| async { HttpResponse::Created().finish() }),
            ),
        )
        .await;
        for path in [
            "/v1/inventory/x/adjustments",
            "/v1/%69nventory/x/adjustments",
            "/v1/inventory/x/%61djustments",
            "/%76%31/inventory/x/adjustments",
        ] {
            let request = test::TestRequest::post()
                .uri(path)
                .insert_header(("authorization", "Bearer shop-token"))
                .to_request();
            let response = test::call_service(&app, request).await;
            assert_eq!(response.status(), 403, "{path}");
        }
    }
}
