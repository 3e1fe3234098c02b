//! What the change-event tests share: a mixed reservation load over HTTP, a consumer that reads
//! every Redis stream back, and the check every test ends with ([`assert_delivered_once`]): each
//! committed ledger row and settled window is in Redis exactly once, in position order, equal
//! to the database's event and valid under its JSON Schema.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use schema::events::{read, Event, Stream, SCHEMAS};
use schema::wire::ReserveRequest;
use serde_json::Value;
use testkit::ApiClient;

use crate::common::*;

/// SKUs spread over partitions, restocked before the load.
pub(crate) const SKUS: [&str; 6] = ["ev-a", "ev-b", "ev-c", "ev-d", "ev-e", "ev-f"];

pub(crate) async fn stock(base: &str) {
    for sku in SKUS {
        restock(base, sku, 100_000).await;
    }
}

/// `rounds` reserves per SKU, each then confirmed, released or left to expire, from a few
/// concurrent clients; answers are not asserted (owners may change under the load).
pub(crate) async fn mixed_load(base: &str, tag: &str, rounds: usize) {
    let mut clients = Vec::new();
    for (c, sku) in SKUS.iter().enumerate() {
        let api = ApiClient::new(base);
        let tag = tag.to_owned();
        let sku = sku.to_string();
        clients.push(tokio::spawn(async move {
            for i in 0..rounds {
                let id = format!("{tag}-{c}-{i}");
                let request: ReserveRequest = serde_json::from_value(serde_json::json!({
                    "reservation_id": id, "sku": sku, "quantity": 1 + i % 3, "ttl_seconds": 1
                }))
                .expect("valid reserve");
                if !api.reserve(&request).await.status.is_success() {
                    continue;
                }
                match i % 3 {
                    0 => drop(api.confirm(&id).await),
                    1 => drop(api.release(&id).await),
                    _ => {} // expires by its TTL
                }
            }
        }));
    }
    for client in clients {
        client.await.expect("load client");
    }
}

/// Waits until the load's 1 s holds have expired: an expiry relayed between a check's database
/// read and its Redis read would show as one entry too many.
pub(crate) async fn wait_no_holds(db: &str) {
    let pg = client(db).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE status = 'held'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        > 0
    {
        assert!(Instant::now() < deadline, "holds did not expire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every entry of every `events:*` stream, by stream key: (entry id, dedupe key, event JSON).
pub(crate) async fn read_redis(redis_url: &str) -> BTreeMap<String, Vec<(String, String, Value)>> {
    let client = redis::Client::open(redis_url).expect("redis url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("events:*")
        .query_async(&mut conn)
        .await
        .expect("KEYS");
    let mut streams = BTreeMap::new();
    for key in keys {
        let reply: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(&key)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE");
        let entries = reply
            .into_iter()
            .map(|(id, fields)| {
                let field = |name: &str| -> String {
                    let at = fields.chunks(2).find(|kv| kv[0] == name);
                    at.unwrap_or_else(|| panic!("{id} has no {name}"))[1].clone()
                };
                let json: Value = serde_json::from_str(&field("event")).expect("event JSON");
                (id.clone(), field("key"), json)
            })
            .collect();
        streams.insert(key, entries);
    }
    streams
}

/// Every stream with entries in the database, and its events, read as the relay reads them.
pub(crate) async fn database_events(db: &str) -> BTreeMap<Stream, Vec<Event>> {
    let client = client(db).await;
    let partitions: Vec<i32> = client
        .query("SELECT DISTINCT partition FROM ledger", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut all = BTreeMap::new();
    for p in partitions {
        let stream = Stream::Partition(p as u32);
        let events = read::stream_after(&client, &stream, 0, 1_000_000)
            .await
            .unwrap();
        all.insert(stream, events);
    }
    // The database's own shard's settlement stream (`settlement` unless it is another shard).
    let settlement = read::own_settlement_stream(&client).await.unwrap();
    let settled = read::stream_after(&client, &settlement, 0, 1_000_000)
        .await
        .unwrap();
    if !settled.is_empty() {
        all.insert(settlement, settled);
    }
    all
}

/// Positions 1..n of every stream, each once, in order (the database's own promise).
pub(crate) fn assert_gap_free(events: &BTreeMap<Stream, Vec<Event>>) {
    for (stream, events) in events {
        let positions: Vec<i64> = events.iter().map(Event::position).collect();
        let expected: Vec<i64> = (1..=events.len() as i64).collect();
        assert_eq!(positions, expected, "{stream:?} is not numbered 1..n");
    }
}

/// Wait until Redis holds as many entries per stream as the database has events.
pub(crate) async fn wait_delivered(db: &str, redis_url: &str, timeout: Duration) {
    let start = Instant::now();
    loop {
        let want = database_events(db).await;
        let have = read_redis(redis_url).await;
        let caught_up = want.iter().all(|(stream, events)| {
            have.get(&stream.redis_key())
                .and_then(|entries| entries.last())
                .is_some_and(|(_, _, last)| last["position"] == events.len())
        });
        if caught_up {
            return;
        }
        assert!(
            start.elapsed() < timeout,
            "Redis did not catch up within {timeout:?}: want {:?}, have {:?}",
            want.iter()
                .map(|(s, e)| (s.redis_key(), e.len()))
                .collect::<Vec<_>>(),
            have.iter().map(|(k, e)| (k, e.len())).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every database event is in Redis exactly once, in order, under id `<position>-0` and key
/// `<stream>:<position>`, equal to what the database says and valid under its schema.
pub(crate) async fn assert_delivered_once(db: &str, redis_url: &str) -> usize {
    let want = database_events(db).await;
    assert_gap_free(&want);
    let have = read_redis(redis_url).await;
    let validators: BTreeMap<&str, jsonschema::Validator> = SCHEMAS
        .iter()
        .map(|(name, text)| {
            let schema: Value = serde_json::from_str(text).expect("schema is JSON");
            let validator = jsonschema::draft202012::options()
                .should_validate_formats(true)
                .build(&schema)
                .unwrap_or_else(|e| panic!("schema {name} does not compile: {e}"));
            (*name, validator)
        })
        .collect();
    let mut delivered = 0;
    for (stream, events) in &want {
        let entries = have
            .get(&stream.redis_key())
            .unwrap_or_else(|| panic!("no Redis stream for {stream:?}"));
        assert_eq!(entries.len(), events.len(), "{stream:?}: entries in Redis");
        for (event, (id, key, json)) in events.iter().zip(entries) {
            assert_eq!(
                id,
                &format!("{}-0", event.position()),
                "{stream:?}: entry id"
            );
            assert_eq!(key, event.key(), "{stream:?}: dedupe key");
            let expected = serde_json::to_value(event).unwrap();
            assert_eq!(json, &expected, "{stream:?}: event at {}", event.position());
            let validator = &validators[event.event_type()];
            let errors: Vec<String> = validator.iter_errors(json).map(|e| e.to_string()).collect();
            assert!(errors.is_empty(), "{json} breaks its schema: {errors:?}");
            delivered += 1;
        }
    }
    delivered
}
