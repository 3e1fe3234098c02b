//! One path for every decision: the outermost middleware of both services puts the request's
//! path into its canonical form ([`schema::path::canonical`]) before anything reads it.
//!
//! actix-web routes on the percent-decoded path, but a request's raw path is what everything
//! before the router reads: the access gate's route template and SKU segment, audit lines, the
//! route label of a metric, a `404`'s words. Left as sent, `/v1/%69nventory/x/adjustments` is
//! served as an adjustment while the gate finds no route for it and lets it through. Rewritten
//! here once, the raw path and the path the handler sees name the same route, so no decision can
//! be taken on one and served on the other. A path with a `%` that starts no escape is refused
//! with `400` (nothing could decode it the same way twice).

use std::future::{ready, Future};

use actix_web::body::EitherBody;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse};
use actix_web::http::uri::{PathAndQuery, Uri};
use actix_web::ResponseError;
use futures::future::{Either, TryFutureExt};

use crate::problem::Refusal;

/// The request's URI with `path` in place of its path, the query kept.
fn with_path(uri: &Uri, path: &str) -> Option<Uri> {
    let mut parts = uri.clone().into_parts();
    let target = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    parts.path_and_query = Some(PathAndQuery::from_maybe_shared(target).ok()?);
    Uri::from_parts(parts).ok()
}

/// Put the request's path into its canonical form, or say why it has none.
fn canonicalise(request: &mut ServiceRequest) -> Result<(), String> {
    let canonical = schema::path::canonical(request.path()).map_err(|error| error.to_string())?;
    let Some(path) = canonical else {
        return Ok(());
    };
    let uri = with_path(request.uri(), &path).ok_or("the path has no canonical form")?;
    // Nothing has matched yet (this middleware is the outermost), so the match info is only the
    // path the router will read: re-read it from the new URI.
    request.match_info_mut().get_mut().update(&uri);
    request.head_mut().uri = uri;
    Ok(())
}

/// Middleware (`App::wrap_fn`, outermost): see the module documentation.
pub fn middleware<S, B>(
    mut request: ServiceRequest,
    service: &S,
) -> impl Future<Output = Result<ServiceResponse<EitherBody<B>>, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
{
    match canonicalise(&mut request) {
        Ok(()) => Either::Left(
            service
                .call(request)
                .map_ok(ServiceResponse::map_into_left_body),
        ),
        Err(detail) => Either::Right(ready(Ok(request
            .into_response(Refusal::invalid(detail).error_response())
            .map_into_right_body()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::{test, web, App, HttpRequest, HttpResponse};

    async fn echo(request: HttpRequest, sku: web::Path<String>) -> HttpResponse {
        HttpResponse::Ok().body(format!(
            "{} {} {}",
            request.path(),
            request.match_pattern().unwrap_or_default(),
            sku.into_inner()
        ))
    }

    #[actix_web::test]
    async fn the_handler_and_everything_before_it_see_one_path() {
        let app = test::init_service(
            App::new()
                .wrap_fn(|request, service| {
                    // What a middleware inside sees: the canonical path and its template.
                    let seen = format!(
                        "{}|{}",
                        request.path(),
                        request.match_pattern().unwrap_or_default()
                    );
                    let call = service.call(request);
                    async move {
                        let mut response = call.await?;
                        response.headers_mut().insert(
                            actix_web::http::header::HeaderName::from_static("x-seen"),
                            actix_web::http::header::HeaderValue::from_str(&seen).unwrap(),
                        );
                        Ok(response)
                    }
                })
                .wrap_fn(middleware)
                .route("/v1/inventory/{sku}", web::get().to(echo)),
        )
        .await;
        for (sent, path, sku) in [
            ("/v1/inventory/a%3a1", "/v1/inventory/a%3a1", "a:1"),
            ("/v1/%69nventory/a%2fb", "/v1/inventory/a%2fb", "a/b"),
            ("/v1/%49nventory/x?y=%41", "/v1/Inventory/x", ""),
            ("/%76%31/inventory/%7e", "/v1/inventory/~", "~"),
        ] {
            let request = test::TestRequest::get().uri(sent).to_request();
            let response = test::call_service(&app, request).await;
            let seen = response.headers().get("x-seen").unwrap().to_str().unwrap();
            let template = if sku.is_empty() {
                ""
            } else {
                "/v1/inventory/{sku}"
            };
            assert_eq!(seen, format!("{path}|{template}"), "{sent}");
            if !sku.is_empty() {
                let body = test::read_body(response).await;
                assert_eq!(
                    body,
                    format!("{path} {template} {sku}").into_bytes(),
                    "{sent}"
                );
            }
        }
    }

    #[actix_web::test]
    async fn a_percent_that_starts_no_escape_is_a_400_problem() {
        let app = test::init_service(
            App::new()
                .wrap_fn(middleware)
                .route("/v1/inventory/{sku}", web::get().to(echo)),
        )
        .await;
        let request = test::TestRequest::get()
            .uri("/v1/%%36%39nventory/x")
            .to_request();
        let response = test::call_service(&app, request).await;
        assert_eq!(response.status(), 400);
        assert_eq!(
            response.headers().get("content-type").unwrap(),
            schema::wire::PROBLEM_CONTENT_TYPE
        );
    }
}
