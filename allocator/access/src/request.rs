//! What the gate, the body checks and the audit log look at in one request.

use actix_web::http::header::HeaderMap;

/// What the gate looks at in one request.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    /// As requested.
    pub path: &'a str,
    /// The route template it matched, if any.
    pub template: Option<&'a str>,
    pub headers: &'a HeaderMap,
}
