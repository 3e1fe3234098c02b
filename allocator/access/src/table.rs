//! The auth file and the token table read from it.
//!
//! One line per client, fields separated by whitespace:
//!
//! ```text
//! # name      scopes          sha256 of the token (64 hex digits)                                  options
//! orders-eu   reserve         9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//! ops         reserve,admin   60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752 rate=5
//! acme-shop   reserve         2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae skus=acme:* max_quantity=2
//! router-1    router          fd61a03af4f77d870fc21e05e7e80678095c92d808cfb3b5c279ee04c74aca13
//! ```
//!
//! The file holds hashes, never tokens: whoever reads it (a backup, a config repository, a
//! support bundle) learns nothing that lets them call the API, because tokens are random and long
//! enough that a hash cannot be reversed by guessing. `#` starts a comment; blank lines are
//! ignored. Options after the hash: `rate=PER_SEC` and `burst=N` override the service's
//! per-client limits for this client; `skus=`, `max_quantity=`, `max_held_per_sku=` and
//! `max_held_units=` confine it to SKU namespaces and set its quotas ([`crate::policy`]).
//!
//! A client may be listed on two (or more) lines with different tokens, to rotate its token
//! without a new name: every token authenticates as that one client (one owner, one quota, one
//! rate bucket, one in-flight count, all keyed by the name), so its lines must agree on scopes and
//! options.
//!
//! Parsing is strict: a line that does not read exactly as above, an unknown scope, lines of one
//! name that disagree, a duplicate hash, or a file without any client is refused with the file
//! and line, because a half-understood access list is worse than none at all.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use crate::policy::{self, Policy};

use schema::routes::Scope;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

/// Longest client name; names are metric label values and header values.
pub const NAME_MAX_LEN: usize = 64;

/// A set of [`Scope`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scopes(u8);

impl Scopes {
    pub const fn bit(scope: Scope) -> u8 {
        match scope {
            Scope::Reserve => 1,
            Scope::Admin => 2,
            Scope::Router => 4,
        }
    }

    pub fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, s| bits | Self::bit(*s)))
    }

    pub fn contains(self, scope: Scope) -> bool {
        self.0 & Self::bit(scope) != 0
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Scope::ALL
            .into_iter()
            .filter(|s| self.contains(*s))
            .map(Scope::as_str)
            .collect();
        f.write_str(&names.join(","))
    }
}

/// One line of the auth file.
#[derive(Debug, Clone, PartialEq)]
pub struct Client {
    pub name: String,
    pub scopes: Scopes,
    /// Overrides the service's per-client rate (requests per second).
    pub rate: Option<f64>,
    /// Overrides the service's per-client burst.
    pub burst: Option<u32>,
    /// Namespaces and quotas; `None` when the line sets none.
    pub policy: Option<Arc<Policy>>,
}

/// Why an auth file was refused. The message names the file and, for a bad line, its number.
#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("cannot read auth file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("{path}: lists no client; every request would be refused (omit the auth file to turn authentication off)")]
    Empty { path: String },
}

/// The clients of one auth file, looked up by the SHA-256 of a presented token.
#[derive(Debug, Default)]
pub struct TokenTable {
    entries: Vec<([u8; 32], Client)>,
}

/// Whether `name` may name a client: 1–64 of `A-Z a-z 0-9 . _ -`, so it is safe as a metric
/// label, a log field and a header value.
pub fn valid_name(name: &str) -> bool {
    (1..=NAME_MAX_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in text.as_bytes().chunks(2).enumerate() {
        let digit = |b: u8| (b as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// The SHA-256 of `token`, as the auth file stores it.
pub fn hash_token(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// `hash_token` as 64 lower-case hex digits (what `sha256sum` prints).
pub fn hash_hex(token: &[u8]) -> String {
    hash_token(token)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl TokenTable {
    /// Read and parse the auth file at `path`.
    pub fn load(path: &Path) -> Result<TokenTable, AuthFileError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| AuthFileError::Read {
            path: shown.clone(),
            source,
        })?;
        TokenTable::parse(&shown, &text)
    }

    /// Parse the text of an auth file; `path` is only used in messages.
    pub fn parse(path: &str, text: &str) -> Result<TokenTable, AuthFileError> {
        let mut entries: Vec<([u8; 32], Client)> = Vec::new();
        let mut names: HashMap<String, usize> = HashMap::new();
        let mut hashes: HashMap<[u8; 32], usize> = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let fail = |reason: String| AuthFileError::Line {
                path: path.to_owned(),
                line,
                reason,
            };
            let content = raw.split('#').next().unwrap_or_default();
            let fields: Vec<&str> = content.split_whitespace().collect();
            if fields.is_empty() {
                continue;
            }
            let [name, scopes, hash, options @ ..] = fields.as_slice() else {
                return Err(fail(
                    "expected `NAME SCOPE[,SCOPE] SHA256_HEX [OPTION=VALUE ...]`".into(),
                ));
            };
            if !valid_name(name) {
                return Err(fail(format!(
                    "client name {name:?} must be 1..={NAME_MAX_LEN} of A-Z a-z 0-9 . _ -"
                )));
            }
            let mut parsed = Vec::new();
            for scope in scopes.split(',') {
                let Some(scope) = Scope::parse(scope) else {
                    return Err(fail(format!(
                        "unknown scope {scope:?}; known: reserve, admin, router"
                    )));
                };
                if parsed.contains(&scope) {
                    return Err(fail(format!("scope {} listed twice", scope.as_str())));
                }
                parsed.push(scope);
            }
            let Some(digest) = parse_hash(hash) else {
                return Err(fail(
                    "the third field must be the SHA-256 of the token as 64 hex digits \
                     (printf %s \"$TOKEN\" | sha256sum), never the token itself"
                        .into(),
                ));
            };
            let mut client = Client {
                name: (*name).to_owned(),
                scopes: Scopes::of(&parsed),
                rate: None,
                burst: None,
                policy: None,
            };
            let mut policy = Policy::default();
            for option in options {
                match option.split_once('=') {
                    Some(("rate", value)) if client.rate.is_none() => match value.parse::<f64>() {
                        Ok(rate) if rate.is_finite() && rate > 0.0 => client.rate = Some(rate),
                        _ => {
                            return Err(fail(format!(
                            "rate must be a positive number of requests per second, got {value:?}"
                        )))
                        }
                    },
                    Some(("burst", value)) if client.burst.is_none() => {
                        match value.parse::<u32>() {
                            Ok(burst) if burst > 0 => client.burst = Some(burst),
                            _ => {
                                return Err(fail(format!(
                                    "burst must be a whole number of at least 1, got {value:?}"
                                )))
                            }
                        }
                    }
                    Some((key, value)) => match policy.apply(key, value) {
                        Some(Ok(())) => {}
                        Some(Err(reason)) => return Err(fail(reason)),
                        None => {
                            return Err(fail(format!(
                                "unknown or repeated option {option:?}; known: rate=N, burst=N, {}",
                                policy::KEYS
                            )))
                        }
                    },
                    None => {
                        return Err(fail(format!(
                            "option {option:?} is not KEY=VALUE; known: rate=N, burst=N, {}",
                            policy::KEYS
                        )))
                    }
                }
            }
            if !policy.is_empty() {
                client.policy = Some(Arc::new(policy.seal()));
            }
            // A name on a second line is a second token of the same client (a rotation): one
            // identity, so the lines must say the same about it.
            if let Some(&first) = names.get(&client.name) {
                let (_, earlier) = entries
                    .iter()
                    .find(|(_, c)| c.name == client.name)
                    .expect("every named line has an entry");
                if *earlier != client {
                    return Err(fail(format!(
                        "client {} is also on line {first} with other scopes or options; the \
                         lines of one client (one per token, for a rotation) must agree on both",
                        client.name
                    )));
                }
            } else {
                names.insert(client.name.clone(), line);
            }
            if let Some(first) = hashes.insert(digest, line) {
                return Err(fail(format!(
                    "the same token hash is already on line {first}: one token, one client"
                )));
            }
            entries.push((digest, client));
        }
        if entries.is_empty() {
            return Err(AuthFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(TokenTable { entries })
    }

    /// Clients (distinct names; a client listed with two tokens is one).
    pub fn len(&self) -> usize {
        self.names().count()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tokens (lines): more than [`TokenTable::len`] while a client's token is being rotated.
    pub fn tokens(&self) -> usize {
        self.entries.len()
    }

    /// Each client's name once, in the order of their first lines.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        let mut seen = std::collections::HashSet::new();
        self.entries
            .iter()
            .map(|(_, c)| c.name.as_str())
            .filter(move |name| seen.insert(*name))
    }

    /// The client whose token is `token`.
    ///
    /// The presented token is hashed and compared with every entry in constant time, and the
    /// match is selected without branching, so the time taken depends on neither which entry
    /// matched nor how many leading bytes of a hash agreed: timing tells a caller nothing about
    /// the table.
    pub fn lookup(&self, token: &[u8]) -> Option<&Client> {
        let digest = hash_token(token);
        // 0 means none; entry i is i + 1.
        let mut found = 0u32;
        for (i, (hash, _)) in self.entries.iter().enumerate() {
            let candidate = u32::try_from(i + 1).unwrap_or(u32::MAX);
            found = u32::conditional_select(&found, &candidate, hash.ct_eq(&digest));
        }
        let index = usize::try_from(found).ok()?.checked_sub(1)?;
        self.entries.get(index).map(|(_, client)| client)
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
