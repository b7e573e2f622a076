//! A small tmpfs mounted for a test (a file system that fills up), unmounted when dropped.
//! Mounting needs root: elsewhere the caller's test is skipped with a warning, and under CI
//! it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a directory.
pub struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`mount -o size=…`, e.g. `64m`) at `path` (created).
    pub fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(path).ok()?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status();
        match status {
            Ok(status) if status.success() => Some(Tmpfs {
                path: path.to_path_buf(),
            }),
            _ => {
                assert!(
                    !crate::under_ci(),
                    "cannot mount a tmpfs at {} (the full-disk tests need root)",
                    path.display()
                );
                eprintln!("warning: cannot mount a tmpfs; skipping a full-disk test");
                None
            }
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes still free.
    pub fn available(&self) -> u64 {
        let output = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(&self.path)
            .output()
            .expect("df");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .nth(1)
            .and_then(|line| line.trim().parse().ok())
            .expect("df output")
    }

    /// Fills the file system with `name` until fewer than `leave` bytes are free (the file
    /// is written in chunks until the file system refuses, when `leave` is 0).
    pub fn fill(&self, name: &str, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.path.join(name);
        let mut file = std::fs::File::create(&path).expect("create ballast");
        let chunk = vec![0u8; 64 << 10];
        loop {
            let available = self.available();
            if available <= leave {
                break;
            }
            let n = (available - leave).min(chunk.len() as u64) as usize;
            if file
                .write_all(&chunk[..n])
                .and_then(|()| file.flush())
                .is_err()
            {
                break;
            }
        }
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
