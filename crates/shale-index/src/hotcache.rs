//! The hot cache of a split: the byte ranges that opening the split for search reads (file
//! footers, the doc store's skip index, the column directory, `meta.json`…), found by opening
//! the freshly built index through a directory that records every read. The bundle writer
//! copies these ranges next to the footer, so a reader on object storage gets everything it
//! needs to open the split with one ranged request and reads the rest by ranges on demand.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::{fmt, io};

use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    DirectoryLock, FileHandle, Lock, MmapDirectory, OwnedBytes, WatchCallback, WatchHandle,
    WritePtr,
};
use tantivy::{Directory, HasLen, Index, ReloadPolicy};

use crate::error::IndexError;

/// Files at most this long go into the hot cache whole.
const SMALL_FILE_BYTES: u64 = 4096;

/// Ranges read so far, per file.
type ReadLog = Arc<Mutex<BTreeMap<PathBuf, Vec<Range<u64>>>>>;

fn log_read(log: &ReadLog, path: &Path, range: Range<u64>) {
    log.lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(path.to_path_buf())
        .or_default()
        .push(range);
}

/// A directory recording the byte ranges read through it.
#[derive(Clone)]
struct RecordingDirectory {
    inner: MmapDirectory,
    log: ReadLog,
}

impl fmt::Debug for RecordingDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RecordingDirectory")
    }
}

#[derive(Debug)]
struct RecordingHandle {
    path: PathBuf,
    inner: Arc<dyn FileHandle>,
    log: ReadLog,
}

impl HasLen for RecordingHandle {
    fn len(&self) -> usize {
        self.inner.len()
    }
}

impl FileHandle for RecordingHandle {
    fn read_bytes(&self, range: Range<usize>) -> io::Result<OwnedBytes> {
        log_read(&self.log, &self.path, range.start as u64..range.end as u64);
        self.inner.read_bytes(range)
    }
}

impl Directory for RecordingDirectory {
    fn get_file_handle(&self, path: &Path) -> Result<Arc<dyn FileHandle>, OpenReadError> {
        Ok(Arc::new(RecordingHandle {
            path: path.to_path_buf(),
            inner: self.inner.get_file_handle(path)?,
            log: self.log.clone(),
        }))
    }

    fn delete(&self, path: &Path) -> Result<(), DeleteError> {
        self.inner.delete(path)
    }

    fn exists(&self, path: &Path) -> Result<bool, OpenReadError> {
        self.inner.exists(path)
    }

    fn open_write(&self, path: &Path) -> Result<WritePtr, OpenWriteError> {
        self.inner.open_write(path)
    }

    fn atomic_read(&self, path: &Path) -> Result<Vec<u8>, OpenReadError> {
        let bytes = self.inner.atomic_read(path)?;
        log_read(&self.log, path, 0..bytes.len() as u64);
        Ok(bytes)
    }

    fn atomic_write(&self, path: &Path, data: &[u8]) -> io::Result<()> {
        self.inner.atomic_write(path, data)
    }

    fn sync_directory(&self) -> io::Result<()> {
        self.inner.sync_directory()
    }

    fn acquire_lock(&self, _lock: &Lock) -> Result<DirectoryLock, LockError> {
        // The index is committed and only read here; its writer may still hold its locks.
        Ok(DirectoryLock::from(Box::new(())))
    }

    fn watch(&self, watch_callback: WatchCallback) -> tantivy::Result<WatchHandle> {
        self.inner.watch(watch_callback)
    }
}

/// The hot ranges of the committed index in `index_dir` whose bundle holds `files`: per file
/// (in `files` order), sorted, disjoint byte ranges. Small files are taken whole.
pub(crate) fn hot_ranges(
    index_dir: &Path,
    files: &[String],
) -> Result<Vec<(String, Range<u64>)>, IndexError> {
    let log: ReadLog = Arc::default();
    let directory = RecordingDirectory {
        inner: MmapDirectory::open(index_dir)
            .map_err(|err| IndexError::InvalidArgument(format!("cannot open index: {err}")))?,
        log: log.clone(),
    };
    {
        // What a search opens: the index, a searcher (segment readers, doc store readers).
        let index = Index::open(directory)?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        let _searcher = reader.searcher();
    }
    let mut read = std::mem::take(&mut *log.lock().unwrap_or_else(|p| p.into_inner()));
    let mut out = Vec::new();
    for name in files {
        let path = index_dir.join(name);
        let len = std::fs::metadata(&path)
            .map_err(|err| IndexError::io(&path, err))?
            .len();
        let mut ranges = if len <= SMALL_FILE_BYTES {
            std::iter::once(0..len).collect()
        } else {
            read.remove(Path::new(name)).unwrap_or_default()
        };
        ranges.retain(|r| r.start < r.end && r.end <= len);
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
        for range in ranges {
            match merged.last_mut() {
                Some(last) if range.start <= last.end => last.end = last.end.max(range.end),
                _ => merged.push(range),
            }
        }
        out.extend(merged.into_iter().map(|range| (name.clone(), range)));
    }
    Ok(out)
}
