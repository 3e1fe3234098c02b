use super::*;

fn parse(extra: &[&str]) -> Result<AllocatorConfig> {
    let mut argv = vec![
        "allocator",
        "serve",
        "--database-url",
        "postgres://x/y",
        "--replica-id",
        "r1",
    ];
    argv.extend_from_slice(extra);
    let cli = Cli::try_parse_from(argv).expect("arguments parse");
    let Command::Serve(args) = cli.command else {
        panic!("serve expected")
    };
    AllocatorConfig::try_from(*args)
}

fn refused(extra: &[&str]) -> String {
    parse(extra)
        .expect_err(&format!("{extra:?} must be refused"))
        .to_string()
}

#[test]
fn defaults_are_accepted() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.lease_ttl, Duration::from_millis(5000));
    assert_eq!(config.renew_interval, Duration::from_millis(1666));
    assert_eq!(config.lease_margin, Duration::from_millis(1000));
    assert_eq!(config.batch_max.get(), 64);
    assert_eq!(config.expiry_batch.get(), 100);
    assert!(config.commit_lanes <= config.pool_size);
    assert_eq!(config.redis_url, None);
}

#[test]
fn zero_counts_are_refused_naming_flag_and_env() {
    for (flag, env) in [
        ("--batch-max", "ALLOCATOR_BATCH_MAX"),
        ("--queue-capacity", "ALLOCATOR_QUEUE_CAPACITY"),
        ("--pool-size", "ALLOCATOR_POOL_SIZE"),
        ("--group-max-partitions", "ALLOCATOR_GROUP_MAX_PARTITIONS"),
        ("--expiry-batch", "ALLOCATOR_EXPIRY_BATCH"),
        ("--http-workers", "ALLOCATOR_HTTP_WORKERS"),
        ("--commit-lanes", "ALLOCATOR_COMMIT_LANES"),
    ] {
        let err = refused(&[flag, "0"]);
        assert!(err.contains(flag) && err.contains(env), "{err}");
    }
}

#[test]
fn zero_durations_are_refused() {
    for (flag, env) in [
        ("--lease-ttl-ms", "ALLOCATOR_LEASE_TTL_MS"),
        ("--renew-interval-ms", "ALLOCATOR_RENEW_INTERVAL_MS"),
        ("--campaign-interval-ms", "ALLOCATOR_CAMPAIGN_INTERVAL_MS"),
        ("--pool-wait-ms", "ALLOCATOR_POOL_WAIT_MS"),
        ("--statement-timeout-ms", "ALLOCATOR_STATEMENT_TIMEOUT_MS"),
        (
            "--idle-in-transaction-timeout-ms",
            "ALLOCATOR_IDLE_IN_TX_TIMEOUT_MS",
        ),
        ("--lock-timeout-ms", "ALLOCATOR_LOCK_TIMEOUT_MS"),
        ("--request-timeout-ms", "ALLOCATOR_REQUEST_TIMEOUT_MS"),
        ("--expiry-interval-ms", "ALLOCATOR_EXPIRY_INTERVAL_MS"),
        // A zero margin would let the local deadline coincide with the lease's expiry by the
        // database clock, with nothing left for drift, scheduling or a pause.
        ("--lease-margin-ms", "ALLOCATOR_LEASE_MARGIN_MS"),
    ] {
        let err = refused(&[flag, "0"]);
        assert!(err.contains(flag) && err.contains(env), "{flag}: {err}");
    }
}

#[test]
fn lease_relations_are_refused() {
    let err = refused(&["--lease-ttl-ms", "1000", "--lease-margin-ms", "1000"]);
    assert!(
        err.contains("--lease-margin-ms") && err.contains("shorter"),
        "{err}"
    );
    let err = refused(&["--lease-ttl-ms", "3000", "--renew-interval-ms", "2000"]);
    assert!(err.contains("ALLOCATOR_RENEW_INTERVAL_MS"), "{err}");
    // ttl / 3 by default, so a short lease with a large margin leaves no room to renew.
    let err = refused(&["--lease-ttl-ms", "1200", "--lease-margin-ms", "900"]);
    assert!(err.contains("--renew-interval-ms"), "{err}");
    // Three renewal attempts of at least 20 ms must fit between the renewal and the deadline.
    let err = refused(&[
        "--lease-ttl-ms",
        "2000",
        "--lease-margin-ms",
        "500",
        "--renew-interval-ms",
        "1450",
    ]);
    assert!(
        err.contains("--renew-interval-ms") && err.contains("renewal attempts"),
        "{err}"
    );
    parse(&[
        "--lease-ttl-ms",
        "2000",
        "--lease-margin-ms",
        "500",
        "--renew-interval-ms",
        "1440",
    ])
    .unwrap();
    parse(&[
        "--lease-ttl-ms",
        "2000",
        "--lease-margin-ms",
        "500",
        "--renew-interval-ms",
        "500",
    ])
    .unwrap();
}

#[test]
fn other_relations_are_refused() {
    let err = refused(&["--expiry-interval-ms", "5"]);
    assert!(err.contains("at least 10 ms"), "{err}");
    let err = refused(&["--pool-size", "2", "--commit-lanes", "3"]);
    assert!(
        err.contains("--commit-lanes") && err.contains("--pool-size"),
        "{err}"
    );
    parse(&["--pool-size", "2", "--commit-lanes", "2"]).unwrap();
}

#[test]
fn a_config_changed_after_parsing_is_checked_again() {
    let mut config = parse(&[]).unwrap();
    config.renew_interval = config.lease_ttl;
    assert!(config.validate().is_err());
}

#[test]
fn settlement_grace_must_outlast_a_statement() {
    let err = refused(&[
        "--statement-timeout-ms",
        "3000",
        "--settlement-grace-ms",
        "3000",
    ]);
    assert!(
        err.contains("--settlement-grace-ms") && err.contains("ALLOCATOR_SETTLEMENT_GRACE_MS"),
        "{err}"
    );
    let err = refused(&["--settlement-window-secs", "0"]);
    assert!(err.contains("ALLOCATOR_SETTLEMENT_WINDOW_SECS"), "{err}");
    let config = parse(&["--statement-timeout-ms", "1000"]).unwrap();
    assert_eq!(config.settlement_grace, Duration::from_millis(3000));
    assert_eq!(config.settlement_window, Duration::from_secs(60));
}

#[test]
fn access_flags_are_parsed_and_refused_by_name() {
    let config = parse(&[]).unwrap();
    assert_eq!(config.access, access::Settings::off());
    let config = parse(&[
        "--auth-file",
        "/etc/allocator/auth",
        "--require-router",
        "--client-rate",
        "2.5",
        "--client-burst",
        "5",
        "--client-concurrency",
        "3",
    ])
    .unwrap();
    assert_eq!(
        config.access.auth_file.as_deref(),
        Some(std::path::Path::new("/etc/allocator/auth"))
    );
    assert!(config.access.require_router);
    assert_eq!(config.access.rate, Some(2.5));
    assert_eq!(config.access.burst, Some(5));
    assert_eq!(config.access.concurrency.map(NonZeroUsize::get), Some(3));

    let error = refused(&["--require-router"]);
    assert!(
        error.contains("ALLOCATOR_REQUIRE_ROUTER") && error.contains("ALLOCATOR_AUTH_FILE"),
        "{error}"
    );
    let error = refused(&["--client-rate", "0"]);
    assert!(
        error.contains("--client-rate (ALLOCATOR_CLIENT_RATE)"),
        "{error}"
    );
    let error = refused(&["--client-burst", "0"]);
    assert!(error.contains("ALLOCATOR_CLIENT_BURST"), "{error}");
    let error = refused(&["--client-concurrency", "0"]);
    assert!(error.contains("ALLOCATOR_CLIENT_CONCURRENCY"), "{error}");
}

#[test]
fn tls_flags_come_in_working_sets() {
    assert!(parse(&[]).unwrap().tls.is_none());
    let config = parse(&[
        "--tls-cert",
        "/etc/allocator/cert.pem",
        "--tls-key",
        "/etc/allocator/key.pem",
        "--tls-client-ca",
        "/etc/allocator/routers-ca.pem",
    ])
    .unwrap();
    let tls = config.tls.expect("tls settings");
    assert_eq!(
        tls.cert.path,
        std::path::Path::new("/etc/allocator/cert.pem")
    );
    assert!(tls.client_ca.is_some());
    let error = refused(&["--tls-cert", "/c.pem"]);
    assert!(
        error.contains("ALLOCATOR_TLS_CERT") && error.contains("ALLOCATOR_TLS_KEY"),
        "{error}"
    );
    let error = refused(&["--tls-client-ca", "/ca.pem"]);
    assert!(
        error.contains("--tls-client-ca (ALLOCATOR_TLS_CLIENT_CA)"),
        "{error}"
    );
}

#[test]
fn the_event_relay_needs_redis_and_positive_settings() {
    assert!(parse(&[]).unwrap().events.is_none());
    let err = refused(&["--events"]);
    assert!(
        err.contains("--events (ALLOCATOR_EVENTS)") && err.contains("REDIS_URL"),
        "{err}"
    );
    let on = ["--events", "true", "--redis-url", "redis://127.0.0.1/"];
    let events = parse(&on).unwrap().events.expect("relay on");
    assert_eq!((events.batch.get(), events.max_len.get()), (500, 100_000));
    for (flag, env) in [
        ("--events-batch", "ALLOCATOR_EVENTS_BATCH"),
        ("--events-max-len", "ALLOCATOR_EVENTS_MAX_LEN"),
        ("--events-interval-ms", "ALLOCATOR_EVENTS_INTERVAL_MS"),
    ] {
        let err = refused(&[&on[..], &[flag, "0"]].concat());
        assert!(err.contains(flag) && err.contains(env), "{err}");
    }
}
