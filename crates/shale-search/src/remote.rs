//! Opening splits that live on remote object storage without downloading them: one ranged
//! GET for the split's hot cache and footer, then Tantivy's reads go by ranges through the
//! node's [`RangeCache`]. Tantivy reads synchronously on the search's blocking thread; each
//! read that misses the hot cache hands its GET to the async runtime and waits for it.

use std::io;
use std::ops::Range;
use std::sync::Arc;

use shale_index::{RangeRead, RemoteBundle};
use shale_storage::{RangeCache, StorageRef};
use shale_types::SplitMetadata;
use tantivy::directory::OwnedBytes;
use tantivy::{ReloadPolicy, Searcher};

/// How much of a split's end is read when its metadata does not say where the footer starts.
const BLIND_TAIL_BYTES: u64 = 64 * 1024;

/// Byte ranges of one split object, read through the range cache.
#[derive(Debug)]
struct StorageRanges {
    storage: StorageRef,
    name: String,
    len: u64,
    cache: Arc<RangeCache>,
    runtime: tokio::runtime::Handle,
}

impl RangeRead for StorageRanges {
    fn read(&self, range: Range<u64>) -> io::Result<OwnedBytes> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let storage = self.storage.clone();
        let cache = self.cache.clone();
        let name = self.name.clone();
        let len = self.len;
        self.runtime.spawn(async move {
            let _ = tx.send(cache.read(storage.as_ref(), &name, len, range).await);
        });
        let bytes = rx
            .recv()
            .map_err(|_| io::Error::other("the runtime stopped during a split read"))?
            .map_err(|err| io::Error::other(err.to_string()))?;
        Ok(OwnedBytes::new(bytes.to_vec()))
    }
}

/// Opens `split` of `storage` by ranges and returns its searcher. Must run inside the async
/// runtime (it fetches the tail there and opens the index on a blocking thread).
pub(crate) async fn open_remote_split(
    storage: StorageRef,
    split: &SplitMetadata,
    cache: Arc<RangeCache>,
) -> Result<Searcher, String> {
    let name = shale_types::split_object_key(&split.split_id);
    let len = split.size_bytes;
    let (footer_start, footer_end) = split.footer_offsets;
    let tail_start = if footer_end == len && footer_start < footer_end {
        footer_start
    } else {
        len.saturating_sub(BLIND_TAIL_BYTES)
    };
    let mut tail = storage
        .get_range(&name, tail_start..len)
        .await
        .map_err(|err| err.to_string())?;
    cache.record_fetch(tail.len() as u64);
    let mut tail_start = tail_start;
    let needed = RemoteBundle::tail_needed(&tail).map_err(|err| err.to_string())?;
    if needed > tail.len() as u64 {
        tail_start = len
            .checked_sub(needed)
            .ok_or_else(|| format!("split `{name}` has a footer longer than itself"))?;
        tail = storage
            .get_range(&name, tail_start..len)
            .await
            .map_err(|err| err.to_string())?;
        cache.record_fetch(tail.len() as u64);
    }
    let ranges = Arc::new(StorageRanges {
        storage,
        name: name.clone(),
        len,
        cache,
        runtime: tokio::runtime::Handle::current(),
    });
    tokio::task::spawn_blocking(move || -> Result<Searcher, String> {
        let bundle = RemoteBundle::open(
            &name,
            OwnedBytes::new(tail.to_vec()),
            tail_start,
            len,
            ranges,
        )
        .map_err(|err| err.to_string())?;
        let index = shale_index::open_remote_split(bundle).map_err(|err| err.to_string())?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|err| err.to_string())?;
        Ok(reader.searcher())
    })
    .await
    .map_err(|err| err.to_string())?
}
