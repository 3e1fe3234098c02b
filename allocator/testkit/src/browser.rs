//! A real headless Chromium, driven through chromedriver's W3C WebDriver HTTP API, for tests of
//! the pages the services serve.
//!
//! The pages are plain HTML and script, so the only faithful test is a browser running them:
//! parsing the HTML in Rust would not run the script that fetches and draws the data. WebDriver
//! is a small JSON-over-HTTP protocol, so it is spoken here with `reqwest` rather than through a
//! client library or Node tooling: start a session, navigate, run a script that reads the DOM,
//! take a screenshot, end the session.
//!
//! The binaries come from Debian's `chromium` and `chromium-driver` packages (`ops/test.sh`
//! installs them): `/usr/bin/chromium` and `/usr/bin/chromedriver`, or `CHROMIUM_BIN` and
//! `CHROMEDRIVER_BIN`. [`Browser::binaries`] says whether they are there, so a test can skip on
//! a developer machine without them; under `CI=true` their absence is an error instead.
//!
//! Chromium runs with a fresh profile directory, without sandbox (tests run as root in
//! containers, where the sandbox cannot start), GPU, QUIC, first-run UI or any background
//! networking (updates, sync, component downloads), because the machines that run the tests have
//! no internet access and a browser that tried to reach it would stall or log noise.
//! chromedriver is started in its own process group and the whole group (chromedriver and the
//! browser it launched) is killed when the [`Browser`] is dropped, also when a test panics.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use crate::process::free_port;

/// A Chromium session behind a private chromedriver.
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    /// The browser's fresh profile; removed when the browser is dropped.
    profile: tempfile::TempDir,
}

fn is_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true") | Ok("1"))
}

impl Browser {
    /// `(chromium, chromedriver)` when both are installed; `Ok(None)` when either is missing and
    /// this is not CI; an error when one is missing under `CI=true`.
    pub fn binaries() -> Result<Option<(PathBuf, PathBuf)>> {
        let pick = |var: &str, default: &str| {
            std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from)
        };
        let chromium = pick("CHROMIUM_BIN", "/usr/bin/chromium");
        let driver = pick("CHROMEDRIVER_BIN", "/usr/bin/chromedriver");
        if chromium.is_file() && driver.is_file() {
            return Ok(Some((chromium, driver)));
        }
        if is_ci() {
            bail!(
                "CI=true but {} or {} is missing (install the Debian packages chromium and \
                 chromium-driver; ops/test.sh does)",
                chromium.display(),
                driver.display()
            );
        }
        Ok(None)
    }

    /// Start chromedriver and a headless Chromium session with a `width` x `height` window.
    pub async fn start(width: u32, height: u32) -> Result<Browser> {
        let (chromium, driver_bin) = Self::binaries()?
            .ok_or_else(|| anyhow!("chromium or chromedriver is not installed"))?;
        let profile = tempfile::Builder::new()
            .prefix("chromium-profile-")
            .tempdir()
            .context("creating a profile directory")?;
        let port = free_port();
        let mut command = Command::new(&driver_bin);
        command
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // Its own process group, so that Drop can end chromedriver and the browser together.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let driver = command
            .spawn()
            .with_context(|| format!("spawning {}", driver_bin.display()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()?;
        let mut browser = Browser {
            driver,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http,
            profile,
        };
        browser.wait_ready(Duration::from_secs(20)).await?;
        let args = vec![
            "--headless".to_owned(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--window-size={width},{height}"),
            format!("--user-data-dir={}", browser.profile.path().display()),
        ];
        let created = browser
            .call(
                reqwest::Method::POST,
                "/session",
                Some(json!({ "capabilities": { "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": { "binary": chromium, "args": args },
                } } })),
            )
            .await
            .context("creating a WebDriver session")?;
        browser.session = created["sessionId"]
            .as_str()
            .ok_or_else(|| anyhow!("no sessionId in {created}"))?
            .to_owned();
        Ok(browser)
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.driver.try_wait()? {
                bail!("chromedriver exited with {status}");
            }
            let ready = self
                .http
                .get(format!("{}/status", self.base))
                .send()
                .await
                .ok();
            if let Some(response) = ready {
                let body: Value = response.json().await.unwrap_or(Value::Null);
                if body["value"]["ready"] == json!(true) {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!("chromedriver did not become ready within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One WebDriver command; returns its `value`, or the WebDriver error as an error.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .with_context(|| format!("WebDriver {path}"))?;
        let status = response.status();
        let body: Value = response.json().await.context("WebDriver answer")?;
        if !status.is_success() {
            bail!("WebDriver {path} answered {status}: {}", body["value"]);
        }
        Ok(body["value"].clone())
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Load `url` (waits for the document's load event).
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.call(
            reqwest::Method::POST,
            &self.session_path("/url"),
            Some(json!({ "url": url })),
        )
        .await
        .map(drop)
    }

    /// Run `script` (a function body; `arguments` holds `args`) in the page; its return value.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value> {
        self.call(
            reqwest::Method::POST,
            &self.session_path("/execute/sync"),
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// The viewport as PNG bytes.
    pub async fn screenshot_png(&self) -> Result<Vec<u8>> {
        let encoded = self
            .call(
                reqwest::Method::GET,
                &self.session_path("/screenshot"),
                None,
            )
            .await?;
        let encoded = encoded
            .as_str()
            .ok_or_else(|| anyhow!("screenshot is not a string"))?;
        base64_decode(encoded)
    }

    /// End the session (closing the browser) and chromedriver.
    pub async fn quit(mut self) {
        let path = self.session_path("");
        let _ = self.call(reqwest::Method::DELETE, &path, None).await;
        self.kill_group();
    }

    fn kill_group(&mut self) {
        if let Ok(None) = self.driver.try_wait() {
            // The group id is chromedriver's pid (process_group(0)); the browser it started is
            // in the same group. Only signalled while chromedriver is unreaped, so the id is ours.
            let group = nix::unistd::Pid::from_raw(self.driver.id() as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            let _ = self.driver.wait();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.kill_group();
    }
}

/// What in a served page (HTML with inline script and styles) would make the browser load
/// something from another origin: any `http://`, `https://` or `ftp://` URL, any
/// protocol-relative `//host` reference in an attribute or a CSS `url()`, any `<script src>`,
/// `<link href>`, `<img src>`, `<iframe src>`, `@import` or `import` that is not a same-origin
/// path (`/...`). Empty for a self-contained page.
pub fn external_references(page: &str) -> Vec<String> {
    let lower = page.to_ascii_lowercase();
    let mut found = Vec::new();
    let context = |at: usize| {
        let start = page[..at]
            .char_indices()
            .rev()
            .nth(30)
            .map_or(0, |(i, _)| i);
        let end = page[at..]
            .char_indices()
            .nth(60)
            .map_or(page.len(), |(i, _)| at + i);
        page[start..end].replace('\n', " ")
    };
    for scheme in ["http://", "https://", "ftp://", "ws://", "wss://"] {
        for (at, _) in lower.match_indices(scheme) {
            found.push(format!("{scheme} URL: …{}…", context(at)));
        }
    }
    for attribute in ["src=", "href=", "action=", "url("] {
        for (at, _) in lower.match_indices(attribute) {
            let value = lower[at + attribute.len()..].trim_start_matches(['"', '\'', ' ']);
            let same_origin = (value.starts_with('/') && !value.starts_with("//"))
                || value.starts_with('#')
                || value.starts_with("data:");
            if !same_origin {
                found.push(format!(
                    "{attribute} not a same-origin path: …{}…",
                    context(at)
                ));
            }
        }
    }
    for keyword in ["@import", "import(", "importscripts("] {
        for (at, _) in lower.match_indices(keyword) {
            found.push(format!("{keyword}: …{}…", context(at)));
        }
    }
    found
}

/// Standard base64 (RFC 4648, with padding), as WebDriver encodes screenshots.
fn base64_decode(text: &str) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for byte in text.bytes() {
        let value = match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' => continue,
            other => bail!("not base64: byte {other}"),
        };
        buffer = (buffer << 6) | u32::from(value);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn external_references_are_found() {
        let clean = r##"<a href="/docs">d</a><a href="#x">x</a><script>fetch("/v1/x")</script>"##;
        assert!(super::external_references(clean).is_empty());
        for dirty in [
            r#"<script src="https://cdn.example/x.js"></script>"#,
            r#"<script src="//cdn.example/x.js"></script>"#,
            r#"<link href="cdn.example/x.css">"#,
            r#"<style>@import "x.css";</style>"#,
            r#"<script>fetch("http://example.com")</script>"#,
        ] {
            assert!(!super::external_references(dirty).is_empty(), "{dirty}");
        }
    }

    #[test]
    fn base64_round_trips_known_values() {
        assert_eq!(super::base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(super::base64_decode("iVBORw0KGgo=").unwrap()[1..4], *b"PNG");
    }
}
