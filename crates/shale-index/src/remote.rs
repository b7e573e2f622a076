//! Opening a split bundle that stays on object storage: [`RemoteBundle`] is a read-only Tantivy
//! directory built from the bundle's tail (hot cache + footer, one ranged read) that serves
//! reads inside the hot cache from memory and every other read with a ranged read through a
//! [`RangeRead`] (which caches). A search thus fetches the hot cache plus the term
//! dictionaries, postings, columns and doc store blocks its query touches — not the split.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::{fmt, io};

use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    DirectoryLock, FileHandle, Lock, OwnedBytes, WatchCallback, WatchHandle, WritePtr,
};
use tantivy::{Directory, HasLen, Index};

use crate::bundle::{BundleFooter, BUNDLE_TRAILER_LEN};
use crate::error::IndexError;

/// Reads byte ranges of one bundle object. Tantivy reads synchronously: this is called on
/// blocking threads, never from inside an async task.
pub trait RangeRead: Send + Sync + fmt::Debug + 'static {
    /// Bytes `range` of the bundle (exactly that many, or an error).
    fn read(&self, range: Range<u64>) -> io::Result<OwnedBytes>;
}

/// One file of a remote bundle.
struct RemoteFile {
    /// The file's name in the bundle.
    name: String,
    /// Where the file starts in the bundle.
    start: u64,
    len: usize,
    /// Hot cache slices of this file, by start, disjoint.
    hot: Vec<(Range<usize>, OwnedBytes)>,
    reader: Arc<dyn RangeRead>,
}

impl fmt::Debug for RemoteFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteFile({}: {}+{})", self.name, self.start, self.len)
    }
}

impl HasLen for RemoteFile {
    fn len(&self) -> usize {
        self.len
    }
}

impl FileHandle for RemoteFile {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        if range.start > range.end || range.end > self.len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read {range:?} past the end of a {}-byte file", self.len),
            ));
        }
        if range.is_empty() {
            return Ok(OwnedBytes::empty());
        }
        // The last hot slice starting at or before the range.
        let after = self
            .hot
            .partition_point(|(hot, _)| hot.start <= range.start);
        if let Some((hot, bytes)) = after.checked_sub(1).map(|i| &self.hot[i]) {
            if range.end <= hot.end {
                return Ok(bytes.slice(range.start - hot.start..range.end - hot.start));
            }
        }
        tracing::trace!(file = %self.name, ?range, "split read outside the hot cache");
        self.reader
            .read(self.start + range.start as u64..self.start + range.end as u64)
    }
}

/// A read-only Tantivy [`Directory`] over a bundle read by ranges.
#[derive(Clone)]
pub struct RemoteBundle {
    files: Arc<HashMap<PathBuf, Arc<RemoteFile>>>,
    footer: Arc<BundleFooter>,
    name: Arc<str>,
}

impl fmt::Debug for RemoteBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteBundle({})", self.name)
    }
}

fn invalid(name: &str, message: impl Into<String>) -> IndexError {
    IndexError::InvalidBundle {
        path: PathBuf::from(name),
        message: message.into(),
    }
}

impl RemoteBundle {
    /// The bundle `name`, `bundle_len` bytes long, of which `tail` holds bytes
    /// `tail_start..bundle_len` — at least the footer JSON and trailer (see
    /// [`RemoteBundle::tail_needed`]); hot cache slices outside `tail` are read by ranges too.
    pub fn open(
        name: &str,
        tail: OwnedBytes,
        tail_start: u64,
        bundle_len: u64,
        reader: Arc<dyn RangeRead>,
    ) -> Result<RemoteBundle, IndexError> {
        if tail_start + tail.len() as u64 != bundle_len {
            return Err(invalid(name, "the tail given does not end the bundle"));
        }
        let footer = BundleFooter::parse_from_tail(tail.as_slice()).map_err(|err| match err {
            IndexError::InvalidBundle { message, .. } => invalid(name, message),
            other => other,
        })?;
        let mut hot_by_file: HashMap<&str, Vec<(Range<usize>, OwnedBytes)>> = HashMap::new();
        for slice in &footer.hot {
            let len = slice.end.saturating_sub(slice.start);
            if slice.at < tail_start || slice.at + len > bundle_len {
                continue;
            }
            let from = (slice.at - tail_start) as usize;
            hot_by_file.entry(&slice.file).or_default().push((
                slice.start as usize..slice.end as usize,
                tail.slice(from..from + len as usize),
            ));
        }
        let mut files = HashMap::with_capacity(footer.files.len());
        for entry in &footer.files {
            if entry.start > entry.end || entry.end > bundle_len {
                return Err(invalid(
                    name,
                    format!("file `{}` is out of the bundle's bounds", entry.name),
                ));
            }
            let mut hot = hot_by_file.remove(entry.name.as_str()).unwrap_or_default();
            hot.sort_by_key(|(range, _)| range.start);
            files.insert(
                PathBuf::from(&entry.name),
                Arc::new(RemoteFile {
                    name: entry.name.clone(),
                    start: entry.start,
                    len: (entry.end - entry.start) as usize,
                    hot,
                    reader: reader.clone(),
                }),
            );
        }
        Ok(RemoteBundle {
            files: Arc::new(files),
            footer: Arc::new(footer),
            name: Arc::from(name),
        })
    }

    /// Given the last bytes of a bundle (at least [`BUNDLE_TRAILER_LEN`]), how many bytes from
    /// the end hold the footer JSON and trailer: read at least that many for
    /// [`RemoteBundle::open`].
    pub fn tail_needed(last_bytes: &[u8]) -> Result<u64, IndexError> {
        Ok(BundleFooter::footer_len_from_trailer(last_bytes)? + BUNDLE_TRAILER_LEN as u64)
    }

    /// The bundle's footer.
    pub fn footer(&self) -> &BundleFooter {
        &self.footer
    }

    /// Bytes held in memory by the hot cache.
    pub fn hot_bytes(&self) -> u64 {
        self.footer.hot.iter().map(|s| s.end - s.start).sum()
    }

    fn read_only(path: &Path) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("split bundles are read-only (writing `{}`)", path.display()),
        )
    }
}

impl Directory for RemoteBundle {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        match self.files.get(path) {
            Some(file) => Ok(file.clone()),
            None => Err(OpenReadError::FileDoesNotExist(path.to_path_buf())),
        }
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        Err(DeleteError::IoError {
            io_error: Arc::new(Self::read_only(path)),
            filepath: path.to_path_buf(),
        })
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        Ok(self.files.contains_key(path))
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        Err(OpenWriteError::IoError {
            io_error: Arc::new(Self::read_only(path)),
            filepath: path.to_path_buf(),
        })
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        let file = self
            .files
            .get(path)
            .ok_or_else(|| OpenReadError::FileDoesNotExist(path.to_path_buf()))?;
        file.read_bytes(0..file.len)
            .map(|bytes| bytes.as_slice().to_vec())
            .map_err(|err| OpenReadError::wrap_io_error(err, path.to_path_buf()))
    }

    fn atomic_write(&self, path: &Path, _data: &[u8]) -> io::Result<()> {
        Err(Self::read_only(path))
    }

    fn sync_directory(&self) -> io::Result<()> {
        Ok(())
    }

    fn acquire_lock(&self, _lock: &Lock) -> Result<DirectoryLock, LockError> {
        // Nothing ever writes to a bundle: locks are moot.
        Ok(DirectoryLock::from(Box::new(())))
    }

    fn watch(&self, _watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        Ok(WatchHandle::empty())
    }
}

/// Opens the Tantivy index of a remote bundle (with the normalizers of fast text columns, as
/// [`open_split`](crate::open_split)). Reads outside the hot cache go through the bundle's
/// [`RangeRead`]: call this, and search the index, on blocking threads.
pub fn open_remote_split(bundle: RemoteBundle) -> Result<Index, IndexError> {
    let mut index = Index::open(bundle)?;
    index.set_fast_field_tokenizers(crate::tokenizers::fast_field_tokenizers());
    Ok(index)
}
