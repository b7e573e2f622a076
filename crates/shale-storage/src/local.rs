//! [`LocalStorage`]: objects as files under a directory of the local file system.
//!
//! Writes are atomic and durable: the data goes to a hidden temporary file in the target
//! directory, which is fsynced, renamed over the object's name, and then the directory is
//! fsynced, so that after a power loss an object that was reported written exists whole
//! (directories created on the way are fsynced into their parents too). Whole-file transfers
//! use the kernel's file copy.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;

use crate::storage::{check_name, Storage};
use crate::{io_err, StorageError, StorageResult};

/// Suffix of the temporary files of writes in progress (never listed).
const UPLOADING_SUFFIX: &str = ".uploading";

/// A directory of the local file system holding objects as files.
#[derive(Clone, Debug)]
pub struct LocalStorage {
    root: PathBuf,
    uri: String,
}

impl LocalStorage {
    /// Opens (creating it durably if missing) the directory `dir`.
    pub fn open(dir: &Path) -> StorageResult<LocalStorage> {
        create_dir_all_durable(dir).map_err(|err| io_err(dir, err))?;
        let root = dir.canonicalize().map_err(|err| io_err(dir, err))?;
        Ok(LocalStorage {
            uri: format!("file://{}", root.display()),
            root,
        })
    }

    /// The directory objects live in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, name: &str) -> StorageResult<PathBuf> {
        check_name(name)?;
        Ok(self.root.join(name))
    }
}

/// Runs blocking file system work off the async runtime.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> StorageResult<T> + Send + 'static,
) -> StorageResult<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| StorageError::ObjectStore(format!("storage task failed: {err}")))?
}

/// fsyncs a directory, making the creation, rename or removal of its entries durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Creates `dir` and its missing ancestors, fsyncing each new directory's parent so that
/// the new entries survive a power loss.
pub(crate) fn create_dir_all_durable(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.exists() {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    std::fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Writes `dest` atomically and durably: `fill` writes a temporary file next to it, which is
/// fsynced, renamed to `dest`, and the directory fsynced. Returns what `fill` returned.
fn write_durably(
    dest: &Path,
    fill: impl FnOnce(&Path) -> std::io::Result<u64>,
) -> std::io::Result<u64> {
    let parent = dest
        .parent()
        .ok_or_else(|| std::io::Error::other("object path has no parent directory"))?;
    create_dir_all_durable(parent)?;
    let file_name = dest
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(
        ".{file_name}.{}{UPLOADING_SUFFIX}",
        shale_types::new_ulid()
    ));
    let result = (|| {
        let size = fill(&tmp)?;
        OpenOptions::new().write(true).open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, dest)?;
        sync_dir(parent)?;
        Ok(size)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn not_found_or(name: &str, path: &Path, err: std::io::Error) -> StorageError {
    if err.kind() == std::io::ErrorKind::NotFound {
        StorageError::NotFound(name.to_string())
    } else {
        io_err(path, err)
    }
}

/// Opens the file of object `name` for reading.
pub(crate) fn open_object(path: &Path, name: &str) -> StorageResult<File> {
    File::open(path).map_err(|err| not_found_or(name, path, err))
}

/// Bytes `range` of `file` (object `name` at `path`), read in place.
pub(crate) fn read_range(
    file: &File,
    path: &Path,
    name: &str,
    range: Range<u64>,
) -> StorageResult<bytes::Bytes> {
    use std::os::unix::fs::FileExt;
    let len = usize::try_from(range.end.saturating_sub(range.start)).map_err(|_| {
        StorageError::ObjectStore(format!("range {range:?} of `{name}` is too large"))
    })?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, range.start)
        .map_err(|err| io_err(path, err))?;
    Ok(bytes::Bytes::from(buf))
}

fn list_dir(root: &Path, dir: &Path, names: &mut Vec<String>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            list_dir(root, &path, names)?;
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(UPLOADING_SUFFIX) {
            continue;
        }
        if let Ok(relative) = path.strip_prefix(root) {
            let parts: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            names.push(parts.join("/"));
        }
    }
    Ok(())
}

#[async_trait]
impl Storage for LocalStorage {
    fn uri(&self) -> &str {
        &self.uri
    }

    fn child(&self, name: &str) -> Arc<dyn Storage> {
        let name = name.trim_matches('/');
        Arc::new(LocalStorage {
            root: self.root.join(name),
            uri: format!("{}/{name}", self.uri),
        })
    }

    async fn put_file(&self, name: &str, local: &Path) -> StorageResult<u64> {
        let dest = self.path(name)?;
        let local = local.to_path_buf();
        blocking(move || {
            // A split bundle is immutable: on the same file system it is linked, not copied.
            let link_or_copy = |tmp: &Path| match std::fs::hard_link(&local, tmp) {
                Ok(()) => std::fs::metadata(tmp).map(|m| m.len()),
                Err(_) => std::fs::copy(&local, tmp),
            };
            write_durably(&dest, link_or_copy).map_err(|err| {
                if err.kind() == std::io::ErrorKind::NotFound && !local.exists() {
                    io_err(&local, err)
                } else {
                    io_err(&dest, err)
                }
            })
        })
        .await
    }

    async fn put_bytes(&self, name: &str, bytes: Vec<u8>) -> StorageResult<()> {
        let dest = self.path(name)?;
        blocking(move || {
            write_durably(&dest, |tmp| {
                let mut file = File::create(tmp)?;
                file.write_all(&bytes)?;
                Ok(bytes.len() as u64)
            })
            .map(|_| ())
            .map_err(|err| io_err(&dest, err))
        })
        .await
    }

    async fn get_bytes(&self, name: &str) -> StorageResult<bytes::Bytes> {
        let path = self.path(name)?;
        let name = name.to_string();
        blocking(move || {
            std::fs::read(&path)
                .map(bytes::Bytes::from)
                .map_err(|err| not_found_or(&name, &path, err))
        })
        .await
    }

    async fn get_range(&self, name: &str, range: Range<u64>) -> StorageResult<bytes::Bytes> {
        let path = self.path(name)?;
        let name = name.to_string();
        blocking(move || read_range(&open_object(&path, &name)?, &path, &name, range)).await
    }

    fn is_local(&self) -> bool {
        true
    }

    fn local_path(&self, name: &str) -> Option<PathBuf> {
        self.path(name).ok()
    }

    async fn get_to_file(&self, name: &str, dest: &Path) -> StorageResult<u64> {
        let src = self.path(name)?;
        let name = name.to_string();
        let dest = dest.to_path_buf();
        blocking(move || {
            let tmp = dest.with_extension("partial");
            let result = std::fs::copy(&src, &tmp)
                .map_err(|err| not_found_or(&name, &src, err))
                .and_then(|size| {
                    std::fs::rename(&tmp, &dest)
                        .map(|_| size)
                        .map_err(|err| io_err(&dest, err))
                });
            if result.is_err() {
                let _ = std::fs::remove_file(&tmp);
            }
            result
        })
        .await
    }

    async fn delete(&self, name: &str) -> StorageResult<()> {
        let path = self.path(name)?;
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(io_err(&path, err)),
        })
        .await
    }

    async fn exists(&self, name: &str) -> StorageResult<bool> {
        let path = self.path(name)?;
        blocking(move || match std::fs::metadata(&path) {
            Ok(meta) => Ok(meta.is_file()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(err) => Err(io_err(&path, err)),
        })
        .await
    }

    async fn list(&self) -> StorageResult<Vec<String>> {
        let root = self.root.clone();
        blocking(move || {
            let mut names = Vec::new();
            list_dir(&root, &root, &mut names).map_err(|err| io_err(&root, err))?;
            names.sort();
            Ok(names)
        })
        .await
    }
}
