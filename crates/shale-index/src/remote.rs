//! Opening a split bundle that stays on object storage: [`BundleDirectory::open_remote`]
//! builds the bundle's read-only Tantivy directory from its tail (hot cache + footer, one
//! ranged read); it serves reads inside the hot cache from memory and every other read with a
//! ranged read through a [`RangeRead`] (which caches). A search thus fetches the hot cache plus the term
//! dictionaries, postings, columns and doc store blocks its query touches — not the split.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::{fmt, io};

use tantivy::directory::{FileHandle, OwnedBytes};
use tantivy::HasLen;

use crate::bundle::{BundleDirectory, BundleFooter, BUNDLE_TRAILER_LEN};
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

fn invalid(name: &str, message: impl Into<String>) -> IndexError {
    IndexError::InvalidBundle {
        path: PathBuf::from(name),
        message: message.into(),
    }
}

impl BundleDirectory {
    /// The bundle `name`, `bundle_len` bytes long, of which `tail` holds bytes
    /// `tail_start..bundle_len` — at least the footer JSON and trailer (see
    /// [`BundleDirectory::tail_needed`]), best the hot cache too (see
    /// [`BuiltSplit::footer_offsets`](crate::BuiltSplit)). Reads inside the hot cache are
    /// served from `tail`; the others go through `reader`.
    pub fn open_remote(
        name: &str,
        tail: OwnedBytes,
        tail_start: u64,
        bundle_len: u64,
        reader: Arc<dyn RangeRead>,
    ) -> Result<BundleDirectory, IndexError> {
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
        let mut files: HashMap<PathBuf, Arc<dyn FileHandle>> =
            HashMap::with_capacity(footer.files.len());
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
        Ok(BundleDirectory::from_parts(files, footer, Path::new(name)))
    }

    /// Given the last bytes of a bundle (at least [`BUNDLE_TRAILER_LEN`]), how many bytes from
    /// the end hold the footer JSON and trailer: read at least that many for
    /// [`BundleDirectory::open_remote`].
    pub fn tail_needed(last_bytes: &[u8]) -> Result<u64, IndexError> {
        Ok(BundleFooter::footer_len_from_trailer(last_bytes)? + BUNDLE_TRAILER_LEN as u64)
    }
}
