//! A client listed with two tokens (a rotation) is one client to the gate: one owner, one rate
//! bucket, one in-flight count.

use super::*;

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
