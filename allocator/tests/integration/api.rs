//! HTTP API behaviour of one replica over real HTTP against a real PostgreSQL: the reservation
//! lifecycle with replays and idempotency, durable out-of-stock outcomes, invalid input as
//! problems (never a `500`), fenced adjustments, expiry of overdue holds, and exactly the stock
//! there is under 200 concurrent reserves. The partition map, probes, metrics and `421` are in
//! [`crate::api_partitions`].

use std::time::Duration;

use crate::common::*;
use allocator::fenced::StockDelta;
use reqwest::StatusCode;
use schema::wire::{
    problem_type, AdjustmentRequest, Reservation, ReservationStatus, ReserveRequest,
};
use serde_json::json;

#[tokio::test]
async fn reserve_replay_confirm_release_lifecycle() {
    let (replica, db) = single_replica().await;
    let base = &replica.url;
    let api = &replica.api;
    restock(base, "widget", 10).await;

    let created = reserve(api, "r-1", "widget", 3).await;
    assert_eq!(created.status, StatusCode::CREATED);
    assert!(!created.replayed());
    let held: Reservation = created.ok();
    assert_eq!(held.status, ReservationStatus::Held);
    assert_eq!((held.sku.as_str(), held.quantity), ("widget", 3));
    assert!(held.epoch >= 1);

    // Replay: same id and payload → the original outcome, marked as replayed.
    let replay = reserve(api, "r-1", "widget", 3).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    let replayed: Reservation = replay.ok();
    assert_eq!(replayed.reservation_id, "r-1");
    assert_eq!(replayed.expires_at, held.expires_at);

    // Reuse with another payload is refused, never applied.
    let reuse = reserve(api, "r-1", "widget", 4).await;
    assert_eq!(reuse.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(reuse.problem().kind, problem_type::IDEMPOTENCY_MISMATCH);
    let reuse_sku = reserve(api, "r-1", "gadget", 3).await;
    assert_eq!(reuse_sku.status, StatusCode::UNPROCESSABLE_ENTITY);

    let inventory = api.inventory("widget").await.ok();
    assert_eq!(inventory.available, 7);
    assert_eq!(inventory.held, 3);

    // Confirm, and confirm again (idempotent), then release is forbidden.
    let confirm = api.confirm("r-1").await;
    assert_eq!(confirm.status, StatusCode::OK);
    let confirmed: Reservation = confirm.ok();
    assert_eq!(confirmed.status, ReservationStatus::Confirmed);
    let again = api.confirm("r-1").await;
    assert_eq!(again.status, StatusCode::OK);
    assert!(again.replayed());
    let release = api.release("r-1").await;
    assert_eq!(release.status, StatusCode::CONFLICT);
    let p = release.problem();
    assert_eq!(p.kind, problem_type::INVALID_STATE);
    assert_eq!(p.current_status, Some(ReservationStatus::Confirmed));

    // Release path: release twice is fine, confirm afterwards is not.
    assert_eq!(
        reserve(api, "r-2", "widget", 2).await.status,
        StatusCode::CREATED
    );
    assert_eq!(api.release("r-2").await.status, StatusCode::OK);
    let twice = api.release("r-2").await;
    assert_eq!(twice.status, StatusCode::OK);
    assert!(twice.replayed());
    let late_confirm = api.confirm("r-2").await;
    assert_eq!(late_confirm.status, StatusCode::CONFLICT);
    assert_eq!(
        late_confirm.problem().current_status,
        Some(ReservationStatus::Released)
    );

    let fetched = api.reservation("r-2").await.ok();
    assert_eq!(fetched.status, ReservationStatus::Released);

    let pg = client(&db).await;
    let (row, ledger) = ledger_balance(&pg, "widget").await;
    assert_eq!(
        row,
        StockDelta {
            on_hand: 10,
            available: 7,
            held: 0,
            confirmed: 3
        },
        "on_hand, available, held, confirmed"
    );
    assert_eq!(row, ledger, "the ledger sums to the row");
    replica.stop().await;
}

#[tokio::test]
async fn out_of_stock_outcome_is_durable_and_replayed() {
    let (replica, _db) = single_replica().await;
    let base = &replica.url;
    let api = &replica.api;
    restock(base, "scarce", 1).await;

    let refused = reserve(api, "want-2", "scarce", 2).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let p = refused.problem();
    assert_eq!(p.kind, problem_type::INSUFFICIENT_STOCK);
    assert_eq!(p.available, Some(1));

    // More stock arrives; the same id still gets its original answer.
    restock(base, "scarce", 5).await;
    let replay = reserve(api, "want-2", "scarce", 2).await;
    assert_eq!(replay.status, StatusCode::CONFLICT);
    assert!(replay.replayed());
    assert_eq!(replay.problem().available, Some(1));
    // GET and transitions on a refused id answer the same way.
    let get = api.reservation("want-2").await;
    assert_eq!(get.status, StatusCode::CONFLICT);
    assert_eq!(api.confirm("want-2").await.status, StatusCode::CONFLICT);
    // A new id is served from the new stock.
    assert_eq!(
        reserve(api, "want-2b", "scarce", 2).await.status,
        StatusCode::CREATED
    );
    replica.stop().await;
}

#[tokio::test]
async fn invalid_input_is_a_problem_never_a_500() {
    let (replica, _db) = single_replica().await;
    let base = &replica.url;
    let api = &replica.api;
    restock(base, "ok-sku", 5).await;
    for (body, why) in invalid_reservation_bodies() {
        let request = http().post(format!("{base}/v1/reservations")).json(&body);
        let p = refused(request, StatusCode::BAD_REQUEST, why).await;
        assert_eq!(p.kind, problem_type::INVALID_REQUEST, "{why}");
        assert_eq!(p.status, 400, "{why}");
    }

    // A refused value is answered in the words of its rule, from a body or a path segment.
    let response = http()
        .post(format!("{base}/v1/reservations"))
        .json(&json!({"reservation_id": "a", "sku": "ok-sku", "quantity": 0}))
        .send()
        .await
        .unwrap();
    let p = problem_of(response).await;
    assert_eq!(
        p.detail.as_deref(),
        Some("quantity must be between 1 and 1000000")
    );
    assert_eq!(p.title, "Invalid request");
    let request = http().get(format!("{base}/v1/inventory/bad%20sku"));
    let p = refused(request, StatusCode::BAD_REQUEST, "a path segment").await;
    assert_eq!(
        p.detail.as_deref(),
        Some("sku may contain only A-Z a-z 0-9 . _ : -")
    );

    let malformed = http()
        .post(format!("{base}/v1/reservations"))
        .header("content-type", "application/json")
        .body("{\"reservation_id\": \"a\", ");
    refused(malformed, StatusCode::BAD_REQUEST, "malformed json").await;

    let oversized = http()
        .post(format!("{base}/v1/reservations"))
        .header("content-type", "application/json")
        .body(format!(
            "{{\"reservation_id\": \"{}\"}}",
            "y".repeat(70_000)
        ));
    refused(oversized, StatusCode::PAYLOAD_TOO_LARGE, "oversized body").await;

    // A zero delta cannot be built as a `Delta`; send the raw body.
    let bad_adjust = api
        .send::<_, schema::wire::Adjustment>(
            &schema::routes::ADJUST,
            &["ok-sku"],
            Some(&json!({"adjustment_id": "z", "delta": 0})),
        )
        .await;
    assert_eq!(bad_adjust.status, StatusCode::BAD_REQUEST);
    bad_adjust.problem();

    for path in ["/v1/inventory/bad%20sku", "/v1/reservations/%01ctl"] {
        let request = http().get(format!("{base}{path}"));
        refused(request, StatusCode::BAD_REQUEST, path).await;
    }

    let unknown_route = http().get(format!("{base}/v2/nothing"));
    refused(unknown_route, StatusCode::NOT_FOUND, "unknown route").await;
    let wrong_method = http().delete(format!("{base}/v1/reservations"));
    refused(wrong_method, StatusCode::METHOD_NOT_ALLOWED, "wrong method").await;
    // A routing header that is there but not an integer is refused, not ignored.
    for (header, value) in [("x-expected-epoch", ""), ("x-assignment-revision", "seven")] {
        let garbled = http()
            .post(format!("{base}/v1/reservations"))
            .json(&json!({"reservation_id": "garbled", "sku": "ok-sku", "quantity": 1}))
            .header(header, value);
        refused(
            garbled,
            StatusCode::BAD_REQUEST,
            &format!("{header}: {value:?}"),
        )
        .await;
    }

    // Unknown things are 404s.
    let unknown_reservation = api.confirm("nope").await;
    assert_eq!(unknown_reservation.status, StatusCode::NOT_FOUND);
    unknown_reservation.problem();
    let unknown_sku = reserve(api, "u-1", "never-stocked", 1).await;
    assert_eq!(unknown_sku.status, StatusCode::NOT_FOUND);
    unknown_sku.problem();
    let unknown_inventory = api.inventory("never-stocked").await;
    assert_eq!(unknown_inventory.status, StatusCode::NOT_FOUND);

    // Nothing above touched the stock.
    let inventory = api.inventory("ok-sku").await.ok();
    assert_eq!(inventory.available, 5);
    replica.stop().await;
}

#[tokio::test]
async fn adjustments_are_fenced_idempotent_and_refuse_shrinking_held_stock() {
    let (replica, db) = single_replica().await;
    let api = &replica.api;
    let adjust = |id: &'static str, delta: i64| {
        let request = AdjustmentRequest {
            adjustment_id: id.parse().expect("valid id"),
            delta: delta.try_into().expect("valid delta"),
        };
        async move { api.adjust("bolt", &request).await }
    };
    // Shrinking a SKU that does not exist yet.
    assert_eq!(adjust("a-0", -1).await.status, StatusCode::NOT_FOUND);
    let created = adjust("a-1", 10).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let replay = adjust("a-1", 10).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    assert_eq!(
        adjust("a-1", 11).await.status,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    assert_eq!(
        reserve(api, "hold-8", "bolt", 8).await.status,
        StatusCode::CREATED
    );
    let shrink = adjust("a-2", -3).await;
    assert_eq!(shrink.status, StatusCode::CONFLICT);
    let p = shrink.problem();
    assert_eq!(p.kind, problem_type::SHRINK_BELOW_HELD);
    assert_eq!(p.available, Some(2));
    assert_eq!(adjust("a-3", -2).await.status, StatusCode::CREATED);

    let pg = client(&db).await;
    let (row, ledger) = ledger_balance(&pg, "bolt").await;
    assert_eq!(
        row,
        StockDelta {
            on_hand: 8,
            available: 0,
            held: 8,
            confirmed: 0
        }
    );
    assert_eq!(row, ledger);
    replica.stop().await;
}

#[tokio::test]
async fn overdue_holds_expire_and_return_stock() {
    let (replica, db) = single_replica().await;
    let base = &replica.url;
    let api = &replica.api;
    restock(base, "melon", 4).await;
    let response = api
        .reserve(&ReserveRequest {
            reservation_id: "short".parse().expect("valid id"),
            sku: "melon".parse().expect("valid sku"),
            quantity: 3.try_into().expect("valid quantity"),
            ttl_seconds: Some(1.try_into().expect("valid ttl")),
        })
        .await;
    assert_eq!(response.status, StatusCode::CREATED);
    assert_eq!(
        reserve(api, "long", "melon", 1).await.status,
        StatusCode::CREATED
    );

    let pg = client(&db).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let status: String = pg
            .query_one(
                "SELECT status FROM reservations WHERE reservation_id = 'short'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if status == "expired" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "hold never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (row, ledger) = ledger_balance(&pg, "melon").await;
    assert_eq!(
        row,
        StockDelta {
            on_hand: 4,
            available: 3,
            held: 1,
            confirmed: 0
        },
        "the expired hold's stock is available again"
    );
    assert_eq!(row, ledger);
    let confirm = api.confirm("short").await;
    assert_eq!(confirm.status, StatusCode::CONFLICT);
    assert_eq!(
        confirm.problem().current_status,
        Some(ReservationStatus::Expired)
    );
    // Releasing an expired hold leaves the client where it wanted to be.
    assert_eq!(api.release("short").await.status, StatusCode::OK);
    let get = api.reservation("long").await.ok();
    assert_eq!(get.status, ReservationStatus::Held);
    replica.stop().await;
}

#[tokio::test]
async fn two_hundred_concurrent_reserves_on_fifty_units_hold_exactly_fifty() {
    let (replica, db) = single_replica().await;
    let base = replica.url.clone();
    restock(&base, "hot", 50).await;
    let attempts = (0..200).map(|i| {
        let api = replica.api.clone();
        tokio::spawn(async move { reserve(&api, &format!("c-{i}"), "hot", 1).await.status })
    });
    let statuses: Vec<StatusCode> = futures::future::join_all(attempts)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let held = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((held, refused), (50, 150), "{statuses:?}");

    let pg = client(&db).await;
    let (row, ledger) = ledger_balance(&pg, "hot").await;
    assert_eq!(
        row,
        StockDelta {
            on_hand: 50,
            available: 0,
            held: 50,
            confirmed: 0
        }
    );
    assert_eq!(row, ledger);
    let counts = pg
        .query_one(
            "SELECT count(*) FILTER (WHERE status = 'held'), count(*) FILTER (WHERE status = 'rejected'),
                    (SELECT count(*) FROM ledger WHERE sku = 'hot' AND kind = 'reserve')
               FROM reservations WHERE sku = 'hot'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(counts.get::<_, i64>(0), 50);
    assert_eq!(counts.get::<_, i64>(1), 150);
    assert_eq!(
        counts.get::<_, i64>(2),
        50,
        "one ledger row per decrement (I2)"
    );
    replica.stop().await;
}
