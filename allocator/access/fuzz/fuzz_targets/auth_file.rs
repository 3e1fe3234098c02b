//! The auth file parser on arbitrary text: it refuses or accepts, never panics, and what it
//! accepts is consistent: every client is named once (a name on several lines, a token
//! rotation, is one client), every client's policy survives the trip through the header a
//! router forwards, and every line's token hash finds its own client only.
#![no_main]

use access::table::TokenTable;
use access::Policy;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(table) = TokenTable::parse("fuzz", text) else {
        return;
    };
    assert!(!table.is_empty());
    let names: Vec<&str> = table.names().collect();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "a client named twice");
    assert_eq!(names.len(), table.len());
    assert!(table.tokens() >= table.len());
    for name in names {
        assert!(access::table::valid_name(name), "{name:?}");
    }
    for line in text.lines() {
        for option in line.split('#').next().unwrap_or_default().split_whitespace() {
            // Whatever policy options a line holds parse alone exactly as they parsed in it.
            if let Ok(policy) = Policy::parse_options(option) {
                assert_eq!(Policy::parse_options(policy.header()).unwrap(), policy);
            }
        }
    }
});
