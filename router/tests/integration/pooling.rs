//! A router refuses to start behind PgBouncer in transaction mode (the allocator's
//! `pgbouncer` tests show a whole cluster, router included, working in session mode): its map
//! reads, orders and `LISTEN` need one server session per connection, as the storage fence does.

use router::{Application, RouterConfig};
use testkit::{PgBouncer, PgServer, PoolMode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_refuses_transaction_pooling_at_start_up() {
    let server = PgServer::start().await.expect("postgres");
    server.create_database("pooled").await.expect("database");
    let bouncer = PgBouncer::start(&server, PoolMode::Transaction, 4)
        .await
        .expect("pgbouncer");
    let mut config = RouterConfig::new(bouncer.url_for("pooled"));
    config.listen = "127.0.0.1:0".to_owned();
    let error = match Application::build(config).await {
        Ok(_) => panic!("the router started behind transaction pooling"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        error.contains("pool_mode = session"),
        "the error names the cure: {error}"
    );
}
