//! Reading events from PostgreSQL: the relay's tail and `GET /v1/events` read the same rows the
//! same way, so what Redis carries and what the API answers cannot differ.

use tokio_postgres::{GenericClient, Row};

use super::{ledger_event_type, Delta, Event, LedgerEvent, SettlementEvent, Stream, EVENT_VERSION};

const LEDGER_COLUMNS: &str = "l.partition, l.position, l.kind, l.epoch, l.sku, l.reservation_id,
     l.adjustment_id, l.d_on_hand, l.d_available, l.d_held, l.d_confirmed, l.recorded_at";

/// Up to `limit` events of each named partition after its position, in position order per
/// partition; one statement for every partition (the relay's tail).
pub async fn ledger_after<C: GenericClient>(
    client: &C,
    after: &[(u32, i64)],
    limit: i64,
) -> Result<Vec<Event>, tokio_postgres::Error> {
    let partitions: Vec<i32> = after.iter().map(|(p, _)| *p as i32).collect();
    let positions: Vec<i64> = after.iter().map(|(_, a)| *a).collect();
    let rows = client
        .query(
            &format!(
                "SELECT {LEDGER_COLUMNS}
                   FROM unnest($1::integer[], $2::bigint[]) AS c(part, after)
                  CROSS JOIN LATERAL (
                        SELECT * FROM ledger
                         WHERE partition = c.part AND position > c.after
                         ORDER BY position LIMIT $3) AS l
                  ORDER BY l.partition, l.position"
            ),
            &[&partitions, &positions, &limit],
        )
        .await?;
    rows.iter().map(ledger_event).collect()
}

/// Up to `limit` settled windows after `after`, in position order, as events of `stream`: the
/// settlement stream of the shard whose database `client` reads (`settlement_runs` holds that
/// shard's windows only; [`Stream::settlement_of`] its record).
pub async fn settlement_after<C: GenericClient>(
    client: &C,
    stream: &Stream,
    after: i64,
    limit: i64,
) -> Result<Vec<Event>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT position, term, window_start, window_end, reservations, quantity, finished_at
               FROM settlement_runs
              WHERE position > $1
              ORDER BY position LIMIT $2",
            &[&after, &limit],
        )
        .await?;
    let shard = stream.shard();
    Ok(rows
        .iter()
        .map(|r| {
            let position: i64 = r.get(0);
            Event::Settlement(SettlementEvent {
                version: EVENT_VERSION,
                event_type: "settlement.window_settled".to_owned(),
                key: stream.key(position),
                position,
                term: r.get(1),
                window_start: r.get(2),
                window_end: r.get(3),
                reservations: r.get::<_, Option<i64>>(4).unwrap_or(0),
                total_quantity: r.get::<_, Option<i64>>(5).unwrap_or(0),
                settled_at: r.get(6),
                shard: shard.cloned(),
            })
        })
        .collect())
}

/// Up to `limit` events of `stream` after `after`. A settlement stream is read from `client`'s
/// database as that stream's: the caller picks the shard's database.
pub async fn stream_after<C: GenericClient>(
    client: &C,
    stream: &Stream,
    after: i64,
    limit: i64,
) -> Result<Vec<Event>, tokio_postgres::Error> {
    match stream {
        Stream::Partition(p) => ledger_after(client, &[(*p, after)], limit).await,
        Stream::Settlement(_) => settlement_after(client, stream, after, limit).await,
    }
}

/// The settlement stream of the shard whose database `client` reads, by its `shard_identity`
/// row (a database `allocator migrate` has not named is a one-database cluster's: `settlement`).
pub async fn own_settlement_stream<C: GenericClient>(
    client: &C,
) -> Result<Stream, tokio_postgres::Error> {
    let row = client
        .query_opt("SELECT shard, catalog FROM shard_identity", &[])
        .await?;
    Ok(match row {
        Some(row) if !row.get::<_, bool>(1) => {
            let name: &str = row.get(0);
            // The table's CHECK admits valid names only.
            Stream::Settlement(name.parse().ok())
        }
        _ => Stream::CATALOG_SETTLEMENT,
    })
}

fn ledger_event(r: &Row) -> Result<Event, tokio_postgres::Error> {
    let partition = r.get::<_, i32>(0) as u32;
    let position: i64 = r.get(1);
    let kind: &str = r.get(2);
    let delta = Delta {
        on_hand: r.get(7),
        available: r.get(8),
        held: r.get(9),
        confirmed: r.get(10),
    };
    // A reservation's movements all move its whole quantity into `held` or out of it; an
    // adjustment moves `on_hand` by its delta.
    let (quantity, adjusted) = match kind {
        "restock" | "shrink" => (None, Some(delta.on_hand)),
        _ => (Some(delta.held.abs()), None),
    };
    Ok(Event::Ledger(LedgerEvent {
        version: EVENT_VERSION,
        // The table's CHECK admits only the kinds that have a type.
        event_type: ledger_event_type(kind).unwrap_or("unknown").to_owned(),
        key: Stream::Partition(partition).key(position),
        partition,
        position,
        epoch: r.get(3),
        sku: r.get(4),
        reservation_id: r.get(5),
        adjustment_id: r.get(6),
        quantity,
        delta: adjusted,
        change: delta,
        recorded_at: r.get(11),
    }))
}
