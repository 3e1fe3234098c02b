//! Change events: the ledger as a transactional outbox, relayed to Redis Streams (DESIGN.md §14).
//!
//! Every ledger row carries a per-partition position assigned by the fenced batch that writes it
//! (`V12__ledger_positions.sql`): gap-free and in commit order, because the partition's counter
//! row is raised in the same transaction and stays locked until commit. Settled windows are
//! numbered in a stream of their own (`V13__event_relay.sql`). So each stream is a sequence
//! `1, 2, 3, …` that only ever grows at its end, and "how far was it published" is one number.
//!
//! The relay runs on the replica that holds the singleton job lease (`job/settlement`, whose
//! epoch is the term): one relay per shard, never two for long, and a former holder that
//! slept through its lease cannot move progress, because `event_relay_progress` is fenced by the
//! same trigger as the settlement tables. Each shard's relay publishes the partition streams of
//! the partitions its database holds and the shard's own settlement stream (`events:settlement`
//! on the catalog shard, `events:settlement:<shard>` on any other: each shard numbers its
//! windows itself, so two shards must never share a stream). Each round it reads every stream's entries after its
//! cursor (one statement), appends them to Redis (`XADD events:partition:P MAXLEN ~ N
//! <position>-0 key P:position type … event <json>`, one pipelined script per stream), and then
//! records the new positions in PostgreSQL. A round that filled a stream's batch is followed at
//! once by the next (a hot partition may commit more than a batch per pause), up to
//! `CATCH_UP_ROUNDS` in a row. Redis refuses an id at or below a stream's last one,
//! and the script skips those, so a relay that died between Redis's answer and the progress
//! update republishes nothing twice; consumers still deduplicate by position (`key`).
//!
//! Redis keeps nothing on disk here. The script reports a stream whose last id is below what the
//! relay knows it published (gone, or behind); the relay then rewinds that stream's cursor to what
//! Redis kept, but no further back than `max_len` entries before the published position (what a
//! bounded stream could hold anyway), and publishes again from the database. Progress in
//! PostgreSQL never goes back. Consumers that fell further behind read `GET /v1/events`.

mod config;
mod relay;

pub use config::{EventsArgs, EventsConfig, EVENTS_FLAG};
pub use relay::{spawn, RelaySettings, TermSource};
