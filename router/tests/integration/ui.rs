//! The operations page in a real browser: headless Chromium, driven over WebDriver
//! ([`testkit::Browser`]), loads `/ui` from a router in front of three allocators, and the test
//! reads what the page shows from its DOM (the `data-` attributes of the partition rows) — never
//! from the JSON behind it — while an allocator is killed.
//!
//! Without `chromium` and `chromedriver` installed the test is skipped with a message, unless
//! `CI=true`, where it fails instead (`ops/test.sh` installs them).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::Browser;

use crate::common::{serial, Cluster};

const PARTITIONS: u32 = 6;

/// What the page shows per partition: `(owner, epoch)`.
type Grid = BTreeMap<u32, (String, i64)>;

/// Reads the grid from the DOM, with the page's refresh count.
const READ_GRID: &str = r#"
    const rows = Array.from(document.querySelectorAll("tr[data-partition]"));
    return {
        updates: Number(document.body.dataset.updates || 0),
        state: document.getElementById("status").dataset.state,
        rows: rows.map((r) => [Number(r.dataset.partition), r.dataset.owner, Number(r.dataset.epoch)]),
        replicas: Array.from(document.querySelectorAll("tr[data-replica]"))
            .map((r) => [r.dataset.replica, r.dataset.alive, r.dataset.url]),
        settlement: document.getElementById("settlement").dataset.present,
        traffic: document.getElementById("traffic").hasAttribute("data-rps"),
    };
"#;

struct Page {
    updates: u64,
    grid: Grid,
    replicas: Vec<(String, String, String)>,
    raw: Value,
}

async fn read(browser: &Browser) -> Page {
    let raw = browser.execute(READ_GRID, vec![]).await.expect("read DOM");
    let grid = raw["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            let partition = row[0].as_u64().expect("partition") as u32;
            let owner = row[1].as_str().unwrap_or_default().to_owned();
            (partition, (owner, row[2].as_i64().expect("epoch")))
        })
        .collect();
    let replicas = raw["replicas"]
        .as_array()
        .expect("replicas")
        .iter()
        .map(|r| {
            let text = |i: usize| r[i].as_str().unwrap_or_default().to_owned();
            (text(0), text(1), text(2))
        })
        .collect();
    Page {
        updates: raw["updates"].as_u64().unwrap_or(0),
        grid,
        replicas,
        raw,
    }
}

/// Polls the DOM until `done` holds, or fails after `timeout` with the last state seen.
async fn wait_for(
    browser: &Browser,
    timeout: Duration,
    what: &str,
    done: impl Fn(&Page) -> bool,
) -> Page {
    let deadline = Instant::now() + timeout;
    loop {
        let page = read(browser).await;
        if done(&page) {
            return page;
        }
        assert!(
            Instant::now() < deadline,
            "the page did not show {what} within {timeout:?}; last DOM state: {:#}",
            page.raw
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operations_page_shows_a_failover() {
    if Browser::binaries().expect("browser binaries").is_none() {
        eprintln!(
            "SKIPPED the_operations_page_shows_a_failover: /usr/bin/chromium or \
             /usr/bin/chromedriver is missing (apt-get install chromium chromium-driver, or run \
             ops/test.sh, which installs them); under CI=true this test fails instead"
        );
        return;
    }
    let started = Instant::now();
    let _serial = serial().await;
    let mut cluster = Cluster::start("ui", 3, PARTITIONS).await;
    let router = cluster.router(|_| {}).await;
    let shots = std::env::temp_dir().join(format!(
        "router-ui-test-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&shots).expect("screenshot dir");
    let browser = Browser::start(1400, 900).await.expect("start chromium");
    let ready = started.elapsed();
    browser
        .goto(&format!("{}/ui", router.url))
        .await
        .expect("load /ui");

    // Every partition shown with an owner, as the database has it.
    let before = wait_for(
        &browser,
        Duration::from_secs(20),
        "every partition owned",
        |p| {
            p.updates >= 1
                && p.grid.len() == PARTITIONS as usize
                && p.grid.values().all(|(owner, _)| !owner.is_empty())
        },
    )
    .await;
    // Compare with the database as of a refresh that started after this read.
    let map = cluster.map().await;
    let seen = before.updates;
    let before = wait_for(&browser, Duration::from_secs(10), "a refresh", |p| {
        p.updates >= seen + 2
    })
    .await;
    for entry in &map.partitions {
        let shown = &before.grid[&entry.partition];
        assert_eq!(
            (Some(shown.0.clone()), shown.1),
            (entry.owner_id.clone(), entry.epoch),
            "partition {}: the page vs the database",
            entry.partition
        );
    }
    let replicas: Vec<&str> = before.replicas.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(replicas, ["alloc-0", "alloc-1", "alloc-2"]);
    for (id, alive, url) in &before.replicas {
        assert_eq!(alive, "true", "{id}");
        assert_eq!(url, &cluster.allocator(id).url, "{id}");
    }
    assert!(before.raw["settlement"].is_string(), "settlement section");
    assert_eq!(before.raw["traffic"], json!(true), "traffic section");
    let png = browser.screenshot_png().await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    std::fs::write(shots.join("ui-before.png"), &png).expect("write screenshot");

    // Kill the owner of partition 0; the page must move all its partitions elsewhere.
    let victim = before.grid[&0].0.clone();
    let lost: BTreeMap<u32, i64> = before
        .grid
        .iter()
        .filter(|(_, (owner, _))| *owner == victim)
        .map(|(p, (_, epoch))| (*p, *epoch))
        .collect();
    eprintln!("page shows {victim} owning {lost:?}; killing it");
    let killed = Instant::now();
    cluster
        .allocator(&victim)
        .process
        .as_mut()
        .expect("running")
        .sigkill()
        .expect("SIGKILL");
    let after = wait_for(
        &browser,
        Duration::from_secs(30),
        &format!("{victim}'s partitions {lost:?} with new owners and epochs"),
        |page| {
            lost.iter().all(|(p, old_epoch)| {
                page.grid.get(p).is_some_and(|(owner, epoch)| {
                    !owner.is_empty() && *owner != victim && epoch > old_epoch
                })
            })
        },
    )
    .await;
    eprintln!(
        "the page showed the failover {:?} after the kill: {:?}",
        killed.elapsed(),
        after.grid
    );
    // Partitions that were not the victim's are still shown with a live owner.
    for (p, (owner, _)) in &after.grid {
        assert!(
            !owner.is_empty() && *owner != victim,
            "partition {p}: {owner:?}"
        );
    }
    let png = browser.screenshot_png().await.expect("screenshot");
    let path = shots.join("ui-after-failover.png");
    std::fs::write(&path, &png).expect("write screenshot");
    eprintln!(
        "screenshots: {} and {} (browser ready {ready:?}, test {:?})",
        shots.join("ui-before.png").display(),
        path.display(),
        started.elapsed()
    );

    the_docs_page_shows_every_route(&browser, &router.url, &shots).await;

    browser.quit().await;
    router.stop().await;
}

/// The API page renders the router's document: one operation per route of the table, with
/// its schemas; a screenshot of it goes to `shots`.
async fn the_docs_page_shows_every_route(browser: &Browser, router_url: &str, shots: &Path) {
    browser
        .goto(&format!("{router_url}/docs"))
        .await
        .expect("load /docs");
    let deadline = Instant::now() + Duration::from_secs(10);
    let rendered = loop {
        let state = browser
            .execute(
                r#"return {
                    loaded: document.body.dataset.loaded,
                    ops: Array.from(document.querySelectorAll("details.op"))
                        .map((d) => d.dataset.method.toUpperCase() + " " + d.dataset.path),
                    schemas: document.querySelectorAll("[data-schema]").length,
                };"#,
                vec![],
            )
            .await
            .expect("read /docs");
        if state["loaded"] != "false" || Instant::now() > deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(rendered["loaded"], "true", "/docs rendered: {rendered:#}");
    let mut shown: Vec<String> = rendered["ops"]
        .as_array()
        .expect("ops")
        .iter()
        .map(|o| o.as_str().unwrap().to_owned())
        .collect();
    let mut table: Vec<String> = schema::routes::ALL
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    shown.sort();
    table.sort();
    assert_eq!(shown, table, "/docs shows every route the router serves");
    assert!(rendered["schemas"].as_u64() > Some(10), "{rendered:#}");
    std::fs::write(
        shots.join("docs.png"),
        browser.screenshot_png().await.expect("screenshot"),
    )
    .expect("write screenshot");
}

/// With authentication on, the overview needs a token with the `reserve` scope (it names every
/// owner's and replica's URL and the settlement totals), while `/ui`, `/docs` and `/openapi.json`
/// stay open. The page asks for a token, keeps it in the tab's session storage only, and draws
/// the cluster with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_on_the_operations_page_asks_for_a_token() {
    use std::io::Write;
    const READER: &str = "ops-reader-token-51c2e8a0";
    const ADMIN_ONLY: &str = "admin-only-token-0b7d3f94";
    if Browser::binaries().expect("browser binaries").is_none() {
        eprintln!(
            "SKIPPED with_authentication_on_the_operations_page_asks_for_a_token: chromium or \
             chromedriver is missing; under CI=true this test fails instead"
        );
        return;
    }
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let auth = dir.path().join("router-auth");
    let mut file = std::fs::File::create(&auth).unwrap();
    for (name, scopes, token) in [("ops", "reserve", READER), ("adm", "admin", ADMIN_ONLY)] {
        let hash = access::table::hash_hex(token.as_bytes());
        writeln!(file, "{name} {scopes} {hash}").unwrap();
    }
    drop(file);
    let cluster = Cluster::start("ui-auth", 2, PARTITIONS).await;
    let router = cluster
        .router(|c| c.access.auth_file = Some(auth.clone()))
        .await;
    let client = crate::common::http();
    let get = |path: &str, token: Option<&str>| {
        let mut request = client.get(format!("{}{path}", router.url));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        async move { request.send().await.expect("request").status().as_u16() }
    };
    assert_eq!(get("/v1/cluster/overview", None).await, 401);
    assert_eq!(get("/v1/cluster/overview", Some(ADMIN_ONLY)).await, 403);
    assert_eq!(get("/v1/cluster/overview", Some(READER)).await, 200);
    for open in ["/ui", "/docs", "/openapi.json", "/healthz"] {
        assert_eq!(get(open, None).await, 200, "{open} stays open");
    }

    let browser = Browser::start(1400, 900).await.expect("start chromium");
    let page = format!("{}/ui", router.url);
    browser.goto(&page).await.expect("load /ui");
    let form = r#"
        const form = document.getElementById("auth");
        return {
            state: document.getElementById("status").dataset.state,
            asking: !!form && !form.hidden,
            reason: form ? form.dataset.reason : null,
            updates: Number(document.body.dataset.updates || 0),
            owners: Array.from(document.querySelectorAll("tr[data-partition]"))
                .filter((r) => r.dataset.owner).length,
            session: sessionStorage.getItem("cluster-ui-token"),
            local: localStorage.length,
        };
    "#;
    let wait = |what: &'static str, done: fn(&Value) -> bool| {
        let browser = &browser;
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let state = browser.execute(form, vec![]).await.expect("read DOM");
                if done(&state) {
                    return state;
                }
                assert!(
                    Instant::now() < deadline,
                    "page never showed {what}: {state:#}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let submit = r#"
        document.getElementById("token").value = arguments[0];
        document.getElementById("auth").requestSubmit();
    "#;
    let asked = wait("the token form", |s| {
        s["asking"] == true && s["state"] == "auth"
    })
    .await;
    assert_eq!(
        asked["updates"], 0,
        "nothing drawn without a token: {asked:#}"
    );
    assert_eq!(asked["owners"], 0, "{asked:#}");

    browser
        .execute(submit, vec![json!("not-a-token")])
        .await
        .expect("submit");
    let refused = wait("the refusal", |s| {
        s["asking"] == true && s["reason"] == "refused"
    })
    .await;
    assert_eq!(
        refused["session"],
        Value::Null,
        "a refused token is forgotten: {refused:#}"
    );

    browser
        .execute(submit, vec![json!(READER)])
        .await
        .expect("submit");
    let drawn = wait("the cluster", |s| {
        s["state"] == "ok" && s["owners"] == PARTITIONS && s["asking"] == false
    })
    .await;
    assert_eq!(drawn["session"], READER, "{drawn:#}");
    assert_eq!(
        drawn["local"], 0,
        "nothing is kept beyond the tab: {drawn:#}"
    );

    // The tab keeps the token across a reload; nothing has to be entered again.
    browser.goto(&page).await.expect("reload /ui");
    wait("the cluster after a reload", |s| {
        s["state"] == "ok" && s["owners"] == PARTITIONS && s["asking"] == false
    })
    .await;
    browser.quit().await;
    router.stop().await;
}
