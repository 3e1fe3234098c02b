//! One private PostgreSQL per test binary, shared by its tests, each of which gets a fresh
//! database.
//!
//! Starting a cluster takes a second or two; most tests only need an isolated database, not an
//! isolated server. The server starts on first use (on a thread with its own runtime, since each
//! `#[tokio::test]` has its own) and is shut down by an `atexit` hook when the test binary exits,
//! because statics are never dropped. Tests that stop, pause or cut off the database start their
//! own [`PgServer`] instead.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, Once};

use super::PgServer;

static SERVER: Mutex<Option<PgServer>> = Mutex::new(None);
static START: Once = Once::new();
static NEXT_DATABASE: AtomicU32 = AtomicU32::new(0);

extern "C" fn stop_shared_server() {
    if let Ok(mut server) = SERVER.lock() {
        server.take();
    }
}

/// URL of the shared server's `postgres` database, starting the server if needed.
pub fn shared_server_url() -> String {
    START.call_once(|| {
        let server = std::thread::spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime for the shared test server")
                .block_on(PgServer::start())
        })
        .join()
        .expect("shared server thread")
        .expect("start the shared test PostgreSQL");
        *SERVER.lock().expect("shared server lock") = Some(server);
        // SAFETY: registering a plain `extern "C" fn` with no captured state.
        unsafe {
            libc::atexit(stop_shared_server);
        }
    });
    SERVER
        .lock()
        .expect("shared server lock")
        .as_ref()
        .expect("shared server running")
        .url()
}

/// Create an empty database on the shared server and return its URL.
pub async fn fresh_database(prefix: &str) -> anyhow::Result<String> {
    let base = shared_server_url();
    let name = format!(
        "{prefix}_{}_{}",
        std::process::id(),
        NEXT_DATABASE.fetch_add(1, Ordering::Relaxed)
    );
    let (client, connection) = tokio_postgres::connect(&base, tokio_postgres::NoTls).await?;
    let task = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await?;
    drop(client);
    let _ = task.await;
    let url = base
        .rsplit_once('/')
        .map(|(server, _)| format!("{server}/{name}"))
        .expect("server url has a database path");
    Ok(url)
}
