//! Durability checks on the system calls themselves: a test re-runs itself (the same test
//! binary, only that test) under `strace`, and inspects the order of `fsync`, `fdatasync` and
//! `rename` calls it made, with the paths of their file descriptors (`strace -y`).
//!
//! The re-run is told apart by the `SHALE_STRACE_CHILD` environment variable: a test calls
//! [`is_child`] first and, in the child, does the work to observe and returns.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "SHALE_STRACE_CHILD";

/// Whether this process is the traced re-run of a test; its value is the scratch directory
/// the parent chose.
pub fn is_child() -> Option<PathBuf> {
    std::env::var_os(CHILD_ENV).map(PathBuf::from)
}

/// One traced system call: its name and its line (with the paths of fds, thanks to `-y`).
#[derive(Debug, Clone)]
pub struct Syscall {
    /// `fsync`, `fdatasync`, `rename`, `renameat`, `renameat2`, …
    pub name: String,
    /// The whole line, as strace printed it.
    pub line: String,
}

/// The traced calls of a child run, in the order they started.
#[derive(Debug)]
pub struct Trace {
    /// The calls.
    pub calls: Vec<Syscall>,
}

impl Trace {
    /// Index of the first call named one of `names` whose line contains `needle`, at or after
    /// `from`.
    pub fn find(&self, from: usize, names: &[&str], needle: &str) -> Option<usize> {
        self.calls
            .iter()
            .enumerate()
            .skip(from)
            .find(|(_, call)| names.contains(&call.name.as_str()) && call.line.contains(needle))
            .map(|(i, _)| i)
    }

    /// Whether a sync (`fsync` or `fdatasync`) of a file descriptor whose path is exactly
    /// `path` starts in `range` of the calls.
    pub fn synced_between(&self, path: &Path, range: std::ops::Range<usize>) -> bool {
        let needle = format!("<{}>", path.display());
        self.calls[range.start.min(self.calls.len())..range.end.min(self.calls.len())]
            .iter()
            .any(|call| {
                matches!(call.name.as_str(), "fsync" | "fdatasync") && call.line.contains(&needle)
            })
    }
}

/// Re-runs the test `test_name` of the current test binary under `strace`, with
/// `SHALE_STRACE_CHILD` set to `scratch`; returns the traced sync and rename calls. `None`
/// (after a warning) when strace cannot run here, except under CI where that panics.
pub fn trace_test(test_name: &str, scratch: &Path) -> Option<Trace> {
    let available = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !available {
        if crate::under_ci() {
            panic!("strace is needed by the durability tests under CI");
        }
        eprintln!("skipping durability test: strace is not installed");
        return None;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = scratch.join("strace.out");
    let status = Command::new("strace")
        .args(["-f", "--seccomp-bpf", "-y", "-qq", "-e"])
        .arg("trace=fsync,fdatasync,rename,renameat,renameat2")
        .arg("-o")
        .arg(&out)
        .arg(&exe)
        .args(["--exact", test_name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, scratch)
        .stdin(Stdio::null())
        .status()
        .expect("run the test under strace");
    assert!(status.success(), "traced run of {test_name} failed");
    let text = std::fs::read_to_string(&out).expect("read the strace output");
    let calls = text
        .lines()
        .filter_map(|line| {
            // `[pid N] name(args…` or `N name(args…` or `name(args…`; skip `<... resumed>`.
            let body = line.trim_start_matches(|c: char| c.is_ascii_digit() || c == ' ');
            let body = body
                .strip_prefix("[pid")
                .and_then(|rest| rest.split_once(']'))
                .map(|(_, rest)| rest.trim_start())
                .unwrap_or(body);
            let (name, _) = body.split_once('(')?;
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return None;
            }
            Some(Syscall {
                name: name.to_string(),
                line: line.to_string(),
            })
        })
        .collect();
    Some(Trace { calls })
}
