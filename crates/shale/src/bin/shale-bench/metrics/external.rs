//! The reference systems of `shale-bench metrics`: Prometheus and VictoriaMetrics, started as
//! child processes on a free local port with their data in a temp dir, and killed (by their
//! own PID) when dropped, also when the bench fails.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

/// A reference system running as a child of the bench.
pub struct External {
    /// "Prometheus" or "VictoriaMetrics".
    pub name: &'static str,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its storage directory.
    pub data: PathBuf,
    child: Child,
    log: PathBuf,
    /// Removed after the child is killed (`Drop` runs before the fields are dropped).
    _dir: tempfile::TempDir,
}

impl Drop for External {
    fn drop(&mut self) {
        // Only our own child, by its PID.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The path of `binary` if it is on `PATH`.
pub fn find_on_path(binary: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(binary))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> anyhow::Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("binding a free local port")?;
    Ok(listener.local_addr()?.port())
}

impl External {
    fn spawn(
        name: &'static str,
        binary: &Path,
        args: impl FnOnce(&Path, &Path, u16) -> anyhow::Result<Vec<String>>,
    ) -> anyhow::Result<External> {
        let dir = tempfile::tempdir().context("creating a temp dir")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).with_context(|| format!("creating {}", data.display()))?;
        let port = free_port()?;
        let args = args(dir.path(), &data, port)?;
        let log = dir.path().join("output.log");
        let out =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log file handle")?;
        let child = Command::new(binary)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {} {}", binary.display(), args.join(" ")))?;
        Ok(External {
            name,
            base: format!("http://127.0.0.1:{port}"),
            data,
            child,
            log,
            _dir: dir,
        })
    }

    /// Starts Prometheus with the remote-write receiver and the admin API.
    pub async fn prometheus(binary: &Path, client: &reqwest::Client) -> anyhow::Result<External> {
        let mut external = External::spawn("Prometheus", binary, |dir, data, port| {
            let config = dir.join("prometheus.yml");
            std::fs::write(&config, "global:\n  scrape_interval: 1h\n")
                .with_context(|| format!("writing {}", config.display()))?;
            Ok(vec![
                "--web.enable-remote-write-receiver".into(),
                "--web.enable-admin-api".into(),
                "--storage.tsdb.path".into(),
                data.display().to_string(),
                "--web.listen-address".into(),
                format!("127.0.0.1:{port}"),
                "--config.file".into(),
                config.display().to_string(),
            ])
        })?;
        external.wait_ready(client, "/-/ready").await?;
        Ok(external)
    }

    /// Starts VictoriaMetrics (single node) with its response cache off, so that repeated
    /// queries are evaluated each time as Prometheus and Shale evaluate them.
    pub async fn victoria_metrics(
        binary: &Path,
        client: &reqwest::Client,
    ) -> anyhow::Result<External> {
        let mut external = External::spawn("VictoriaMetrics", binary, |_, data, port| {
            Ok(vec![
                "-httpListenAddr".into(),
                format!("127.0.0.1:{port}"),
                "-storageDataPath".into(),
                data.display().to_string(),
                "-retentionPeriod".into(),
                "100y".into(),
                "-search.disableCache".into(),
            ])
        })?;
        external.wait_ready(client, "/health").await?;
        Ok(external)
    }

    async fn wait_ready(&mut self, client: &reqwest::Client, path: &str) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.base);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .with_context(|| format!("checking {}", self.name))?
            {
                anyhow::bail!(
                    "{} exited ({status}) before it was ready; its output ends with:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            if let Ok(resp) = client
                .get(&url)
                .timeout(Duration::from_secs(2))
                .send()
                .await
            {
                if resp.status().is_success() {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{} not ready at {url} after 120 s; its output ends with:\n{}",
                    self.name,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The last 2 KB of the child's output.
    /// The process's peak resident memory so far (`VmHWM`), in MB.
    pub fn peak_rss_mb(&self) -> Option<f64> {
        crate::ingest::peak_rss_mb_of(&format!("/proc/{}/status", self.child.id()))
    }

    pub fn log_tail(&self) -> String {
        let read = || -> std::io::Result<String> {
            let mut file = std::fs::File::open(&self.log)?;
            let len = file.metadata()?.len();
            file.seek(SeekFrom::Start(len.saturating_sub(2048)))?;
            let mut tail = Vec::new();
            file.read_to_end(&mut tail)?;
            Ok(String::from_utf8_lossy(&tail).into_owned())
        };
        read().unwrap_or_else(|err| format!("(log unreadable: {err})"))
    }

    /// The version the system reports, if it does.
    pub async fn version(&self, client: &reqwest::Client) -> Option<String> {
        if self.name == "Prometheus" {
            let body: Value = client
                .get(format!("{}/api/v1/status/buildinfo", self.base))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            return body["data"]["version"]
                .as_str()
                .filter(|v| !v.is_empty())
                .map(str::to_string);
        }
        let text = client
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        let line = text.lines().find(|l| l.starts_with("vm_app_version{"))?;
        let version = line
            .split("short_version=\"")
            .nth(1)
            .or_else(|| line.split("version=\"").nth(1))?;
        version
            .split('"')
            .next()
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    }

    /// Prometheus: writes the head as a block (`snapshot?skip_head=false`) and returns the
    /// snapshot directory's bytes.
    pub async fn prometheus_snapshot_bytes(&self, client: &reqwest::Client) -> anyhow::Result<u64> {
        let resp = client
            .post(format!(
                "{}/api/v1/admin/tsdb/snapshot?skip_head=false",
                self.base
            ))
            .send()
            .await
            .context("Prometheus snapshot")?;
        let status = resp.status();
        let body: Value = resp.json().await.context("Prometheus snapshot answer")?;
        anyhow::ensure!(status.is_success(), "Prometheus snapshot: {status} {body}");
        let name = body["data"]["name"]
            .as_str()
            .with_context(|| format!("Prometheus snapshot answer without a name: {body}"))?;
        dir_size(&self.data.join("snapshots").join(name))
    }

    /// VictoriaMetrics: `GET /internal/force_flush` (buffered samples to disk, searchable).
    pub async fn force_flush(&self, client: &reqwest::Client) -> anyhow::Result<()> {
        let resp = client
            .get(format!("{}/internal/force_flush", self.base))
            .send()
            .await
            .context("VictoriaMetrics force_flush")?;
        anyhow::ensure!(
            resp.status().is_success(),
            "VictoriaMetrics force_flush: {}",
            resp.status()
        );
        Ok(())
    }

    /// VictoriaMetrics: the data directory's bytes once unchanged for 5 s (background merges
    /// of the flushed parts done), polled every second for at most 120 s. Returns the bytes
    /// and the seconds waited.
    pub async fn settled_size(&self) -> anyhow::Result<(u64, f64)> {
        let started = Instant::now();
        let mut last = dir_size(&self.data)?;
        let mut since = Instant::now();
        while started.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let size = dir_size(&self.data)?;
            if size != last {
                last = size;
                since = Instant::now();
            } else if since.elapsed() >= Duration::from_secs(5) {
                break;
            }
        }
        Ok((last, started.elapsed().as_secs_f64()))
    }
}

/// The bytes of the regular files under `path` (symbolic links not followed; files removed
/// while walking, as merges do, are skipped).
pub fn dir_size(path: &Path) -> anyhow::Result<u64> {
    let mut total = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound && dir != path => continue,
            Err(err) => return Err(err).with_context(|| format!("listing {}", dir.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => continue,
                Err(err) => {
                    return Err(err).with_context(|| format!("reading {}", entry.path().display()))
                }
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    Ok(total)
}
