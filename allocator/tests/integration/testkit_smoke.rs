//! Smoke tests for the fault-injection harness itself (`testkit`).
//!
//! The harness is what every failure test relies on, so its faults must do exactly what they
//! claim (a paused server really hangs, a stopped one really refuses connections) and it must
//! never leak processes.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use testkit::{cargo_bin, free_port, ChildProcess, PgServer, ProxyMode, RedisServer, TcpProxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_postgres::{Client, NoTls};

/// Connects with a bound on the whole handshake and drives the connection in a task.
async fn connect(url: &str, timeout: Duration) -> Result<Client> {
    let (client, connection) = tokio::time::timeout(timeout, tokio_postgres::connect(url, NoTls))
        .await
        .map_err(|_| anyhow!("connect timed out"))??;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// `SELECT 1` bounded by `timeout`.
async fn select_one(client: &Client, timeout: Duration) -> Result<i32> {
    let row = tokio::time::timeout(timeout, client.query_one("SELECT 1::int4", &[]))
        .await
        .map_err(|_| anyhow!("query timed out"))??;
    Ok(row.get(0))
}

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; treat it as dead.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .next();
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) {
            let ppid = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .nth(1);
            if ppid == Some(&pid.to_string()) {
                out.push(child);
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lifecycle_and_faults() -> Result<()> {
    let mut pg = PgServer::start().await?;
    assert_ne!(pg.port(), 5432);
    assert_eq!(
        pg.url(),
        format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port())
    );

    let db_url = pg.create_database("smoke-db").await?;
    assert!(db_url.ends_with("/smoke-db"), "{db_url}");
    let client = connect(&db_url, Duration::from_secs(5)).await?;
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);
    client
        .batch_execute("CREATE TABLE t (v int); INSERT INTO t VALUES (42);")
        .await?;

    // Pause: the established connection hangs, and so does a new one.
    pg.pause()?;
    assert!(pg.is_paused());
    let err = select_one(&client, Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err:#}");
    assert!(connect(&db_url, Duration::from_secs(1)).await.is_err());

    // Resume: everything works again on the same connection.
    pg.resume()?;
    assert!(!pg.is_paused());
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);

    // Fast stop: the session is terminated and new connections are refused.
    pg.stop().await?;
    assert!(!pg.is_running());
    assert!(select_one(&client, Duration::from_secs(5)).await.is_err());
    assert!(connect(&db_url, Duration::from_secs(2)).await.is_err());

    // Restart on the same port with the same data.
    let port = pg.port();
    pg.restart().await?;
    assert_eq!(pg.port(), port);
    let client = connect(&db_url, Duration::from_secs(5)).await?;
    let v: i32 = client.query_one("SELECT v FROM t", &[]).await?.get(0);
    assert_eq!(v, 42);

    // Crash while paused (the hardest case: frozen backends must be killed too), then recover.
    let pid = pg.pid();
    pg.pause()?;
    pg.kill()?;
    assert!(!alive(pid));
    assert!(select_one(&client, Duration::from_secs(5)).await.is_err());
    assert!(connect(&db_url, Duration::from_secs(2)).await.is_err());
    pg.restart().await?;
    assert_ne!(pg.pid(), pid);
    let client = connect(&db_url, Duration::from_secs(5)).await?;
    let v: i32 = client.query_one("SELECT v FROM t", &[]).await?.get(0);
    assert_eq!(v, 42);

    // Drop kills the whole tree (even paused) and removes the directory.
    let pid = pg.pid();
    let children = children_of(pid);
    assert!(!children.is_empty(), "postmaster should have backends");
    let data_dir = pg.data_dir().to_path_buf();
    pg.pause()?;
    drop(pg);
    assert!(!alive(pid), "postmaster {pid} survived drop");
    for child in children {
        assert!(!alive(child), "backend {child} survived drop");
    }
    assert!(!data_dir.exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_servers_run_in_parallel() -> Result<()> {
    let (a, b) = tokio::try_join!(PgServer::start(), PgServer::start())?;
    assert_ne!(a.port(), b.port());
    for pg in [&a, &b] {
        let client = pg.client().await?;
        assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);
    }
    Ok(())
}

async fn redis_ping(port: u16) -> Result<String> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"PING\r\n").await?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await?;
        anyhow::Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(2), fut)
        .await
        .map_err(|_| anyhow!("ping timed out"))?
}

#[tokio::test]
async fn redis_stop_and_start_again() -> Result<()> {
    let mut redis = RedisServer::start().await?;
    let port = redis.port();
    assert_ne!(port, 6379);
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{port}/"));
    assert!(redis_ping(port).await?.starts_with("+PONG"));

    let pid = redis.pid().unwrap();
    redis.stop()?;
    assert!(!alive(pid));
    assert!(redis_ping(port).await.is_err());

    redis.start_again().await?;
    assert_eq!(redis.port(), port);
    assert!(redis_ping(port).await?.starts_with("+PONG"));

    let pid = redis.pid().unwrap();
    drop(redis);
    assert!(!alive(pid));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_pass_delay_blackhole_cut() -> Result<()> {
    let pg = PgServer::start().await?;
    let upstream: SocketAddr = ([127, 0, 0, 1], pg.port()).into();
    let proxy = TcpProxy::start(upstream)?;
    assert_eq!(proxy.mode(), ProxyMode::Pass);
    let url = format!("postgres://postgres@{}/postgres", proxy.addr());

    let client = connect(&url, Duration::from_secs(5)).await?;
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);
    assert_eq!(proxy.active_connections(), 1);

    // Delay: every chunk in both directions waits, so a round trip takes at least 2x.
    proxy.set_mode(ProxyMode::Delay(Duration::from_millis(200)));
    let started = Instant::now();
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );

    // Blackhole: the existing connection hangs, new connections are accepted but never served.
    proxy.set_mode(ProxyMode::Blackhole);
    let err = select_one(&client, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("timed out"), "{err:#}");
    assert!(connect(&url, Duration::from_secs(1)).await.is_err());

    // Heal: the same connection works again.
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);

    // Cut: existing connections die at once, new ones work.
    proxy.cut_all();
    let err = select_one(&client, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(!err.to_string().contains("timed out"), "{err:#}");
    assert!(client.is_closed());
    let client = connect(&url, Duration::from_secs(5)).await?;
    assert_eq!(select_one(&client, Duration::from_secs(5)).await?, 1);

    // Dropping the proxy closes its connections and its port.
    let addr = proxy.addr();
    drop(proxy);
    assert!(select_one(&client, Duration::from_secs(5)).await.is_err());
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    Ok(())
}

#[tokio::test]
async fn child_process_signals_and_log() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("logs/child.log");
    let mut child = ChildProcess::spawn(
        Path::new("/bin/sh"),
        ["-c", "echo started $GREETING; exec sleep 30"],
        &[("GREETING".to_string(), "hello".to_string())],
        &log,
    )?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !child.log_tail(5).contains("started hello") {
        assert!(Instant::now() < deadline, "log: {}", child.log_tail(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.sigstop()?;
    child.sigcont()?;
    assert!(child.wait_exit(Duration::from_millis(100)).await.is_err());
    child.sigterm()?;
    let status = child.wait_exit(Duration::from_secs(5)).await?;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15));
    assert!(
        child.sigstop().is_err(),
        "signalling an exited child must fail"
    );
    child.sigkill()?;

    // Drop of a running child kills it.
    let child = ChildProcess::spawn(Path::new("/bin/sleep"), ["30"], &[], &log)?;
    let pid = child.pid();
    drop(child);
    assert!(!alive(pid));

    let port = free_port();
    assert_ne!(port, 0);
    std::net::TcpListener::bind(("127.0.0.1", port)).context("free_port must be bindable")?;

    let bin = cargo_bin("allocator");
    assert!(bin.is_file(), "{} missing", bin.display());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_are_cleaned_up_when_a_test_panics() -> Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let pg = PgServer::start().await.unwrap();
        let redis = RedisServer::start().await.unwrap();
        let _client = pg.client().await.unwrap();
        pg.pause().unwrap();
        let pids = (pg.pid(), children_of(pg.pid()), redis.pid().unwrap());
        tx.send((pids, pg.data_dir().to_path_buf())).unwrap();
        panic!("simulated test failure");
    });
    let ((pg_pid, backends, redis_pid), data_dir) = rx.await?;
    assert!(task.await.unwrap_err().is_panic());
    assert!(!alive(pg_pid));
    assert!(!backends.is_empty());
    for pid in backends {
        assert!(!alive(pid), "backend {pid} survived the panic");
    }
    assert!(!alive(redis_pid));
    assert!(!data_dir.exists());
    Ok(())
}
