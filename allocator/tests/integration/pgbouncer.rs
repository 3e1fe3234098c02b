//! PgBouncer in front of PostgreSQL (`testkit::PgBouncer`, Debian's 1.18).
//!
//! - **Session pooling** (what ops/README.md recommends) works: a cluster migrated, served and
//!   routed entirely through it reserves, replays a reserve and confirms, with one reservation row
//!   and a balanced inventory row on the server; the pools' server-side timeouts reach the server
//!   through it (they are `SET` on each new session: PgBouncer refuses the startup packet's
//!   `options`).
//! - **Transaction and statement pooling** are refused at start-up with an error that names the
//!   cure (`pool_mode = session`): by the allocator's `serve`, by `migrate`, and by the check
//!   itself (`edge::pg::require_session_pooling`), which a direct connection passes.

use std::time::Duration;

use allocator::sessions::PoolSettings;
use testkit::cluster::Database;
use testkit::{ApiClient, Cluster, PgBouncer, PgServer, PoolMode};

use crate::common::{fast_config, migrate, reserve, restock_with, PARTITIONS};

/// What a refusal must say so that an operator knows what to change.
const CURE: &str = "pool_mode = session";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_works_through_pgbouncer_in_session_mode() {
    let server = PgServer::start().await.expect("postgres");
    let direct = server.create_database("bounced").await.expect("database");
    let bouncer = PgBouncer::start(&server, PoolMode::Session, 40)
        .await
        .expect("pgbouncer");
    let cluster = Cluster::builder()
        .name("pgbouncer_session")
        .database(Database::Url(bouncer.url_for("bounced")))
        .routers(1)
        .start()
        .await
        .unwrap_or_else(|e| panic!("cluster through PgBouncer: {e:#}\n{}", bouncer.log_tail(20)));
    let api = ApiClient::new(cluster.routers[0].url.clone());
    restock_with(&api, "bounced-sku", 10).await;

    let first = reserve(&api, "bounced-1", "bounced-sku", 3).await;
    assert_eq!(first.status, 201, "reserve: {:?}", first.body);
    let again = reserve(&api, "bounced-1", "bounced-sku", 3).await;
    assert!(again.status.is_success(), "replay: {:?}", again.body);
    assert!(
        again.replayed(),
        "the second reserve with one id is a replay"
    );
    let confirmed = api.confirm("bounced-1").await;
    assert_eq!(confirmed.status, 200, "confirm: {:?}", confirmed.body);

    // What the server holds, read directly (not through PgBouncer).
    let pg = crate::common::client(&direct).await;
    let rows: i64 = pg
        .query_one(
            "SELECT count(*) FROM reservations WHERE reservation_id = 'bounced-1'",
            &[],
        )
        .await
        .expect("count")
        .get(0);
    assert_eq!(rows, 1, "one reservation row for one id");
    let stock = pg
        .query_one(
            "SELECT on_hand, available, held, confirmed FROM inventory WHERE sku = 'bounced-sku'",
            &[],
        )
        .await
        .expect("inventory row");
    let (on_hand, available, held, confirmed): (i64, i64, i64, i64) =
        (stock.get(0), stock.get(1), stock.get(2), stock.get(3));
    assert_eq!((on_hand, available, held, confirmed), (10, 7, 0, 3));
    assert!(
        bouncer.log_tail(200).contains("login attempt"),
        "the services' sessions went through PgBouncer:\n{}",
        bouncer.log_tail(20)
    );

    // A pooled session through PgBouncer carries the pool's server-side timeouts.
    let pool = allocator::sessions::build_pool(
        &bouncer.url_for("bounced"),
        &PoolSettings {
            size: 1,
            wait: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            statement_timeout: Duration::from_millis(1234),
            idle_in_transaction_timeout: Duration::from_millis(2345),
            lock_timeout: Duration::from_millis(345),
            application_name: "pgbouncer-test".into(),
        },
    )
    .expect("pool");
    let session = pool
        .get()
        .await
        .expect("a pooled session through PgBouncer");
    let setting = |name: &'static str| {
        let session = &session;
        async move {
            session
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .expect("show")
                .get::<_, String>(0)
        }
    };
    assert_eq!(setting("statement_timeout").await, "1234ms");
    assert_eq!(setting("lock_timeout").await, "345ms");
    assert_eq!(setting("plan_cache_mode").await, "force_generic_plan");
    drop(session);
    cluster
        .shutdown(Duration::from_secs(10))
        .await
        .expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_and_statement_pooling_are_refused_at_start_up() {
    let server = PgServer::start().await.expect("postgres");
    let direct = server
        .create_database("multiplexed")
        .await
        .expect("database");
    migrate(&direct, PARTITIONS).await;
    // Four server sessions, so that two clients can share one only if the pooler multiplexes.
    for mode in [PoolMode::Transaction, PoolMode::Statement] {
        let bouncer = PgBouncer::start(&server, mode, 4).await.expect("pgbouncer");
        let url = bouncer.url_for("multiplexed");

        let serve = allocator::app::Application::build(fast_config(&url, "multiplexed")).await;
        let error = format!(
            "{:#}",
            serve.err().expect("serve refuses a multiplexing pooler")
        );
        assert!(
            error.contains(CURE),
            "{mode:?}: serve's error names the cure: {error}"
        );

        let migrate = allocator::sessions::connect(&url).await;
        let error = format!("{:#}", migrate.expect_err("migrate refuses it too"));
        assert!(error.contains(CURE), "{mode:?}: migrate's error: {error}");
    }

    // The same check passes on a direct connection and through session pooling.
    let session = PgBouncer::start(&server, PoolMode::Session, 4)
        .await
        .expect("pgbouncer");
    for url in [direct.clone(), session.url_for("multiplexed")] {
        let fence = allocator::sessions::fence(&url, "pooling-test").expect("fence");
        edge::pg::require_session_pooling(&fence, "pooling-test")
            .await
            .unwrap_or_else(|e| panic!("{url}: {e:#}"));
    }
}
