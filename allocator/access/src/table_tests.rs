use super::*;

const TOKEN_A: &str = "token-a-0123456789";
const TOKEN_B: &str = "token-b-0123456789";

fn file(lines: &[String]) -> String {
    lines.join("\n")
}

fn parse(text: &str) -> Result<TokenTable, AuthFileError> {
    TokenTable::parse("auth.txt", text)
}

fn err(text: &str) -> String {
    parse(text).expect_err("refused").to_string()
}

#[test]
fn parses_clients_comments_and_options() {
    let text = file(&[
        "# clients".into(),
        String::new(),
        format!(
            "orders reserve {}  # the order service",
            hash_hex(TOKEN_A.as_bytes())
        ),
        format!(
            "  ops\treserve,admin {} rate=2.5 burst=7",
            hash_hex(TOKEN_B.as_bytes()).to_uppercase()
        ),
    ]);
    let table = parse(&text).unwrap();
    assert_eq!(table.len(), 2);
    let a = table.lookup(TOKEN_A.as_bytes()).unwrap();
    assert_eq!(a.name, "orders");
    assert!(a.scopes.contains(Scope::Reserve) && !a.scopes.contains(Scope::Admin));
    assert_eq!((a.rate, a.burst), (None, None));
    let b = table.lookup(TOKEN_B.as_bytes()).unwrap();
    assert_eq!(b.name, "ops");
    assert_eq!(b.scopes.to_string(), "reserve,admin");
    assert_eq!((b.rate, b.burst), (Some(2.5), Some(7)));
    assert!(a.policy.is_none() && b.policy.is_none());
    assert!(table.lookup(b"token-c").is_none());
    assert!(table.lookup(b"").is_none());
    // The hash itself is not a token.
    assert!(table
        .lookup(hash_hex(TOKEN_A.as_bytes()).as_bytes())
        .is_none());
}

#[test]
fn known_vector() {
    // printf %s test | sha256sum
    assert_eq!(
        hash_hex(b"test"),
        "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    );
}

#[test]
fn refusals_name_the_line() {
    let h = hash_hex(TOKEN_A.as_bytes());
    let cases = [
        ("a reserve".to_string(), 1, "expected"),
        (format!("\n\nbad/name reserve {h}"), 3, "client name"),
        (format!("a reserve,root {h}"), 1, "unknown scope"),
        (format!("a reserve,reserve {h}"), 1, "twice"),
        (format!("a reserve,{h}"), 1, "expected"),
        (format!("a reserve {TOKEN_A}"), 1, "never the token itself"),
        (format!("a reserve {}", &h[..63]), 1, "64 hex digits"),
        (format!("a reserve {}g", &h[..63]), 1, "64 hex digits"),
        (format!("a reserve {h} rate=0"), 1, "rate must be"),
        (format!("a reserve {h} rate=nan"), 1, "rate must be"),
        (format!("a reserve {h} burst=0"), 1, "burst must be"),
        (format!("a reserve {h} rate=1 rate=2"), 1, "repeated option"),
        (
            format!("a reserve {h} colour=blue"),
            1,
            "unknown or repeated",
        ),
        (format!("a reserve {h} skus"), 1, "not KEY=VALUE"),
        (format!("a reserve {h} skus=*"), 1, "leave skus= out"),
        (format!("a reserve {h} skus=a:*,b/c"), 1, "may contain only"),
        (format!("a reserve {h} max_quantity=0"), 1, "at least 1"),
        (
            format!("a reserve {h} max_held_units=2 max_held_units=3"),
            1,
            "twice",
        ),
        (
            format!("a reserve {h}\na admin {}", hash_hex(b"other")),
            2,
            "also on line 1 with other scopes or options",
        ),
        (
            format!("a reserve {h} rate=2\n\na reserve {}", hash_hex(b"other")),
            3,
            "also on line 1",
        ),
        (
            format!(
                "a reserve {h} skus=a:*\na reserve {} skus=b:*",
                hash_hex(b"other")
            ),
            2,
            "must agree",
        ),
        (
            format!("a reserve {h}\nb admin {h}"),
            2,
            "already on line 1",
        ),
    ];
    for (text, line, words) in cases {
        let message = err(&text);
        assert!(
            message.starts_with(&format!("auth.txt:{line}: ")) && message.contains(words),
            "{text:?} → {message}"
        );
    }
}

#[test]
fn namespaces_and_quotas_are_read_per_client() {
    let text = file(&[
        format!(
            "acme reserve {} skus=acme:*,beta:tee rate=3 skus=gamma:1 max_quantity=2",
            hash_hex(TOKEN_A.as_bytes())
        ),
        format!(
            "hoarder reserve {} max_held_per_sku=2 max_held_units=10",
            hash_hex(TOKEN_B.as_bytes())
        ),
    ]);
    let table = parse(&text).unwrap();
    let acme = table.lookup(TOKEN_A.as_bytes()).unwrap();
    assert_eq!(acme.rate, Some(3.0));
    let policy = acme.policy.as_deref().unwrap();
    assert_eq!(
        policy.header(),
        "skus=acme:*,beta:tee,gamma:1 max_quantity=2"
    );
    assert!(policy.permits("acme:x") && policy.permits("gamma:1"));
    assert!(!policy.permits("gamma:12") && !policy.permits("beta:teeshirt"));
    let hoarder = table.lookup(TOKEN_B.as_bytes()).unwrap();
    let policy = hoarder.policy.as_deref().unwrap();
    assert!(policy.permits("anything") && !policy.checks_requests());
    assert_eq!(
        (policy.max_held_per_sku, policy.max_held_units),
        (Some(2), Some(10))
    );
}

#[test]
fn a_file_without_clients_is_refused() {
    assert!(err("# nobody\n\n").contains("lists no client"));
    assert!(err("").contains("lists no client"));
}

#[test]
fn load_reports_the_path() {
    let missing = TokenTable::load(Path::new("/nonexistent/auth.txt")).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/auth.txt"),
        "{missing}"
    );
}

#[test]
fn lookup_finds_every_entry_not_only_the_first() {
    let lines: Vec<String> = (0..20)
        .map(|i| format!("c{i} reserve {}", hash_hex(format!("tok-{i}").as_bytes())))
        .collect();
    let table = parse(&file(&lines)).unwrap();
    for i in 0..20 {
        let token = format!("tok-{i}");
        assert_eq!(
            table.lookup(token.as_bytes()).unwrap().name,
            format!("c{i}")
        );
    }
}

/// Rotating a token without a new name: two lines of one client, two tokens, one identity.
#[test]
fn one_client_may_hold_two_tokens_for_a_rotation() {
    let text = file(&[
        format!(
            "shop reserve,admin {} rate=3 skus=acme:* max_held_per_sku=2",
            hash_hex(TOKEN_A.as_bytes())
        ),
        format!("other reserve {}", hash_hex(b"other-token")),
        format!(
            "shop reserve,admin {} rate=3 skus=acme:* max_held_per_sku=2  # the new token",
            hash_hex(TOKEN_B.as_bytes())
        ),
    ]);
    let table = parse(&text).unwrap();
    let old = table.lookup(TOKEN_A.as_bytes()).unwrap();
    let new = table.lookup(TOKEN_B.as_bytes()).unwrap();
    assert_eq!(old, new, "both tokens are the same client");
    assert_eq!(new.name, "shop");
    assert_eq!(table.len(), 2, "two clients");
    assert_eq!(table.tokens(), 3);
    assert_eq!(table.names().collect::<Vec<_>>(), ["shop", "other"]);
}
