//! An S3-compatible server for tests: moto (`python3 -m moto.server`) on a free loopback port,
//! or the one named by `SHALE_TEST_S3_ENDPOINT` (CI starts one for the whole run). Each call
//! to [`test_bucket`] creates a fresh bucket, so tests never see each other's objects.
//!
//! The server is started once per test process from a thread that lives as long as the
//! process; it is started with `PR_SET_PDEATHSIG` so it dies with the process, and nothing
//! else is ever killed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Credentials moto accepts (it does not check them).
pub const ACCESS_KEY: &str = "testing";
/// Secret paired with [`ACCESS_KEY`].
pub const SECRET_KEY: &str = "testing";

static ENDPOINT: OnceLock<Result<String, String>> = OnceLock::new();

/// The endpoint (`http://127.0.0.1:PORT`) of a running S3-compatible server, or why none runs.
/// Under CI a failure panics: S3 tests must fail, not skip, there.
pub fn endpoint() -> Option<String> {
    let result = ENDPOINT.get_or_init(|| {
        if let Ok(endpoint) = std::env::var("SHALE_TEST_S3_ENDPOINT") {
            if !endpoint.is_empty() {
                return Ok(endpoint.trim_end_matches('/').to_string());
            }
        }
        start_moto()
    });
    match result {
        Ok(endpoint) => Some(endpoint.clone()),
        Err(why) if crate::under_ci() => panic!("S3 test server unavailable under CI: {why}"),
        Err(why) => {
            eprintln!("skipping S3 test: {why}");
            None
        }
    }
}

fn start_moto() -> Result<String, String> {
    let port = crate::free_port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("moto-server".into())
        .spawn(move || {
            let mut command = Command::new("python3");
            command
                .args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            set_parent_death_signal(&mut command);
            match command.spawn() {
                Ok(child) => {
                    let _ = tx.send(Ok(child.id()));
                    // Keep this thread (the child's parent thread) alive for the process's life.
                    loop {
                        std::thread::park();
                    }
                }
                Err(err) => {
                    let _ = tx.send(Err(format!("cannot run `python3 -m moto.server`: {err}")));
                }
            }
        })
        .map_err(|err| err.to_string())?;
    rx.recv().map_err(|err| err.to_string())??;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(format!("http://127.0.0.1:{port}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err("moto did not listen within 30 s (is `moto[server]` installed?)".to_string())
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_command: &mut Command) {}

/// Creates a fresh bucket and returns `(endpoint, bucket)`; `None` outside CI when no server
/// can be had.
pub fn test_bucket() -> Option<(String, String)> {
    let endpoint = endpoint()?;
    let bucket = format!(
        "shale-test-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    );
    if let Err(err) = create_bucket(&endpoint, &bucket) {
        panic!("cannot create bucket {bucket} on {endpoint}: {err}");
    }
    Some((endpoint, bucket))
}

/// Creates bucket `bucket` on the S3-compatible server at `endpoint` (`http://host:port`).
pub fn create_bucket(endpoint: &str, bucket: &str) -> Result<(), String> {
    let host = endpoint
        .strip_prefix("http://")
        .ok_or("endpoint must be http://")?;
    let mut stream = TcpStream::connect(host).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "PUT /{bucket} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    if response.starts_with("HTTP/1.1 200") || response.starts_with("HTTP/1.0 200") {
        Ok(())
    } else {
        Err(response.lines().next().unwrap_or("no response").to_string())
    }
}
