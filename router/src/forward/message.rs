//! What one forward carries: the validated request ([`UpstreamRequest`]), the HTTP request of
//! one attempt built from it (routing headers, the request id, the router's credential and the
//! client it authenticated), and the owner's answer as the client gets it
//! ([`UpstreamResponse`]).

use actix_web::http::StatusCode;
use actix_web::HttpResponse;
use schema::wire::{
    HEADER_ASSIGNMENT_REVISION, HEADER_CLIENT, HEADER_CLIENT_ADMIN, HEADER_CLIENT_POLICY,
    HEADER_EXPECTED_EPOCH, HEADER_HELD_ELSEWHERE, HEADER_ORDER_LINE, HEADER_REQUEST_ID,
};
use serde::de::DeserializeOwned;

use super::Forwarder;
use crate::assignment_cache::Destination;
use crate::error::RouterError;
use crate::upstream::UpstreamHttpRequest;

/// Response header naming the allocator replica that answered (for operators and tests).
pub const HEADER_SERVED_BY: &str = "X-Served-By";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// A request to forward, already validated and routed to a partition.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub method: Method,
    /// Path and query, percent-encoded, starting with `/`.
    pub path: String,
    /// JSON body, re-serialised from the validated request; shared by every attempt.
    pub body: Option<actix_web::web::Bytes>,
    pub partition: u32,
    /// For logs only.
    pub reservation_id: Option<String>,
    /// The reserve of an order line: sent with [`HEADER_ORDER_LINE`].
    pub order_line: bool,
    /// Sent as [`HEADER_HELD_ELSEWHERE`]: a reserve's client's holds on other shards.
    pub held_elsewhere: Option<i64>,
}

impl UpstreamRequest {
    pub fn get(path: String, partition: u32) -> Self {
        UpstreamRequest {
            method: Method::Get,
            path,
            body: None,
            partition,
            reservation_id: None,
            order_line: false,
            held_elsewhere: None,
        }
    }

    pub fn post(path: String, partition: u32) -> Self {
        UpstreamRequest {
            method: Method::Post,
            ..Self::get(path, partition)
        }
    }

    pub fn json<T: serde::Serialize>(mut self, body: &T) -> Result<Self, RouterError> {
        self.body = Some(
            serde_json::to_vec(body)
                .map_err(|e| RouterError::Internal(format!("serialising request: {e}")))?
                .into(),
        );
        Ok(self)
    }

    pub fn reservation(mut self, id: &str) -> Self {
        self.reservation_id = Some(id.to_owned());
        self
    }

    /// Mark the request as the reserve of an order line.
    pub fn order_line(mut self) -> Self {
        self.order_line = true;
        self
    }
}

/// A final answer from an owner.
#[derive(Debug, Clone)]
pub struct UpstreamResponse {
    pub status: u16,
    /// Passed-through headers (lower-case names).
    pub headers: Vec<(String, String)>,
    pub body: actix_web::web::Bytes,
    /// The destination the answer came through.
    pub destination: Destination,
    /// Attempts made (1 when the first one answered).
    pub attempts: u32,
}

impl UpstreamResponse {
    /// Parse the body as JSON, e.g. a `Reservation` or a `Problem`.
    pub fn json<T: DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The client-facing response: the owner's status, body and selected headers, plus which
    /// replica served it under which map revision.
    pub fn into_http_response(self) -> HttpResponse {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut builder = HttpResponse::build(status);
        for (name, value) in &self.headers {
            builder.insert_header((name.as_str(), value.as_str()));
        }
        builder.insert_header((HEADER_SERVED_BY, self.destination.owner_id.as_str()));
        builder.insert_header((
            HEADER_ASSIGNMENT_REVISION,
            self.destination.map_revision.to_string(),
        ));
        builder.body(self.body)
    }
}

impl Forwarder {
    /// The HTTP request of one attempt of `req` to `destination`'s owner.
    pub(super) fn request(
        &self,
        req: &UpstreamRequest,
        destination: &Destination,
    ) -> Result<UpstreamHttpRequest, http::Error> {
        let method = match req.method {
            Method::Get => http::Method::GET,
            Method::Post => http::Method::POST,
        };
        let mut builder = http::Request::builder()
            .method(method)
            .uri(format!("{}{}", destination.owner_url, req.path))
            .header(HEADER_ASSIGNMENT_REVISION, destination.map_revision)
            .header(HEADER_EXPECTED_EPOCH, destination.epoch);
        if let Some(id) = edge::request_id::current() {
            builder = builder.header(HEADER_REQUEST_ID, id.as_str());
        }
        if let Some(credential) = &self.credential {
            // Sensitive: kept out of debug output and HTTP/2 header compression tables.
            if let Ok(mut value) = http::HeaderValue::from_str(&credential.header()) {
                value.set_sensitive(true);
                builder = builder.header(http::header::AUTHORIZATION, value);
            }
        }
        // The client this router authenticated; an allocator believes it only from a caller
        // holding the `router` scope.
        if let Some(client) = access::current_client() {
            builder = builder.header(HEADER_CLIENT, client);
        }
        // An authenticated `admin` client may act on every client's reservations.
        let owner = access::current_owner();
        if owner.client.is_some() && owner.any {
            builder = builder.header(HEADER_CLIENT_ADMIN, "true");
        }
        // Its namespaces and quotas, for checks only the owner can make (a stored reservation's
        // SKU, held units); sent for clients that have any.
        if let Some(policy) = access::current_policy() {
            builder = builder.header(HEADER_CLIENT_POLICY, policy.header());
        }
        if req.order_line {
            builder = builder.header(HEADER_ORDER_LINE, "true");
        }
        if let Some(held) = req.held_elsewhere {
            builder = builder.header(HEADER_HELD_ELSEWHERE, held);
        }
        let body = match &req.body {
            Some(body) => {
                builder = builder.header(http::header::CONTENT_TYPE, "application/json");
                body.clone()
            }
            None => actix_web::web::Bytes::new(),
        };
        builder.body(http_body_util::Full::new(body))
    }
}
