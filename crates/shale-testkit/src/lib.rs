//! Test-only helpers that start the real servers integration tests need, on loopback:
//! a private PostgreSQL cluster (`initdb` + `pg_ctl`), an S3-compatible server (moto) and a
//! fault-injecting proxy in front of it ([`fault_proxy`]); headless Chromium through
//! chromedriver ([`browser`]); a certificate authority for TLS tests ([`pki`]); and a test
//! re-run under `strace` to
//! check fsync order on the system calls themselves.
//! When `CI` is set, a server that cannot be started is a test failure, never a skip.

pub mod browser;
pub mod fault_proxy;
pub mod pki;
pub mod postgres;
pub mod prometheus;
pub mod s3;
pub mod strace;
pub mod tmpfs;

use std::net::TcpListener;

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port on loopback");
    listener.local_addr().expect("local addr").port()
}

/// Whether we run under CI (where missing servers must fail tests).
pub fn under_ci() -> bool {
    std::env::var("CI")
        .map(|v| !v.is_empty() && v != "false")
        .unwrap_or(false)
}
