//! The write-ahead log: one mrecordlog queue per shard under `data_dir/queues`.
//!
//! Every accepted document is one record; a record's position is its WAL offset, and the
//! metastore checkpoint of a shard is the last position published in a split. Positions are
//! always given explicitly, so that after a crash that lost the WAL's unflushed tail the
//! shard resumes *after* its checkpoint and never reuses a published position.
//!
//! Persist policies:
//! - `on-append`: every append is written to the OS and fsynced before it is acknowledged;
//!   survives a process kill and a machine crash.
//! - `on-delay(interval)`: appends are flushed and fsynced at most `interval` apart (and by a
//!   background tick); a process kill or crash may lose the last `interval` of documents that
//!   were acknowledged with `commit=auto` and not yet in a published split.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use mrecordlog::{MultiRecordLog, SyncPolicy};
use tokio::sync::Mutex;

/// When the WAL is made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistPolicy {
    /// Flush + fsync every append before acknowledging it.
    OnAppend,
    /// Flush + fsync at most this far apart.
    OnDelay(Duration),
}

/// Errors of the WAL.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// Opening or reading the log failed.
    #[error("WAL I/O error: {0}")]
    Io(String),
    /// The queue does not exist.
    #[error("WAL queue `{0}` does not exist")]
    MissingQueue(String),
}

/// Result of WAL operations.
pub type WalResult<T> = Result<T, WalError>;

struct Inner {
    log: MultiRecordLog,
    /// Next position to assign, per queue.
    next_positions: HashMap<String, u64>,
}

/// The node's write-ahead log.
pub struct Wal {
    dir: PathBuf,
    policy: PersistPolicy,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("dir", &self.dir).finish()
    }
}

fn io<E: std::fmt::Display>(err: E) -> WalError {
    WalError::Io(err.to_string())
}

impl Wal {
    /// Opens (or creates) the WAL in `dir`, replaying it into memory.
    pub async fn open(dir: &Path, policy: PersistPolicy) -> WalResult<Arc<Wal>> {
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
        let sync_policy = match policy {
            PersistPolicy::OnAppend => SyncPolicy::OnAppend,
            PersistPolicy::OnDelay(interval) => SyncPolicy::OnDelay(interval),
        };
        let log = MultiRecordLog::open_with_prefs(dir, sync_policy)
            .await
            .map_err(io)?;
        let mut next_positions = HashMap::new();
        for queue in log.list_queues() {
            let next = log
                .range(queue, ..)
                .map_err(|_| WalError::MissingQueue(queue.to_string()))?
                .last()
                .map(|(pos, _)| pos + 1)
                .unwrap_or(0);
            next_positions.insert(queue.to_string(), next);
        }
        let wal = Arc::new(Wal {
            dir: dir.to_path_buf(),
            policy,
            inner: Mutex::new(Inner {
                log,
                next_positions,
            }),
        });
        if let PersistPolicy::OnDelay(interval) = policy {
            let weak = Arc::downgrade(&wal);
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(interval);
                ticker.tick().await;
                loop {
                    ticker.tick().await;
                    let Some(wal) = weak.upgrade() else { break };
                    if let Err(err) = wal.persist().await {
                        tracing::error!(%err, "periodic WAL persist failed");
                    }
                }
            });
        }
        Ok(wal)
    }

    /// The queues present, with their next position.
    pub async fn queues(&self) -> Vec<(String, u64)> {
        let inner = self.inner.lock().await;
        let mut queues: Vec<(String, u64)> = inner
            .next_positions
            .iter()
            .map(|(q, p)| (q.clone(), *p))
            .collect();
        queues.sort();
        queues
    }

    /// Creates `queue` if missing, and makes sure its next position is after `checkpoint`
    /// (the last published position), so published positions are never reused.
    pub async fn ensure_queue(&self, queue: &str, checkpoint: Option<u64>) -> WalResult<()> {
        let mut inner = self.inner.lock().await;
        if !inner.log.queue_exists(queue) {
            inner.log.create_queue(queue).await.map_err(io)?;
            inner.next_positions.insert(queue.to_string(), 0);
            drop(inner);
            self.fsync_files().await?;
            inner = self.inner.lock().await;
        }
        let floor = checkpoint.map(|c| c + 1).unwrap_or(0);
        let next = inner.next_positions.entry(queue.to_string()).or_insert(0);
        if *next < floor {
            *next = floor;
        }
        Ok(())
    }

    /// Appends records atomically; returns the positions `(first, last)` they got, `None` if
    /// `records` was empty. Durable per the persist policy when this returns.
    pub async fn append(&self, queue: &str, records: &[&[u8]]) -> WalResult<Option<(u64, u64)>> {
        if records.is_empty() {
            return Ok(None);
        }
        let mut inner = self.inner.lock().await;
        let first = *inner
            .next_positions
            .get(queue)
            .ok_or_else(|| WalError::MissingQueue(queue.to_string()))?;
        inner
            .log
            .append_records(queue, Some(first), records.iter().copied())
            .await
            .map_err(io)?;
        let last = first + records.len() as u64 - 1;
        inner.next_positions.insert(queue.to_string(), last + 1);
        if self.policy == PersistPolicy::OnAppend {
            // mrecordlog flushed to the OS; make it durable before acknowledging.
            self.fsync_newest_file().await?;
        }
        Ok(Some((first, last)))
    }

    /// Copies up to `max_records` (and about `max_bytes`) records of `queue` with position
    /// `>= from`.
    pub async fn read(
        &self,
        queue: &str,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> WalResult<Vec<(u64, Vec<u8>)>> {
        let inner = self.inner.lock().await;
        let mut out = Vec::new();
        let mut bytes = 0;
        for (pos, payload) in inner
            .log
            .range(queue, from..)
            .map_err(|_| WalError::MissingQueue(queue.to_string()))?
        {
            bytes += payload.len();
            out.push((pos, payload.into_owned()));
            if out.len() >= max_records || bytes >= max_bytes {
                break;
            }
        }
        Ok(out)
    }

    /// Drops records of `queue` up to and including `position`.
    pub async fn truncate(&self, queue: &str, position: u64) -> WalResult<()> {
        let mut inner = self.inner.lock().await;
        if inner.log.queue_exists(queue) {
            inner.log.truncate(queue, position).await.map_err(io)?;
        }
        Ok(())
    }

    /// Deletes `queue` (index deleted).
    pub async fn delete_queue(&self, queue: &str) -> WalResult<()> {
        let mut inner = self.inner.lock().await;
        if inner.log.queue_exists(queue) {
            inner.log.delete_queue(queue).await.map_err(io)?;
        }
        inner.next_positions.remove(queue);
        Ok(())
    }

    /// Flushes and fsyncs everything appended so far.
    pub async fn persist(&self) -> WalResult<()> {
        {
            let mut inner = self.inner.lock().await;
            inner.log.sync().await.map_err(io)?;
        }
        self.fsync_newest_file().await
    }

    /// Bytes of records held in memory (not yet truncated).
    pub async fn memory_size(&self) -> usize {
        self.inner.lock().await.log.in_memory_size()
    }

    /// Bytes the WAL files use on disk.
    pub async fn disk_size(&self) -> usize {
        self.inner.lock().await.log.on_disk_size()
    }

    async fn wal_files(&self) -> WalResult<Vec<PathBuf>> {
        let mut files = Vec::new();
        let mut entries = tokio::fs::read_dir(&self.dir).await.map_err(io)?;
        while let Some(entry) = entries.next_entry().await.map_err(io)? {
            if entry.file_name().to_string_lossy().starts_with("wal-") {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }

    /// mrecordlog flushes but never fsyncs: fsync its newest file (the one being appended to).
    async fn fsync_newest_file(&self) -> WalResult<()> {
        if let Some(newest) = self.wal_files().await?.pop() {
            let file = tokio::fs::OpenOptions::new()
                .read(true)
                .open(&newest)
                .await
                .map_err(io)?;
            file.sync_data().await.map_err(io)?;
        }
        Ok(())
    }

    async fn fsync_files(&self) -> WalResult<()> {
        self.persist().await?;
        let dir = tokio::fs::File::open(&self.dir).await.map_err(io)?;
        dir.sync_all().await.map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn positions_survive_reopen_and_never_go_back_past_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
                .await
                .unwrap();
            wal.ensure_queue("q", None).await.unwrap();
            assert_eq!(
                wal.append("q", &[b"a", b"b", b"c"]).await.unwrap(),
                Some((0, 2))
            );
            wal.truncate("q", 1).await.unwrap();
            let recs = wal.read("q", 0, 10, 1 << 20).await.unwrap();
            assert_eq!(recs, vec![(2, b"c".to_vec())]);
        }
        let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
            .await
            .unwrap();
        assert_eq!(wal.queues().await, vec![("q".to_string(), 3)]);
        // A checkpoint beyond what the WAL kept (lost tail) moves positions forward.
        wal.ensure_queue("q", Some(9)).await.unwrap();
        assert_eq!(wal.append("q", &[b"d"]).await.unwrap(), Some((10, 10)));
        let recs = wal.read("q", 3, 10, 1 << 20).await.unwrap();
        assert_eq!(recs, vec![(10, b"d".to_vec())]);
        assert!(matches!(
            wal.append("nope", &[b"x"]).await,
            Err(WalError::MissingQueue(_))
        ));
        wal.delete_queue("q").await.unwrap();
        assert!(wal.queues().await.is_empty());
    }

    #[tokio::test]
    async fn read_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(
            dir.path(),
            PersistPolicy::OnDelay(Duration::from_millis(50)),
        )
        .await
        .unwrap();
        wal.ensure_queue("q", None).await.unwrap();
        let recs: Vec<Vec<u8>> = (0..100).map(|i| format!("doc{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = recs.iter().map(|r| r.as_slice()).collect();
        wal.append("q", &refs).await.unwrap();
        assert_eq!(wal.read("q", 0, 10, 1 << 20).await.unwrap().len(), 10);
        assert_eq!(wal.read("q", 95, 10, 1 << 20).await.unwrap().len(), 5);
        assert_eq!(wal.read("q", 0, 1000, 8).await.unwrap().len(), 2);
        wal.persist().await.unwrap();
    }
}
