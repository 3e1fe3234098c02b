//! Unit tests of the router's command line and its validation.

use super::*;

#[test]
fn command_line_defaults_match_new() {
    let cli = Cli::try_parse_from([
        "router",
        "serve",
        "--database-url",
        "postgres://x/y",
        "--listen",
        "127.0.0.1:0",
    ])
    .unwrap();
    let Command::Serve(args) = cli.command;
    let config = RouterConfig::try_from(args).unwrap();
    let defaults = RouterConfig::new("postgres://x/y");
    assert_eq!(config.poll_interval, defaults.poll_interval);
    assert_eq!(config.retry_deadline, defaults.retry_deadline);
    assert_eq!(config.db_pool_size, defaults.db_pool_size);
    assert_eq!(config.orders_db_pool_size, defaults.orders_db_pool_size);
    assert_eq!(
        config.upstream_request_timeout,
        defaults.upstream_request_timeout
    );
    assert_eq!(
        config.allocator_request_timeout,
        defaults.allocator_request_timeout
    );
    assert_eq!(config.redis_url, None);
    config.validate().unwrap();
}

#[test]
fn an_attempt_must_outlast_the_allocator_deadline() {
    let mut config = RouterConfig::new("postgres://x/y");
    // The default covers the allocators' default deadline with room to spare.
    assert!(
        config.upstream_request_timeout
            >= config.allocator_request_timeout + ALLOCATOR_ANSWER_SLACK
    );
    config.validate().unwrap();
    // The old default (2 s against the allocators' 5 s) abandoned attempts still running.
    config.upstream_request_timeout = Duration::from_millis(2000);
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("request deadline"), "{err}");
    config.allocator_request_timeout = Duration::from_millis(1000);
    config.validate().unwrap();
}

#[test]
fn access_flags_parse_and_refusals_name_them() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["router", "serve", "--database-url", "postgres://x/y"];
        argv.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command;
        RouterConfig::try_from(args)
    };
    let config = parse(&[
        "--auth-file",
        "/etc/router/auth",
        "--upstream-token-file",
        "/etc/router/token",
        "--client-rate",
        "10",
        "--client-burst",
        "20",
        "--client-concurrency",
        "4",
    ])
    .unwrap();
    assert_eq!(config.access.rate, Some(10.0));
    assert_eq!(config.access.burst, Some(20));
    assert_eq!(config.access.concurrency.map(NonZeroUsize::get), Some(4));
    assert!(config.upstream_token_file.is_some());
    assert_eq!(parse(&[]).unwrap().access, access::Settings::off());
    let error = parse(&["--client-concurrency", "0"])
        .unwrap_err()
        .to_string();
    assert!(error.contains("ROUTER_CLIENT_CONCURRENCY"), "{error}");
    let error = parse(&["--client-rate=-1"]).unwrap_err().to_string();
    assert!(
        error.contains("--client-rate (ROUTER_CLIENT_RATE)"),
        "{error}"
    );
}

#[test]
fn rejects_zero_durations() {
    let mut config = RouterConfig::new("postgres://x/y");
    config.retry_deadline = Duration::ZERO;
    let err = config.validate().unwrap_err().to_string();
    assert!(
        err.contains("--retry-deadline-ms") && err.contains("ROUTER_RETRY_DEADLINE_MS"),
        "{err}"
    );
    let mut config = RouterConfig::new("postgres://x/y");
    config.db_pool_size = 0;
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("ROUTER_DB_POOL_SIZE"), "{err}");
}

#[test]
fn tls_flags_come_in_working_sets() {
    let parse = |extra: &[&str]| {
        let mut argv = vec!["router", "serve", "--database-url", "postgres://x/y"];
        argv.extend_from_slice(extra);
        let Command::Serve(args) = Cli::try_parse_from(argv).unwrap().command;
        RouterConfig::try_from(args)
    };
    let plain = parse(&[]).unwrap();
    assert!(plain.tls.is_none() && plain.upstream_tls.is_none());
    let config = parse(&[
        "--tls-cert",
        "/c.pem",
        "--tls-key",
        "/k.pem",
        "--upstream-ca",
        "/ca.pem",
        "--upstream-client-cert",
        "/rc.pem",
        "--upstream-client-key",
        "/rk.pem",
    ])
    .unwrap();
    assert!(config.tls.unwrap().client_ca.is_none());
    assert!(config.upstream_tls.unwrap().identity.is_some());
    let error = parse(&["--tls-key", "/k.pem"]).unwrap_err().to_string();
    assert!(
        error.contains("ROUTER_TLS_KEY") && error.contains("ROUTER_TLS_CERT"),
        "{error}"
    );
    let error = parse(&[
        "--upstream-client-cert",
        "/c",
        "--upstream-client-key",
        "/k",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("--upstream-ca (ROUTER_UPSTREAM_CA)"),
        "{error}"
    );
}

fn parse_serve(argv: &[&str]) -> Result<RouterConfig> {
    let mut full = vec!["router", "serve"];
    full.extend_from_slice(argv);
    let Command::Serve(args) = Cli::try_parse_from(full)?.command;
    RouterConfig::try_from(args)
}

#[test]
fn one_database_is_the_default_shard() {
    let config = parse_serve(&["--database-url", "postgres://x/y"]).unwrap();
    assert_eq!(config.shards.len(), 1);
    assert_eq!(config.shards[0].name.as_str(), schema::shard::DEFAULT_SHARD);
    assert_eq!(config.shards[0].url, "postgres://x/y");
    let defaults = RouterConfig::new("postgres://x/y");
    assert_eq!(defaults.shards, config.shards);
}

#[test]
fn shards_are_kept_in_order_with_multi_host_urls() {
    let config = parse_serve(&[
        "--shard",
        "s0=postgres://a:5432,b:5432/x?target_session_attrs=read-write",
        "--shard",
        "s1=postgres://c/x",
    ])
    .unwrap();
    let names: Vec<&str> = config.shards.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["s0", "s1"]);
    assert_eq!(
        config.shards[0].url,
        "postgres://a:5432,b:5432/x?target_session_attrs=read-write"
    );
    assert_eq!(config.shard_names().len(), 2);
}

#[test]
fn shards_and_a_database_url_are_refused_together() {
    let error = parse_serve(&[
        "--database-url",
        "postgres://x/y",
        "--shard",
        "s0=postgres://a/x",
    ])
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("--database-url") && error.contains("--shard") && error.contains("not both"),
        "{error}"
    );
}

#[test]
fn a_shard_named_twice_or_malformed_is_refused() {
    let error = parse_serve(&[
        "--shard",
        "s0=postgres://a/x",
        "--shard",
        "s0=postgres://b/x",
    ])
    .unwrap_err()
    .to_string();
    assert!(error.contains("s0 is named twice"), "{error}");
    assert!(parse_serve(&["--shard", "postgres://a/x"]).is_err());
    assert!(parse_serve(&["--shard", "Bad=postgres://a/x"]).is_err());
    // Neither flag: clap refuses before the config exists.
    assert!(parse_serve(&[]).is_err());
    // A config built by hand is checked as well.
    let mut config = RouterConfig::new("postgres://x/y");
    config.shards.push(config.shards[0].clone());
    let error = config.validate().unwrap_err().to_string();
    assert!(error.contains("named twice"), "{error}");
    config.shards.clear();
    assert!(config.validate().is_err());
}
