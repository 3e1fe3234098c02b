//! The client policy grammar (auth-file options, and the `X-Allocator-Client-Policy` header an
//! allocator reads from routers) on arbitrary text: it refuses or accepts, never panics; what it
//! accepts is written back in the same grammar and read back equal, and its namespace check
//! agrees with the patterns it holds.
#![no_main]

use access::Policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policy) = Policy::parse_options(text) else {
        return;
    };
    let again = Policy::parse_options(policy.header()).expect("a written policy parses");
    assert_eq!(again, policy);
    assert_eq!(policy.is_empty(), policy.header().is_empty());
    for pattern in policy.skus() {
        let text = pattern.as_str();
        let sku = text.strip_suffix('*').unwrap_or(text);
        assert!(policy.permits(sku), "{sku:?} is inside {text:?}");
        assert!(!text.is_empty() && !sku.contains('*'));
    }
    for quota in access::Quota::ALL {
        assert!(policy.quota(quota).is_none_or(|n| n > 0));
    }
});
