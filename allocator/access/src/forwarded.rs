//! What a router's headers say about the client it forwards for ([`HEADER_CLIENT`],
//! [`HEADER_CLIENT_ADMIN`], [`HEADER_CLIENT_POLICY`]): read once per request, in one place, and
//! believed only from a caller that may speak for a client.

use std::sync::Arc;

use actix_web::http::header::{HeaderMap, HeaderValue};
use schema::routes::Scope;
use schema::wire::{HEADER_CLIENT, HEADER_CLIENT_ADMIN, HEADER_CLIENT_POLICY, HEADER_HELD_ELSEWHERE};

use crate::error::AccessError;
use crate::owner::Owner;
use crate::policy::Policy;
use crate::settings::Role;
use crate::table::{valid_name, Client};

/// What a router's headers say about the client it forwards for, read once per request and only
/// where they are believed: on an allocator, from a caller holding the `router` scope (or, for
/// the policy alone, from anyone with authentication off, where it can only narrow what an
/// anonymous caller may do).
pub(crate) struct Forwarded<'h> {
    /// An allocator's caller that may speak for a client: the `router` scope, or anyone with
    /// authentication off (then only the network protects the allocators).
    pub(crate) from_router: bool,
    /// The client an authenticated router names in [`HEADER_CLIENT`], if it is a valid name.
    client: Option<&'h str>,
    /// [`HEADER_CLIENT_ADMIN`]`: true` with a named client: the router's client holds `admin`.
    admin: bool,
    /// [`HEADER_CLIENT_POLICY`], unparsed until [`Forwarded::policy`].
    policy: Option<&'h HeaderValue>,
    /// [`HEADER_HELD_ELSEWHERE`]: units the client holds on other shards (0 when absent).
    pub(crate) held_elsewhere: i64,
}

impl<'h> Forwarded<'h> {
    pub(crate) fn read(role: Role, caller: Option<&Client>, headers: &'h HeaderMap) -> Self {
        let from_router =
            role == Role::Allocator && caller.is_none_or(|c| c.scopes.contains(Scope::Router));
        if !from_router {
            return Forwarded {
                from_router,
                client: None,
                admin: false,
                policy: None,
                held_elsewhere: 0,
            };
        }
        let client = caller.and_then(|_| {
            headers
                .get(HEADER_CLIENT)
                .and_then(|v| v.to_str().ok())
                .filter(|name| valid_name(name))
        });
        let admin = client.is_some()
            && headers
                .get(HEADER_CLIENT_ADMIN)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"));
        // A count that is not a non-negative integer is ignored: it can only narrow the quota.
        let held_elsewhere = headers
            .get(HEADER_HELD_ELSEWHERE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .unwrap_or(0);
        Forwarded {
            from_router,
            client,
            admin,
            policy: headers.get(HEADER_CLIENT_POLICY),
            held_elsewhere,
        }
    }

    /// The namespaces and quotas the request is held to: the caller's own line, or on an
    /// allocator the policy a router forwards for its client.
    pub(crate) fn policy(&self, caller: Option<&Client>) -> Result<Option<Arc<Policy>>, AccessError> {
        if !self.from_router {
            return Ok(caller.and_then(|c| c.policy.clone()));
        }
        let Some(value) = self.policy else {
            return Ok(None);
        };
        let text = value.to_str().map_err(|_| AccessError::MalformedPolicy {
            reason: "not visible ASCII".into(),
        })?;
        let policy = Policy::parse_options(text)
            .map_err(|reason| AccessError::MalformedPolicy { reason })?;
        Ok((!policy.is_empty()).then(|| Arc::new(policy)))
    }
}

/// The client an authenticated caller's request is for: its own name, or on an allocator the
/// client a router says it forwards for.
pub(crate) fn effective_client(caller: &Client, forwarded: &Forwarded<'_>) -> String {
    forwarded
        .client
        .map_or_else(|| caller.name.clone(), str::to_owned)
}

/// Who the request acts for as an owner: nobody in particular with authentication off; the
/// caller itself (`admin` by its own scopes); on an allocator, the client a router names, `admin`
/// as the router says ([`HEADER_CLIENT_ADMIN`]).
pub(crate) fn owner(caller: Option<&Client>, client: &str, forwarded: &Forwarded<'_>) -> Owner {
    let Some(caller) = caller else {
        return Owner::ANYONE;
    };
    let admin = if forwarded.client.is_some() {
        forwarded.admin
    } else {
        caller.scopes.contains(Scope::Admin)
    };
    Owner::client(client, admin)
}
