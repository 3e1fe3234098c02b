//! Who owns a stored reservation or order, and who may act on one.
//!
//! Every reservation and every order records the client that created it: the authenticated
//! client's name (on an allocator, the client a router names in [`schema::wire::HEADER_CLIENT`]
//! when the caller holds the `router` scope, else the caller's own token name), or nothing with
//! authentication off (one anonymous client). A stored `NULL` owner is the anonymous or unknown
//! owner: rows written with authentication off, before the owner was recorded
//! (`V18__owners.sql`), or by a replica of an earlier build; any client may act on those, as
//! every client could before. A client with the `admin` scope may act on every client's.
//! Everyone else finds another client's reservation or order answered exactly as an unknown id.

/// The client a request acts for, as far as stored reservations and orders are concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Recorded on what the request creates: the authenticated client's name; `None` with
    /// authentication off.
    pub client: Option<String>,
    /// May act on every client's reservations and orders: the `admin` scope, or authentication
    /// off (there is only the anonymous client then).
    pub any: bool,
    /// The client's `max_held_per_sku`: units it may hold of one SKU at once, decided by the
    /// fenced batch against what it holds (`V19__hold_quota_per_sku.sql`). Only for an
    /// authenticated client: the anonymous owner is everybody at once.
    pub max_held_per_sku: Option<i64>,
    /// The client's `max_held_units`: units it may hold at once over every SKU, decided by the
    /// fenced batch against what it holds in every partition (`V22__hold_quota_units.sql`):
    /// exact for holds in one partition, within the bound DESIGN.md §9 states across them.
    pub max_held_units: Option<i64>,
    /// Units the client holds on the cluster's other shards, as the router that forwards the
    /// reserve read them ([`schema::wire::HEADER_HELD_ELSEWHERE`]); counted with what it holds
    /// on this shard against `max_held_units`. Zero for one database.
    pub held_elsewhere: i64,
}

impl Owner {
    /// Authentication off, or work outside any request: records no owner, acts on every one.
    pub const ANYONE: Owner = Owner {
        client: None,
        any: true,
        max_held_per_sku: None,
        max_held_units: None,
        held_elsewhere: 0,
    };

    /// An authenticated client, `admin` when it holds that scope.
    pub fn client(name: impl Into<String>, admin: bool) -> Owner {
        Owner {
            client: Some(name.into()),
            any: admin,
            max_held_per_sku: None,
            max_held_units: None,
            held_elsewhere: 0,
        }
    }

    /// The per-SKU hold quota the fenced batch enforces for this owner, if any.
    pub fn held_per_sku_quota(&self) -> Option<i64> {
        self.client.as_ref().and(self.max_held_per_sku)
    }

    /// The all-SKU hold quota the fenced batch enforces for this owner, if any.
    pub fn held_units_quota(&self) -> Option<i64> {
        self.client.as_ref().and(self.max_held_units)
    }

    /// Whether a reserve of this owner must be decided against what it holds (only
    /// `apply_fenced_batch` can).
    pub fn has_hold_quota(&self) -> bool {
        self.held_per_sku_quota().is_some() || self.held_units_quota().is_some()
    }

    /// Whether this client may read or change a reservation or order stored with `stored` as
    /// its owner (`None`: anonymous or unknown).
    pub fn may_act_on(&self, stored: Option<&str>) -> bool {
        self.any || stored.is_none() || stored == self.client.as_deref()
    }
}

impl Default for Owner {
    fn default() -> Self {
        Owner::ANYONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_admins_and_the_anonymous_owner() {
        let alice = Owner::client("alice", false);
        assert!(alice.may_act_on(Some("alice")));
        assert!(!alice.may_act_on(Some("bob")));
        assert!(alice.may_act_on(None));
        let ops = Owner::client("ops", true);
        assert!(ops.may_act_on(Some("alice")) && ops.may_act_on(None));
        assert!(Owner::ANYONE.may_act_on(Some("alice")));
        assert_eq!(Owner::default(), Owner::ANYONE);
    }
}
