//! Per-client limits at the gate: by client, with the auth file's overrides; a client listed with
//! two tokens (a rotation) is one client: one owner, one rate bucket, one in-flight count.

use super::*;

#[test]
fn limits_apply_by_client_with_overrides() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    writeln!(file, "slow reserve {} rate=1 burst=1", hash_hex(b"t-slow")).unwrap();
    writeln!(file, "fast reserve {}", hash_hex(b"t-fast")).unwrap();
    let gate = gate(Role::Router, &file, |s| {
        // Slow enough that no token comes back while the test runs.
        s.rate = Some(1.0);
        s.burst = Some(3);
    });
    let slow = headers(Some("t-slow"), None);
    let fast = headers(Some("t-fast"), None);
    let ask_at = |h: &HeaderMap| admit_at(&gate, "POST", "/v1/reservations", Some(RESERVE.1), h);
    ask_at(&slow).unwrap();
    assert_eq!(
        ask_at(&slow).unwrap_err(),
        AccessError::RateLimited {
            client: "slow".into(),
            rate: 1.0,
            retry_after: 1
        }
    );
    for _ in 0..3 {
        ask_at(&fast).unwrap();
    }
    assert!(matches!(
        ask_at(&fast),
        Err(AccessError::RateLimited { .. })
    ));
}

#[test]
fn two_tokens_of_one_client_share_its_owner_bucket_and_slots() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let line = |token: &str| format!("shop reserve {} rate=1 burst=1", hash_hex(token.as_bytes()));
    writeln!(file, "{}\n{}", line("t-old"), line("t-new")).unwrap();
    let gate = gate(Role::Router, &file, |s| s.concurrency = NonZeroUsize::new(1));
    let (old, new) = (headers(Some("t-old"), None), headers(Some("t-new"), None));
    let first = ask(&gate, RESERVE, &old).unwrap();
    assert_eq!(first.owner, Owner::client("shop", false));
    // The old token's request holds the client's one slot.
    assert_eq!(
        ask(&gate, RESERVE, &new).unwrap_err(),
        AccessError::ConcurrencyLimited {
            client: "shop".into(),
            limit: 1
        }
    );
    drop(first);
    // And it took the one token of the client's bucket.
    assert_eq!(
        ask(&gate, RESERVE, &new).unwrap_err(),
        AccessError::RateLimited {
            client: "shop".into(),
            rate: 1.0,
            retry_after: 1
        }
    );
}
