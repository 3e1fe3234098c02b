//! Problem+json (RFC 9457) answers for requests that never reach a handler, the same on the
//! allocator and the router: a JSON body or a path segment that does not parse, an oversized
//! body, an unknown path, a method the path does not serve. Each service's own errors render
//! through [`builder`] and [`body`] too, so every problem carries the same content type and a
//! `503` the same `Retry-After`.
//!
//! Values the wire types refuse are answered in the rule's own words
//! ([`schema::wire::rule_violation`]), so a bad quantity reads the same whoever refuses it.

use actix_web::error::{JsonPayloadError, PathError};
use actix_web::http::header;
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse, HttpResponseBuilder, ResponseError};
use schema::wire::{limits, rule_violation, Problem, ProblemType, PROBLEM_CONTENT_TYPE};

/// Seconds a client should wait before retrying a `503`.
pub const RETRY_AFTER_SECONDS: &str = "1";

/// A response with `status` about to carry a problem: the problem content type, and
/// `Retry-After` on a `503`. Callers add their own headers, then [`body`].
pub fn builder(status: StatusCode) -> HttpResponseBuilder {
    let mut builder = HttpResponse::build(status);
    builder.insert_header((header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE));
    if status == StatusCode::SERVICE_UNAVAILABLE {
        builder.insert_header((header::RETRY_AFTER, RETRY_AFTER_SECONDS));
    }
    builder
}

/// Finish `builder` with `problem` (any serialisable document: orders add fields of their own).
pub fn body<T: serde::Serialize>(mut builder: HttpResponseBuilder, problem: &T) -> HttpResponse {
    match serde_json::to_vec(problem) {
        Ok(body) => builder.body(body),
        // Serialising plain structs cannot fail; answer something well-formed anyway.
        Err(_) => HttpResponse::InternalServerError()
            .insert_header((header::CONTENT_TYPE, PROBLEM_CONTENT_TYPE))
            .body(r#"{"type":"urn:allocator:problem:internal","title":"Internal error","status":500}"#),
    }
}

/// The whole answer for `problem`, with the status it names.
pub fn respond(problem: &Problem) -> HttpResponse {
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::BAD_REQUEST);
    body(builder(status), problem)
}

/// A request refused at the edge, as an `actix_web::Error` carrying its problem.
#[derive(Debug)]
pub struct Refusal(pub Problem);

impl Refusal {
    /// `400 invalid-request` with `detail`.
    pub fn invalid(detail: impl Into<String>) -> Refusal {
        Refusal(Problem::new(ProblemType::InvalidRequest, detail))
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.detail.as_deref().unwrap_or(&self.0.title))
    }
}

impl ResponseError for Refusal {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.0.status).unwrap_or(StatusCode::BAD_REQUEST)
    }

    fn error_response(&self) -> HttpResponse {
        respond(&self.0)
    }
}

/// What a JSON body that cannot be read is answered with: `413` when it is over
/// [`limits::BODY_MAX_BYTES`], `400` otherwise.
pub fn json_refusal(error: &JsonPayloadError) -> Refusal {
    match error {
        JsonPayloadError::Overflow { limit }
        | JsonPayloadError::OverflowKnownLength { limit, .. } => Refusal(
            Problem::new(
                ProblemType::InvalidRequest,
                format!("request body is larger than {limit} bytes"),
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE.as_u16()),
        ),
        JsonPayloadError::Deserialize(e) => Refusal::invalid(
            rule_violation(&e.to_string())
                .map_or_else(|| format!("invalid body: {e}"), str::to_owned),
        ),
        JsonPayloadError::ContentType => Refusal::invalid("content type must be application/json"),
        other => Refusal::invalid(format!("invalid body: {other}")),
    }
}

/// What a path segment that does not parse is answered with (`400`).
pub fn path_refusal(error: &PathError) -> Refusal {
    let rule = match error {
        PathError::Deserialize(e) => rule_violation(&e.to_string()).map(str::to_owned),
        _ => None,
    };
    Refusal::invalid(rule.unwrap_or_else(|| format!("invalid path: {error}")))
}

/// JSON bodies: bounded size, unknown fields refused by the wire types, every failure a 4xx
/// problem ([`json_refusal`]). The content type is not enforced.
pub fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(limits::BODY_MAX_BYTES)
        .content_type_required(false)
        .error_handler(|error, _| json_refusal(&error).into())
}

/// Path segments: every failure a `400` problem ([`path_refusal`]).
pub fn path_config() -> web::PathConfig {
    web::PathConfig::default().error_handler(|error, _| path_refusal(&error).into())
}

/// The default service: an unknown path is a `404` problem rather than an empty answer.
pub async fn not_found(request: HttpRequest) -> HttpResponse {
    respond(&Problem::new(
        ProblemType::NotFound,
        format!("no route for {}", request.path()),
    ))
}

/// A resource's default service: a method the path does not serve is a `405` problem with
/// `Allow` listing the methods it does ([`schema::routes::allowed_methods`]).
pub async fn method_not_allowed(request: HttpRequest) -> HttpResponse {
    let problem = Problem::new(
        ProblemType::InvalidRequest,
        format!("{} is not allowed on {}", request.method(), request.path()),
    )
    .with_status(StatusCode::METHOD_NOT_ALLOWED.as_u16());
    let mut response = builder(StatusCode::METHOD_NOT_ALLOWED);
    if let Some(allow) = request
        .match_pattern()
        .and_then(|pattern| schema::routes::allowed_methods(&pattern))
    {
        response.insert_header((header::ALLOW, allow));
    }
    body(response, &problem)
}

/// A resource for `path`, named by its path template (so metrics can label a request with its
/// route without building a string per request), answering [`method_not_allowed`] for methods
/// it does not serve.
pub fn resource(path: &str) -> actix_web::Resource {
    web::resource(path)
        .name(path)
        .default_service(web::to(method_not_allowed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::body::MessageBody;

    fn problem_of(response: HttpResponse) -> (StatusCode, serde_json::Value) {
        assert_eq!(
            response.headers().get(header::CONTENT_TYPE).unwrap(),
            PROBLEM_CONTENT_TYPE
        );
        let status = response.status();
        let bytes = response.into_body().try_into_bytes().expect("a full body");
        (
            status,
            serde_json::from_slice(&bytes).expect("a JSON problem"),
        )
    }

    #[test]
    fn an_oversized_body_is_413_invalid_request() {
        let refusal = json_refusal(&JsonPayloadError::Overflow { limit: 64 });
        let (status, problem) = problem_of(refusal.error_response());
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(problem["status"], 413);
        assert_eq!(problem["type"], "urn:allocator:problem:invalid-request");
        assert_eq!(problem["detail"], "request body is larger than 64 bytes");
    }

    #[test]
    fn a_body_that_does_not_parse_is_400_with_the_parsers_words() {
        let error = serde_json::from_str::<u32>("{").unwrap_err();
        let (status, problem) =
            problem_of(json_refusal(&JsonPayloadError::Deserialize(error)).error_response());
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .starts_with("invalid body: "),
            "{problem}"
        );
    }

    #[test]
    fn a_service_unavailable_problem_says_when_to_retry() {
        let response = body(
            builder(StatusCode::SERVICE_UNAVAILABLE),
            &Problem::default(),
        );
        assert_eq!(
            response.headers().get(header::RETRY_AFTER).unwrap(),
            RETRY_AFTER_SECONDS
        );
        let response = body(builder(StatusCode::CONFLICT), &Problem::default());
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
    }
}
