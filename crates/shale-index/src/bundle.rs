//! The split bundle: one self-describing file holding a whole Tantivy index.
//!
//! ```text
//! [file 0 bytes][file 1 bytes]…[hot cache][footer JSON][footer JSON length: u64 LE][b"SHALESPL"]
//! ```
//!
//! The footer JSON is `{"version": 1, "files": [{"name", "start", "end"}, …], "metadata": …,
//! "hot": [{"file", "start", "end", "at"}, …]}` where `start..end` is each file's byte range in
//! the bundle and `metadata` the split's [`SplitStats`]. The **hot cache** holds copies of the
//! byte ranges of files that opening the split for search reads (see [`HotSlice`]), so that
//! the hot cache and the footer — whose offsets are recorded in
//! [`BuiltSplit::footer_offsets`](crate::BuiltSplit) — come with one ranged read, and the rest
//! is read by ranges when a query needs it ([`BundleDirectory::open_remote`]). Without
//! the offsets, a reader range-reads the last [`BUNDLE_TRAILER_LEN`] bytes, then the footer.
//!
//! [`BundleDirectory`] is a read-only Tantivy [`Directory`] over a memory-mapped bundle (or
//! in-memory bytes): [`open_split`] needs no unpacking. [`unpack_split`] writes the files out.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::{fmt, io};

use serde::{Deserialize, Serialize};
use tantivy::directory::error::{DeleteError, LockError, OpenReadError, OpenWriteError};
use tantivy::directory::{
    DirectoryLock, FileHandle, FileSlice, Lock, OwnedBytes, WatchCallback, WatchHandle, WritePtr,
};
use tantivy::{Directory, HasLen, Index};

use crate::error::IndexError;
use crate::split::SplitStats;

/// Last 8 bytes of every bundle.
pub const BUNDLE_MAGIC: &[u8; 8] = b"SHALESPL";
/// Bytes after the footer JSON: its length (u64 LE) and the magic.
pub const BUNDLE_TRAILER_LEN: usize = 16;
/// Current bundle format version.
pub const BUNDLE_VERSION: u32 = 1;

/// One file of a bundle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleFile {
    /// File name inside the index directory (`meta.json`, `<segment>.idx`, …).
    pub name: String,
    /// Offset of its first byte in the bundle.
    pub start: u64,
    /// Offset after its last byte.
    pub end: u64,
}

/// Bytes `start..end` of file `file`, copied into the hot cache at bundle offset `at`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotSlice {
    /// The file the bytes belong to.
    pub file: String,
    /// First byte, relative to the file.
    pub start: u64,
    /// After the last byte, relative to the file.
    pub end: u64,
    /// Where the copy sits in the bundle.
    pub at: u64,
}

/// The bundle footer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BundleFooter {
    /// Format version ([`BUNDLE_VERSION`]).
    pub version: u32,
    /// The files, in bundle order.
    pub files: Vec<BundleFile>,
    /// What the split holds (absent in bundles written by other tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<SplitStats>,
    /// The hot cache (absent in bundles written before it existed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hot: Vec<HotSlice>,
}

fn invalid(path: &Path, message: impl Into<String>) -> IndexError {
    IndexError::InvalidBundle {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl BundleFooter {
    /// Given the last bytes of a bundle (at least [`BUNDLE_TRAILER_LEN`]), the length of the
    /// footer JSON, so that a reader knows how much more of the tail to fetch.
    pub fn footer_len_from_trailer(tail: &[u8]) -> Result<u64, IndexError> {
        let path = Path::new("");
        if tail.len() < BUNDLE_TRAILER_LEN {
            return Err(invalid(path, "shorter than the bundle trailer"));
        }
        let trailer = &tail[tail.len() - BUNDLE_TRAILER_LEN..];
        if &trailer[8..] != BUNDLE_MAGIC {
            return Err(invalid(path, "bad magic: not a Shale split bundle"));
        }
        let mut len = [0u8; 8];
        len.copy_from_slice(&trailer[..8]);
        Ok(u64::from_le_bytes(len))
    }

    /// Parses the footer from the tail of a bundle (the footer JSON and the trailer at least).
    pub fn parse_from_tail(tail: &[u8]) -> Result<BundleFooter, IndexError> {
        let footer_len = Self::footer_len_from_trailer(tail)?;
        let json_end = tail.len() - BUNDLE_TRAILER_LEN;
        let json_start = usize::try_from(footer_len)
            .ok()
            .and_then(|len| json_end.checked_sub(len))
            .ok_or_else(|| invalid(Path::new(""), "footer length exceeds the data given"))?;
        let footer: BundleFooter = serde_json::from_slice(&tail[json_start..json_end])
            .map_err(|err| invalid(Path::new(""), format!("bad footer: {err}")))?;
        if footer.version != BUNDLE_VERSION {
            return Err(invalid(
                Path::new(""),
                format!("unsupported bundle version {}", footer.version),
            ));
        }
        Ok(footer)
    }
}

/// Where the footer sits in a written bundle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WrittenBundle {
    pub size_bytes: u64,
    pub footer_offsets: (u64, u64),
}

/// Writes `files` (names relative to `index_dir`), the hot cache of the committed index in
/// `index_dir` and the footer to `bundle_path`.
pub(crate) fn write_bundle(
    index_dir: &Path,
    files: &[String],
    metadata: &SplitStats,
    bundle_path: &Path,
) -> Result<WrittenBundle, IndexError> {
    let out = File::create(bundle_path).map_err(|err| IndexError::io(bundle_path, err))?;
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let mut offset = 0u64;
    let mut entries = Vec::with_capacity(files.len());
    for name in files {
        let path = index_dir.join(name);
        let mut file = File::open(&path).map_err(|err| IndexError::io(&path, err))?;
        let len = io::copy(&mut file, &mut out).map_err(|err| IndexError::io(bundle_path, err))?;
        entries.push(BundleFile {
            name: name.clone(),
            start: offset,
            end: offset + len,
        });
        offset += len;
    }
    let hot_start = offset;
    let mut hot = Vec::new();
    for (name, range) in crate::hotcache::hot_ranges(index_dir, files)? {
        let path = index_dir.join(&name);
        let mut file = File::open(&path).map_err(|err| IndexError::io(&path, err))?;
        io::Seek::seek(&mut file, io::SeekFrom::Start(range.start))
            .map_err(|err| IndexError::io(&path, err))?;
        let want = range.end - range.start;
        let copied = io::copy(&mut io::Read::take(&mut file, want), &mut out)
            .map_err(|err| IndexError::io(bundle_path, err))?;
        if copied != want {
            return Err(invalid(
                bundle_path,
                format!("`{name}` changed while bundled"),
            ));
        }
        hot.push(HotSlice {
            file: name,
            start: range.start,
            end: range.end,
            at: offset,
        });
        offset += want;
    }
    let footer = BundleFooter {
        version: BUNDLE_VERSION,
        files: entries,
        metadata: Some(metadata.clone()),
        hot,
    };
    let json = serde_json::to_vec(&footer).map_err(|err| invalid(bundle_path, err.to_string()))?;
    let footer_start = offset;
    let write = |out: &mut BufWriter<File>| -> io::Result<()> {
        out.write_all(&json)?;
        out.write_all(&(json.len() as u64).to_le_bytes())?;
        out.write_all(BUNDLE_MAGIC)?;
        out.flush()
    };
    write(&mut out).map_err(|err| IndexError::io(bundle_path, err))?;
    let size_bytes = footer_start + json.len() as u64 + BUNDLE_TRAILER_LEN as u64;
    Ok(WrittenBundle {
        size_bytes,
        footer_offsets: (hot_start, size_bytes),
    })
}

/// A read-only Tantivy [`Directory`] over a split bundle: memory-mapped ([`open`]
/// (BundleDirectory::open)) or read by ranges from object storage
/// ([`open_remote`](BundleDirectory::open_remote)).
#[derive(Clone)]
pub struct BundleDirectory {
    files: Arc<HashMap<PathBuf, Arc<dyn FileHandle>>>,
    footer: Arc<BundleFooter>,
    origin: Arc<PathBuf>,
}

impl fmt::Debug for BundleDirectory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BundleDirectory({})", self.origin.display())
    }
}

impl BundleDirectory {
    /// Memory-maps the bundle at `path`.
    pub fn open(path: &Path) -> Result<BundleDirectory, IndexError> {
        let file = File::open(path).map_err(|err| IndexError::io(path, err))?;
        // SAFETY: split bundles are immutable once written (they are written to a new path and
        // never modified in place), so the mapping is not mutated under our feet.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(|err| IndexError::io(path, err))?;
        let bytes = if mmap.is_empty() {
            OwnedBytes::empty()
        } else {
            OwnedBytes::new(mmap)
        };
        Self::from_bytes_with_origin(bytes, path)
    }

    fn from_bytes_with_origin(
        bytes: OwnedBytes,
        origin: &Path,
    ) -> Result<BundleDirectory, IndexError> {
        let relabel = |err: IndexError| match err {
            IndexError::InvalidBundle { message, .. } => invalid(origin, message),
            other => other,
        };
        let footer = BundleFooter::parse_from_tail(bytes.as_slice()).map_err(relabel)?;
        let slice = FileSlice::new(Arc::new(bytes));
        let data_len = slice.num_bytes().get_bytes();
        let mut files = HashMap::with_capacity(footer.files.len());
        for entry in &footer.files {
            if entry.start > entry.end || entry.end > data_len {
                return Err(invalid(
                    origin,
                    format!("file `{}` is out of the bundle's bounds", entry.name),
                ));
            }
            let file: Arc<dyn FileHandle> =
                Arc::new(slice.slice(entry.start as usize..entry.end as usize));
            files.insert(PathBuf::from(&entry.name), file);
        }
        Ok(Self::from_parts(files, footer, origin))
    }

    /// A directory serving `files` (by name), described by `footer`.
    pub(crate) fn from_parts(
        files: HashMap<PathBuf, Arc<dyn FileHandle>>,
        footer: BundleFooter,
        origin: &Path,
    ) -> BundleDirectory {
        BundleDirectory {
            files: Arc::new(files),
            footer: Arc::new(footer),
            origin: Arc::new(origin.to_path_buf()),
        }
    }

    /// Bytes of the bundle's hot cache.
    pub fn hot_bytes(&self) -> u64 {
        self.footer.hot.iter().map(|s| s.end - s.start).sum()
    }

    /// The bundle's footer.
    pub fn footer(&self) -> &BundleFooter {
        &self.footer
    }

    fn read_only(path: &Path) -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("split bundles are read-only (writing `{}`)", path.display()),
        )
    }
}

impl Directory for BundleDirectory {
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
        file.read_bytes(0..file.len())
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

/// Opens the Tantivy index of a split bundle, memory-mapped, without unpacking it (with the
/// normalizers of fast text columns, which aggregations look terms up with).
pub fn open_split(bundle_path: &Path) -> Result<Index, IndexError> {
    open_bundle(BundleDirectory::open(bundle_path)?)
}

/// Opens the Tantivy index of a bundle (with the normalizers of fast text columns, which
/// aggregations look terms up with). For a bundle read by ranges, call this, and search the
/// index, on blocking threads.
pub fn open_bundle(directory: BundleDirectory) -> Result<Index, IndexError> {
    let mut index = Index::open(directory)?;
    index.set_fast_field_tokenizers(crate::tokenizers::fast_field_tokenizers());
    Ok(index)
}

/// Writes the files of a bundle into `dest_dir` (created if needed), where
/// `Index::open_in_dir` can open them.
pub fn unpack_split(bundle_path: &Path, dest_dir: &Path) -> Result<(), IndexError> {
    let directory = BundleDirectory::open(bundle_path)?;
    std::fs::create_dir_all(dest_dir).map_err(|err| IndexError::io(dest_dir, err))?;
    for entry in &directory.footer().files {
        let name = Path::new(&entry.name);
        let plain = name.components().count() == 1
            && matches!(
                name.components().next(),
                Some(std::path::Component::Normal(_))
            );
        if !plain {
            return Err(invalid(
                bundle_path,
                format!(
                    "refusing to unpack file `{}` outside the directory",
                    entry.name
                ),
            ));
        }
        let file = directory
            .files
            .get(name)
            .ok_or_else(|| invalid(bundle_path, "inconsistent footer"))?;
        let bytes = file
            .read_bytes(0..file.len())
            .map_err(|err| IndexError::io(bundle_path, err))?;
        let dest = dest_dir.join(name);
        std::fs::write(&dest, bytes.as_slice()).map_err(|err| IndexError::io(&dest, err))?;
    }
    Ok(())
}
