//! Headless Chromium driven through chromedriver (Debian's `chromium` and `chromium-driver`)
//! over the W3C WebDriver protocol, for the web UI's browser test: chromedriver on a free
//! loopback port in a process group of its own, stopped with every browser it started (the
//! group) when dropped.
//!
//! The client is the dozen WebDriver calls the test makes, as JSON over `reqwest`: the
//! WebDriver crates (fantoccini, thirtyfour) bring a TLS stack (aws-lc, built from C) that a
//! loopback driver never uses, and minutes to every clean build.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The key W3C WebDriver names an element reference by.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A running chromedriver with one browser session.
pub struct Browser {
    child: Child,
    client: reqwest::Client,
    session: String,
    base: String,
    _dir: tempfile::TempDir,
}

/// A WebDriver call failed (the driver's own words).
#[derive(Debug)]
pub struct WebDriverError(pub String);

impl std::fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One entry of the browser's console log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// `SEVERE`, `WARNING`, `INFO`, …
    pub level: String,
    /// The message, with its source.
    pub message: String,
}

fn find_binary(candidates: &[&str]) -> Option<String> {
    candidates.iter().find_map(|name| {
        Command::new(name)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()
            .filter(|s| s.success())
            .map(|_| name.to_string())
    })
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session with a `width`×`height` window,
    /// or `None` (a skipped test) when they are not installed outside CI; under CI a missing
    /// or failing browser panics.
    pub async fn start(width: u32, height: u32) -> Option<Browser> {
        let driver = find_binary(&["chromedriver"]);
        let chromium = find_binary(&["chromium", "chromium-browser", "google-chrome"]);
        let (Some(driver), Some(chromium)) = (driver, chromium) else {
            assert!(
                !crate::under_ci(),
                "chromium and chromedriver are not installed (apt-get install chromium \
                 chromium-driver); CI needs them"
            );
            eprintln!("skipped: chromium or chromedriver is not installed");
            return None;
        };
        let chromium_path = which(&chromium).unwrap_or(chromium);
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::free_port();
        let log = std::fs::File::create(dir.path().join("chromedriver.log")).expect("log");
        // Its own process group, which the browsers it starts join: dropping the driver
        // stops them all, whatever state the session is in.
        let child = {
            use std::os::unix::process::CommandExt;
            Command::new(&driver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .process_group(0)
                .spawn()
                .expect("start chromedriver")
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()
            .expect("http client");
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = client
                .get(format!("{base}/status"))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success());
            if ready.is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not start: {}",
                std::fs::read_to_string(dir.path().join("chromedriver.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let profile = dir.path().join("profile");
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium_path,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--hide-scrollbars", "--force-device-scale-factor=1",
                    format!("--window-size={width},{height}"),
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let answer = client
            .post(format!("{base}/session"))
            .json(&capabilities)
            .send()
            .await
            .expect("new session")
            .json::<Value>()
            .await
            .expect("new session answer");
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("chromium did not start a session: {answer}"))
            .to_string();
        Some(Browser {
            child,
            client,
            session,
            base,
            _dir: dir,
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WebDriverError> {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut request = self.client.request(method, url);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .map_err(|err| WebDriverError(err.to_string()))?;
        let status = response.status();
        let answer: Value = response
            .json()
            .await
            .map_err(|err| WebDriverError(err.to_string()))?;
        if !status.is_success() {
            return Err(WebDriverError(format!(
                "{path}: {} ({})",
                answer["value"]["message"], answer["value"]["error"]
            )));
        }
        Ok(answer["value"].clone())
    }

    /// Navigates to `url` and waits for the page's load event.
    pub async fn goto(&self, url: &str) -> Result<(), WebDriverError> {
        self.call(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await
            .map(drop)
    }

    /// The page's current URL.
    pub async fn current_url(&self) -> Result<String, WebDriverError> {
        let value = self.call(reqwest::Method::GET, "/url", None).await?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }

    /// Runs `script` (a function body; `arguments` holds `args`) and answers what it returns.
    pub async fn execute(&self, script: &str, args: Vec<Value>) -> Result<Value, WebDriverError> {
        self.call(
            reqwest::Method::POST,
            "/execute/sync",
            Some(json!({ "script": script, "args": args })),
        )
        .await
    }

    /// Polls `script` until it returns something other than `null`/`false`, and answers it;
    /// fails after `timeout` with the last value.
    pub async fn wait_for(&self, script: &str, timeout: Duration) -> Result<Value, WebDriverError> {
        let deadline = Instant::now() + timeout;
        loop {
            let value = self.execute(script, vec![]).await?;
            if !value.is_null() && value != Value::Bool(false) {
                return Ok(value);
            }
            if Instant::now() > deadline {
                return Err(WebDriverError(format!(
                    "timed out after {timeout:?} waiting for: {script}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The first element matching the CSS `selector`.
    pub async fn find(&self, selector: &str) -> Result<Element<'_>, WebDriverError> {
        let value = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({ "using": "css selector", "value": selector })),
            )
            .await?;
        let id = value[ELEMENT_KEY]
            .as_str()
            .ok_or_else(|| WebDriverError(format!("no element id for {selector}: {value}")))?;
        Ok(Element {
            browser: self,
            id: id.to_string(),
        })
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Result<Vec<u8>, WebDriverError> {
        use base64::Engine;
        let value = self.call(reqwest::Method::GET, "/screenshot", None).await?;
        base64::engine::general_purpose::STANDARD
            .decode(value.as_str().unwrap_or_default())
            .map_err(|err| WebDriverError(err.to_string()))
    }

    /// The console entries logged since the last call (chromedriver's browser log).
    pub async fn console(&self) -> Result<Vec<LogEntry>, WebDriverError> {
        let value = self
            .call(
                reqwest::Method::POST,
                "/se/log",
                Some(json!({ "type": "browser" })),
            )
            .await?;
        Ok(value
            .as_array()
            .map(|entries| {
                entries
                    .iter()
                    .map(|entry| LogEntry {
                        level: entry["level"].as_str().unwrap_or_default().to_string(),
                        message: entry["message"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect()
            })
            .unwrap_or_default())
    }
}

/// An element of the page.
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Element<'_> {
    /// Clicks it.
    pub async fn click(&self) -> Result<(), WebDriverError> {
        self.browser
            .call(
                reqwest::Method::POST,
                &format!("/element/{}/click", self.id),
                Some(json!({})),
            )
            .await
            .map(drop)
    }

    /// Empties an input.
    pub async fn clear(&self) -> Result<(), WebDriverError> {
        self.browser
            .call(
                reqwest::Method::POST,
                &format!("/element/{}/clear", self.id),
                Some(json!({})),
            )
            .await
            .map(drop)
    }

    /// Types `text` into it (`\u{E007}` is Enter).
    pub async fn send_keys(&self, text: &str) -> Result<(), WebDriverError> {
        self.browser
            .call(
                reqwest::Method::POST,
                &format!("/element/{}/value", self.id),
                Some(json!({ "text": text })),
            )
            .await
            .map(drop)
    }

    /// Its rendered text.
    pub async fn text(&self) -> Result<String, WebDriverError> {
        let value = self
            .browser
            .call(
                reqwest::Method::GET,
                &format!("/element/{}/text", self.id),
                None,
            )
            .await?;
        Ok(value.as_str().unwrap_or_default().to_string())
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session first, so chromedriver stops its Chromium, then stop the driver.
        // A bare HTTP/1.0 request: `drop` has no async runtime to lean on.
        use std::io::{Read, Write};
        let address = self.base.trim_start_matches("http://");
        if let Ok(mut stream) = std::net::TcpStream::connect(address) {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
            let _ = write!(
                stream,
                "DELETE /session/{} HTTP/1.0\r\nHost: {address}\r\nContent-Length: 0\r\n\r\n",
                self.session
            );
            let mut answer = Vec::new();
            let _ = stream.read_to_end(&mut answer);
        }
        // Then the driver and every browser process of its group.
        if let Ok(pgid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals that process group; no memory is
            // involved.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn which(name: &str) -> Option<String> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
            .map(|path| path.display().to_string())
    })
}
