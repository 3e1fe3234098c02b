//! What a server says about itself, and the rule that decides whether it may be used.
//!
//! A server is identified by its *cluster* — PostgreSQL's system identifier, shared by a primary
//! and every standby made from it, plus the `cluster_id` of the `storage_identity` row, which a
//! restore replaces so a restored copy is never taken for the live database — and placed by its
//! *position*: the WAL timeline, which rises at every promotion, then the generation stamped into
//! `storage_identity` at promotion. The rule ([`Known::judge`]) is pure so it is unit-tested;
//! [`crate::StorageFence`] applies it to live servers.

use std::cmp::Ordering;
use std::fmt;

/// One server as read by [`read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    /// `pg_control_system().system_identifier`: the same on a primary and its standbys.
    pub system_id: i64,
    /// The WAL timeline the server writes (a primary) or receives (a standby).
    pub timeline: i32,
    /// A standby, or a server that refuses writes (`transaction_read_only`).
    pub read_only: bool,
    /// The `storage_identity` row; `None` before the schema has it.
    pub stamp: Option<Stamp>,
}

/// The `storage_identity` row of a database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub cluster_id: String,
    pub generation: i64,
    /// The timeline `generation` was stamped on.
    pub timeline: i32,
    /// `false` while a restored copy is being verified: no service may use it.
    pub serving: bool,
}

impl ServerIdentity {
    fn cluster(&self) -> (i64, Option<&str>) {
        (
            self.system_id,
            self.stamp.as_ref().map(|s| s.cluster_id.as_str()),
        )
    }

    /// `(timeline, generation)`, compared lexicographically.
    pub fn position(&self) -> (i32, i64) {
        (
            self.timeline,
            self.stamp.as_ref().map_or(0, |s| s.generation),
        )
    }

    /// Whether the generation should be stamped: the server writes a newer timeline than the one
    /// its generation was stamped on (it was promoted since).
    pub fn needs_stamp(&self) -> bool {
        !self.read_only
            && self
                .stamp
                .as_ref()
                .is_some_and(|s| s.timeline < self.timeline)
    }
}

/// Why a server is not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// A newer primary of the same cluster is known: this one is a superseded old primary (or a
    /// standby of one).
    Behind,
    /// Another cluster than the one this process works with (another system identifier or
    /// `cluster_id`, e.g. a restored copy).
    Foreign,
    /// Its `storage_identity` says `serving = false` (a restore being verified).
    NotServing,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Behind => "behind",
            Refusal::Foreign => "foreign",
            Refusal::NotServing => "not_serving",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::Behind => "a newer primary of this cluster is known",
            Refusal::Foreign => "it belongs to another cluster (system identifier or cluster id)",
            Refusal::NotServing => "its storage identity says it is not serving (being restored)",
        })
    }
}

/// The verdict on one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The newest primary known: writes may go here.
    Writable,
    /// A standby (or read-only server) of the right cluster, at or behind the newest position.
    ReadOnly,
    Refused(Refusal),
}

/// The newest cluster position this process has seen; never moves back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    cluster: Option<(i64, Option<String>)>,
    position: (i32, i64),
}

impl Known {
    pub fn position(&self) -> (i32, i64) {
        self.position
    }

    /// What is worth remembering across a restart, as one line
    /// (`system_id cluster_id|- timeline generation`); `None` before any server was seen.
    pub fn to_line(&self) -> Option<String> {
        let (system_id, cluster_id) = self.cluster.as_ref()?;
        Some(format!(
            "{system_id} {} {} {}\n",
            cluster_id.as_deref().unwrap_or("-"),
            self.position.0,
            self.position.1
        ))
    }

    /// The inverse of [`Known::to_line`].
    pub fn from_line(line: &str) -> Option<Known> {
        let mut fields = line.split_whitespace();
        let system_id = fields.next()?.parse().ok()?;
        let cluster_id = match fields.next()? {
            "-" => None,
            id => Some(id.to_owned()),
        };
        let position = (fields.next()?.parse().ok()?, fields.next()?.parse().ok()?);
        fields.next().is_none().then_some(Known {
            cluster: Some((system_id, cluster_id)),
            position,
        })
    }

    /// Judges `server` and learns from it. Returns the verdict and whether the known position
    /// rose (then connections made before may lead to a superseded server).
    ///
    /// The first server seen fixes the cluster; a `cluster_id` appearing later (the schema was
    /// migrated) is adopted. A server of another cluster, or one not serving, teaches nothing.
    /// A standby teaches its position too: a standby on a newer timeline proves that a promotion
    /// happened even while the new primary is out of reach.
    pub fn judge(&mut self, server: &ServerIdentity) -> (Verdict, bool) {
        if server.stamp.as_ref().is_some_and(|s| !s.serving) {
            return (Verdict::Refused(Refusal::NotServing), false);
        }
        let (system_id, cluster_id) = server.cluster();
        match &mut self.cluster {
            None => self.cluster = Some((system_id, cluster_id.map(str::to_owned))),
            Some((known_system, known_id)) => {
                if *known_system != system_id {
                    return (Verdict::Refused(Refusal::Foreign), false);
                }
                match (known_id.as_deref(), cluster_id) {
                    (Some(known), Some(id)) if known != id => {
                        return (Verdict::Refused(Refusal::Foreign), false)
                    }
                    (None, Some(id)) => *known_id = Some(id.to_owned()),
                    _ => {}
                }
            }
        }
        let position = server.position();
        match position.cmp(&self.position) {
            Ordering::Less if server.read_only => (Verdict::ReadOnly, false),
            Ordering::Less => (Verdict::Refused(Refusal::Behind), false),
            Ordering::Equal => (verdict_at_newest(server), false),
            Ordering::Greater => {
                self.position = position;
                (verdict_at_newest(server), true)
            }
        }
    }
}

fn verdict_at_newest(server: &ServerIdentity) -> Verdict {
    if server.read_only {
        Verdict::ReadOnly
    } else {
        Verdict::Writable
    }
}

/// The server's identity and position in one statement. The timeline of a primary comes from
/// the name of its current WAL file, which carries the new timeline from the instant of
/// promotion; `pg_control_checkpoint()` shows it only after the first checkpoint on the new
/// timeline, which may be minutes later. A standby reports the newer of its last restart point's
/// timeline and the one it receives.
pub const IDENTITY_SQL: &str = "
SELECT s.system_identifier,
       CASE WHEN pg_is_in_recovery()
            THEN greatest((pg_control_checkpoint()).timeline_id,
                          coalesce((SELECT max(received_tli) FROM pg_stat_wal_receiver), 0))
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
       END,
       pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on',
       to_regclass('storage_identity') IS NOT NULL
  FROM pg_control_system() s";

const STAMP_SQL: &str =
    "SELECT cluster_id::text, generation, timeline, serving FROM storage_identity";

/// Reads `client`'s server identity (one statement, two when the schema has `storage_identity`).
pub async fn read(
    client: &tokio_postgres::Client,
) -> Result<ServerIdentity, tokio_postgres::Error> {
    let row = client.query_one(IDENTITY_SQL, &[]).await?;
    let stamp = if row.get::<_, bool>(3) {
        client.query_opt(STAMP_SQL, &[]).await?.map(|s| Stamp {
            cluster_id: s.get(0),
            generation: s.get(1),
            timeline: s.get(2),
            serving: s.get(3),
        })
    } else {
        None
    };
    Ok(ServerIdentity {
        system_id: row.get(0),
        timeline: row.get(1),
        read_only: row.get(2),
        stamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(timeline: i32, generation: i64, read_only: bool) -> ServerIdentity {
        ServerIdentity {
            system_id: 7,
            timeline,
            read_only,
            stamp: Some(Stamp {
                cluster_id: "a".into(),
                generation,
                timeline,
                serving: true,
            }),
        }
    }

    #[test]
    fn a_revived_old_primary_is_refused_once_its_promoted_standby_was_seen() {
        let mut known = Known::default();
        assert_eq!(known.judge(&server(1, 1, false)), (Verdict::Writable, true));
        assert_eq!(known.judge(&server(2, 1, false)), (Verdict::Writable, true));
        assert_eq!(
            known.judge(&server(1, 1, false)),
            (Verdict::Refused(Refusal::Behind), false)
        );
        assert_eq!(known.position(), (2, 1));
    }

    #[test]
    fn a_standby_on_a_newer_timeline_fences_the_old_primary_too() {
        let mut known = Known::default();
        assert_eq!(known.judge(&server(1, 1, false)).0, Verdict::Writable);
        assert_eq!(known.judge(&server(2, 2, true)), (Verdict::ReadOnly, true));
        assert_eq!(
            known.judge(&server(1, 1, false)).0,
            Verdict::Refused(Refusal::Behind)
        );
        // A lagging standby is only read-only, never refused as stale.
        assert_eq!(known.judge(&server(1, 1, true)).0, Verdict::ReadOnly);
    }

    #[test]
    fn a_generation_stamped_by_the_promotion_hook_orders_servers_on_one_timeline() {
        let mut known = Known::default();
        known.judge(&server(3, 5, false));
        assert_eq!(known.judge(&server(3, 6, false)), (Verdict::Writable, true));
        assert_eq!(
            known.judge(&server(3, 5, false)).0,
            Verdict::Refused(Refusal::Behind)
        );
    }

    #[test]
    fn another_cluster_or_a_copy_being_restored_is_refused_and_teaches_nothing() {
        let mut known = Known::default();
        known.judge(&server(1, 1, false));
        let mut restored = server(4, 9, false);
        restored.stamp.as_mut().unwrap().cluster_id = "b".into();
        assert_eq!(
            known.judge(&restored),
            (Verdict::Refused(Refusal::Foreign), false)
        );
        let mut other_system = server(9, 9, false);
        other_system.system_id = 8;
        assert_eq!(
            known.judge(&other_system).0,
            Verdict::Refused(Refusal::Foreign)
        );
        let mut unverified = server(5, 1, false);
        unverified.stamp.as_mut().unwrap().serving = false;
        assert_eq!(
            known.judge(&unverified).0,
            Verdict::Refused(Refusal::NotServing)
        );
        assert_eq!(known.position(), (1, 1));
    }

    #[test]
    fn a_cluster_id_appearing_after_migration_is_adopted() {
        let mut known = Known::default();
        let mut before = server(1, 0, false);
        before.stamp = None;
        assert_eq!(known.judge(&before).0, Verdict::Writable);
        assert_eq!(known.judge(&server(1, 1, false)), (Verdict::Writable, true));
        let mut other = server(1, 1, false);
        other.stamp.as_mut().unwrap().cluster_id = "z".into();
        assert_eq!(known.judge(&other).0, Verdict::Refused(Refusal::Foreign));
    }

    #[test]
    fn a_promoted_server_needs_a_stamp_until_its_generation_follows_its_timeline() {
        let mut promoted = server(2, 1, false);
        promoted.stamp.as_mut().unwrap().timeline = 1;
        assert!(promoted.needs_stamp());
        assert!(!server(2, 2, false).needs_stamp());
        let mut standby = promoted.clone();
        standby.read_only = true;
        assert!(!standby.needs_stamp());
    }

    #[test]
    fn what_is_remembered_reads_back_as_the_same_knowledge() {
        assert_eq!(
            Known::default().to_line(),
            None,
            "nothing seen, nothing to remember"
        );
        let mut known = Known::default();
        known.judge(&server(1, 0, false));
        known.judge(&server(2, 3, true));
        let line = known.to_line().expect("a cluster was seen");
        let recalled = Known::from_line(&line).expect("reads back");
        assert_eq!(recalled, known);
        // What it refuses after a restart: the old primary, behind the remembered position.
        let mut restarted = recalled;
        assert_eq!(
            restarted.judge(&server(1, 0, false)).0,
            Verdict::Refused(Refusal::Behind)
        );
        for garbage in ["", "7", "7 - 2", "x - 2 3", "7 - 2 3 4"] {
            assert_eq!(Known::from_line(garbage), None, "{garbage:?}");
        }
    }
}
