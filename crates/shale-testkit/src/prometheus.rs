//! A real Prometheus (the Debian package's `prometheus`, 2.42) on a free loopback port, with
//! its remote-write receiver on and an empty scrape config, in a temporary directory; stopped
//! by its PID when dropped. The reference for differential PromQL tests.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus.
pub struct Prometheus {
    child: Child,
    /// `http://127.0.0.1:{port}`.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one, or `None` (a skipped test) when the binary is missing outside CI; under
    /// CI a missing or failing Prometheus panics.
    pub fn start() -> Option<Prometheus> {
        let binary = std::env::var("SHALE_TEST_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let available = Command::new(&binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !available {
            assert!(
                !crate::under_ci(),
                "`{binary}` is not installed (apt-get install prometheus); CI needs it"
            );
            eprintln!("skipped: `{binary}` is not installed");
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(&config, "global:\n  evaluation_interval: 1m\n").expect("config");
        let port = crate::free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--web.enable-remote-write-receiver")
            .arg("--storage.tsdb.retention.time=100y")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready =
                std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() && ureq_ready(port);
            if ready {
                return Some(prometheus);
            }
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready: {}",
                std::fs::read_to_string(prometheus._dir.path().join("prometheus.log"))
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Whether `GET /-/ready` answers 200 (a bare HTTP/1.0 request: no client dependency).
fn ureq_ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /-/ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
