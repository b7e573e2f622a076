//! One process per data directory: an exclusive lock on `{data_dir}/shale.lock`, taken before
//! anything else is opened there (WAL, split cache, SQLite metastore) and held for the life of
//! the process. A second `shale run` on the same directory fails at once, naming the holder,
//! and leaves the first one untouched. The lock is the operating system's (`flock`): it goes
//! with the process, so a killed node leaves nothing to clean up.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::NodeError;

/// The file whose lock the running node holds.
pub const LOCK_FILE_NAME: &str = "shale.lock";

/// The data directory's lock, held while this value lives.
#[derive(Debug)]
pub struct DataDirLock {
    path: PathBuf,
    _file: File,
}

impl DataDirLock {
    /// Creates `data_dir` if needed and locks it, or fails with an error that says which
    /// process holds it.
    pub fn acquire(data_dir: &Path) -> Result<DataDirLock, NodeError> {
        let io = |path: &Path, source: std::io::Error| NodeError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(data_dir).map_err(|err| io(data_dir, err))?;
        let path = data_dir.join(LOCK_FILE_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|err| io(&path, err))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(NodeError::DataDirInUse {
                    data_dir: data_dir.display().to_string(),
                    holder: if holder.is_empty() {
                        "another process".to_string()
                    } else {
                        holder.to_string()
                    },
                });
            }
            Err(TryLockError::Error(err)) => return Err(io(&path, err)),
        }
        // Say who holds it, for the error of the next one.
        let holder = format!(
            "process {} (shale {})\n",
            std::process::id(),
            env!("CARGO_PKG_VERSION")
        );
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(holder.as_bytes()))
            .map_err(|err| io(&path, err))?;
        Ok(DataDirLock { path, _file: file })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_dir_is_locked_once() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("data");
        let lock = DataDirLock::acquire(&dir).expect("first lock");
        let err = DataDirLock::acquire(&dir).expect_err("second lock refused");
        let message = err.to_string();
        assert!(message.contains("in use"), "{message}");
        assert!(
            message.contains(&format!("process {}", std::process::id())),
            "{message}"
        );
        drop(lock);
        DataDirLock::acquire(&dir).expect("free again once released");
    }
}
