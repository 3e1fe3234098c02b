//! The `allocator serve` binary refuses a configuration that cannot work: it exits with a
//! non-zero status (not a panic) and a message naming the flag and its environment variable,
//! before it connects to anything.

use std::process::{Command, Output};

fn serve(envs: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allocator"))
        .env_clear()
        .env("RUST_LOG", "off")
        // Never reached: the configuration is refused first.
        .env("DATABASE_URL", "postgres://127.0.0.1:1/unreachable")
        .env("ALLOCATOR_REPLICA_ID", "config-test")
        .envs(envs.iter().copied())
        .arg("serve")
        .args(args)
        .output()
        .expect("run allocator")
}

fn assert_refused(output: &Output, words: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for word in words {
        assert!(stderr.contains(word), "{word:?} not in {stderr}");
    }
}

#[test]
fn a_zero_count_from_the_environment_is_refused() {
    let output = serve(&[("ALLOCATOR_BATCH_MAX", "0")], &[]);
    assert_refused(&output, &["--batch-max", "ALLOCATOR_BATCH_MAX"]);
}

#[test]
fn a_renewal_slower_than_the_lease_is_refused() {
    let output = serve(
        &[],
        &["--lease-ttl-ms", "3000", "--renew-interval-ms", "2500"],
    );
    assert_refused(
        &output,
        &[
            "--renew-interval-ms",
            "ALLOCATOR_RENEW_INTERVAL_MS",
            "--lease-ttl-ms",
        ],
    );
}
