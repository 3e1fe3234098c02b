//! What one client may touch and how much: SKU namespaces and quotas, read from the options of
//! its auth-file line.
//!
//! * `skus=acme:*,beta:tee` confines the client to SKUs that start with `acme:` or equal
//!   `beta:tee` (comma-separated, or several `skus=` options). Without `skus=` every SKU is in.
//!   The check covers every route that names a SKU ([`schema::routes::SKU_IN`]): reads,
//!   reservations, every line of an order, adjustments; a reservation addressed by id is checked
//!   by the allocator against its stored SKU (`404` when outside).
//! * `max_quantity=N`: one request asks for at most N units (a reservation's quantity, an
//!   order's lines together), checked at the edge of both services.
//! * `max_held_per_sku=N`, `max_held_units=N`: units the client may hold at once, of one SKU and
//!   over every SKU. Only the fenced batch can decide them exactly, against what the client
//!   holds; they are parsed and carried here ([`crate::current_policy`] on an allocator) for it.
//!
//! A router forwards its client's policy to allocators in [`schema::wire::HEADER_CLIENT_POLICY`],
//! written by [`Policy::header`] in the auth file's own grammar and read back by
//! [`Policy::parse_options`], so one parser serves the file and the header.

use schema::wire::limits::SKU_MAX_LEN;
use schema::wire::validate;

/// A quota of the auth file, as named in problems, metrics and the file itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quota {
    MaxQuantity,
    MaxHeldPerSku,
    MaxHeldUnits,
}

impl Quota {
    pub const ALL: [Quota; 3] = [
        Quota::MaxQuantity,
        Quota::MaxHeldPerSku,
        Quota::MaxHeldUnits,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Quota::MaxQuantity => "max_quantity",
            Quota::MaxHeldPerSku => "max_held_per_sku",
            Quota::MaxHeldUnits => "max_held_units",
        }
    }
}

/// The held-unit quotas of one client, as the fenced batch will take them with a reservation:
/// `per_sku` units of one SKU, `units` over every SKU, held at once (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HoldQuotas {
    pub per_sku: Option<i64>,
    pub units: Option<i64>,
}

/// One entry of `skus=`: a prefix (`acme:*`) or one exact SKU (`beta:tee`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkuPattern(String);

impl SkuPattern {
    pub fn parse(text: &str) -> Result<SkuPattern, String> {
        let (body, prefix) = match text.strip_suffix('*') {
            Some(body) => (body, true),
            None => (text, false),
        };
        if prefix && body.is_empty() {
            return Err("skus=* allows every SKU: leave skus= out instead".into());
        }
        if body.is_empty() {
            return Err("an empty skus= entry".into());
        }
        if prefix && body.len() >= SKU_MAX_LEN {
            return Err(format!(
                "skus= prefix {text:?} is as long as a whole SKU (at most {SKU_MAX_LEN} characters)"
            ));
        }
        validate::sku(body).map_err(|rule| {
            format!("skus= entry {text:?}: {rule}, with an optional final * for a prefix")
        })?;
        Ok(SkuPattern(text.to_owned()))
    }

    pub fn matches(&self, sku: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => sku.starts_with(prefix),
            None => sku == self.0,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The namespaces and quotas of one client. The default (no option) restricts nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Policy {
    skus: Vec<SkuPattern>,
    pub max_quantity: Option<i64>,
    pub max_held_per_sku: Option<i64>,
    pub max_held_units: Option<i64>,
    /// [`Policy::header`], written once by [`Policy::seal`].
    header: String,
}

/// The option keys [`Policy::apply`] knows, for messages.
pub const KEYS: &str =
    "skus=PREFIX*|SKU[,...], max_quantity=N, max_held_per_sku=N, max_held_units=N";

fn positive(key: &str, value: &str) -> Result<i64, String> {
    match value.parse::<i64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{key} must be a whole number of at least 1, got {value:?}"
        )),
    }
}

impl Policy {
    /// Apply one `key=value` option. `None` when `key` is not a policy option (the caller may
    /// know it); a repeated quota, a duplicate SKU entry or a bad value is refused.
    pub fn apply(&mut self, key: &str, value: &str) -> Option<Result<(), String>> {
        let quota = match key {
            "skus" => return Some(self.add_skus(value)),
            "max_quantity" => &mut self.max_quantity,
            "max_held_per_sku" => &mut self.max_held_per_sku,
            "max_held_units" => &mut self.max_held_units,
            _ => return None,
        };
        if quota.is_some() {
            return Some(Err(format!("{key} given twice")));
        }
        Some(positive(key, value).map(|n| *quota = Some(n)))
    }

    fn add_skus(&mut self, list: &str) -> Result<(), String> {
        for entry in list.split(',') {
            let pattern = SkuPattern::parse(entry)?;
            if self.skus.contains(&pattern) {
                return Err(format!("skus= entry {entry:?} listed twice"));
            }
            self.skus.push(pattern);
        }
        Ok(())
    }

    /// Parse a whole option list (`skus=acme:* max_quantity=2`), as [`Policy::header`] writes
    /// it; every option must be a policy option.
    pub fn parse_options(text: &str) -> Result<Policy, String> {
        let mut policy = Policy::default();
        for option in text.split_ascii_whitespace() {
            let Some((key, value)) = option.split_once('=') else {
                return Err(format!("{option:?} is not key=value"));
            };
            policy
                .apply(key, value)
                .unwrap_or_else(|| Err(format!("unknown option {key:?}; known: {KEYS}")))?;
        }
        Ok(policy.seal())
    }

    /// Fix the header form once the options are all applied.
    pub fn seal(mut self) -> Policy {
        let mut parts = Vec::new();
        if !self.skus.is_empty() {
            let skus: Vec<&str> = self.skus.iter().map(SkuPattern::as_str).collect();
            parts.push(format!("skus={}", skus.join(",")));
        }
        for quota in Quota::ALL {
            if let Some(value) = self.quota(quota) {
                parts.push(format!("{}={value}", quota.as_str()));
            }
        }
        self.header = parts.join(" ");
        self
    }

    /// The options in the auth file's grammar, for [`schema::wire::HEADER_CLIENT_POLICY`].
    pub fn header(&self) -> &str {
        &self.header
    }

    /// No namespace and no quota: nothing to enforce or forward.
    pub fn is_empty(&self) -> bool {
        self.skus.is_empty() && Quota::ALL.into_iter().all(|q| self.quota(q).is_none())
    }

    /// Whether a request's SKUs or quantity must be looked at before it is served.
    pub fn checks_requests(&self) -> bool {
        !self.skus.is_empty() || self.max_quantity.is_some()
    }

    pub fn quota(&self, quota: Quota) -> Option<i64> {
        match quota {
            Quota::MaxQuantity => self.max_quantity,
            Quota::MaxHeldPerSku => self.max_held_per_sku,
            Quota::MaxHeldUnits => self.max_held_units,
        }
    }

    /// What the fenced batch must decide for this client's reservations.
    pub fn hold_quotas(&self) -> HoldQuotas {
        HoldQuotas {
            per_sku: self.max_held_per_sku,
            units: self.max_held_units,
        }
    }

    pub fn skus(&self) -> &[SkuPattern] {
        &self.skus
    }

    /// Whether `sku` is inside the client's namespaces (always, without `skus=`).
    pub fn permits(&self, sku: &str) -> bool {
        self.skus.is_empty() || self.skus.iter().any(|p| p.matches(sku))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_exact_skus() {
        let policy = Policy::parse_options("skus=acme:*,beta:tee skus=c").unwrap();
        for sku in ["acme:1", "acme:", "beta:tee", "c"] {
            assert!(policy.permits(sku), "{sku}");
        }
        for sku in ["acm", "beta:teeshirt", "beta:te", "xacme:1", "cc", ""] {
            assert!(!policy.permits(sku), "{sku}");
        }
        assert!(Policy::default().permits("anything"));
        assert!(policy.checks_requests());
    }

    #[test]
    fn header_round_trips_in_a_fixed_order() {
        let policy =
            Policy::parse_options("max_held_units=9 skus=a:* max_quantity=2 max_held_per_sku=3")
                .unwrap();
        assert_eq!(
            policy.header(),
            "skus=a:* max_quantity=2 max_held_per_sku=3 max_held_units=9"
        );
        assert_eq!(Policy::parse_options(policy.header()).unwrap(), policy);
        let empty = Policy::parse_options("").unwrap();
        assert!(empty.is_empty() && !empty.checks_requests());
        assert_eq!(empty.header(), "");
        // Held-unit quotas alone are carried, but no request is looked at for them.
        let held = Policy::parse_options("max_held_per_sku=2").unwrap();
        assert!(!held.is_empty() && !held.checks_requests());
        assert_eq!(held.quota(Quota::MaxHeldPerSku), Some(2));
        assert_eq!(
            held.hold_quotas(),
            HoldQuotas {
                per_sku: Some(2),
                units: None
            }
        );
        assert_eq!(empty.hold_quotas(), HoldQuotas::default());
    }

    #[test]
    fn refusals_say_what_is_wrong() {
        let cases = [
            ("skus=*", "every SKU"),
            ("skus=", "empty"),
            ("skus=a,,b", "empty"),
            ("skus=a*b", "may contain only"),
            ("skus=a b", "not key=value"),
            ("skus=a/b*", "may contain only"),
            ("skus=a:*,a:*", "twice"),
            ("skus=a skus=a", "twice"),
            ("max_quantity=0", "at least 1"),
            ("max_quantity=-1", "at least 1"),
            ("max_quantity=1.5", "at least 1"),
            ("max_held_units=99999999999999999999", "at least 1"),
            ("max_quantity=1 max_quantity=2", "twice"),
            ("rate=1", "unknown option"),
            ("skus", "not key=value"),
        ];
        for (text, words) in cases {
            let error = Policy::parse_options(text).unwrap_err();
            assert!(error.contains(words), "{text:?} → {error}");
        }
        let long = format!("skus={}*", "a".repeat(SKU_MAX_LEN));
        assert!(Policy::parse_options(&long).is_err());
        let longest_exact = format!("skus={}", "a".repeat(SKU_MAX_LEN));
        Policy::parse_options(&longest_exact).unwrap();
    }
}
