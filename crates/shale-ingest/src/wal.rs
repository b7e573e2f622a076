//! The write-ahead log: one mrecordlog queue per shard under `data_dir/queues`.
//!
//! Every accepted document is one record; a record's position is its WAL offset, and the
//! metastore checkpoint of a shard is the last position published in a split. Positions are
//! always given explicitly, so that after a crash that lost the WAL's unsynced tail the
//! shard resumes *after* its checkpoint and never reuses a published position.
//!
//! Durability. mrecordlog writes through a user-space buffer and never fsyncs. Shale makes it
//! flush on every operation, so **an acknowledged append has reached the operating system
//! under every policy and survives a kill of the process**. What the persist policy decides
//! is when the files are fsynced, i.e. what a machine crash or power loss can take:
//! - `on-append`: an append is acknowledged only after an fsync that covers it;
//! - `on-delay(interval)`: a background task fsyncs at most `interval` apart; a power loss
//!   may lose the documents acknowledged (with `commit=auto`) in the last `interval`.
//!
//! A write that fails (a full disk) can leave part of its bytes in mrecordlog's buffered
//! writer, which would write them ahead of the next operation: a refused batch would come
//! back, under a position the next batch reuses, and the log would then fail to open. So a
//! failed write reopens the log from its files, as after a crash (a partial tail is
//! ignored), and the append reports what the files hold: the batch is there (success) or it
//! is not (nothing appended, safe to retry).
//!
//! An fsync round covers every WAL file written since the previous round — including files
//! mrecordlog rolled over to in between — and the directory when files were created. Rounds
//! are group commits: appends that arrive while a round runs wait for the next round, which
//! covers all of them with one fsync per file, and appends never hold the log's lock while
//! an fsync runs.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mrecordlog::{MultiRecordLog, SyncPolicy};
use tokio::sync::Mutex;

use crate::metrics;

/// When the WAL is made durable against a machine crash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PersistPolicy {
    /// fsync before acknowledging every append (group commit).
    OnAppend,
    /// fsync at most this far apart.
    OnDelay(Duration),
}

/// Errors of the WAL.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    /// Opening, writing or syncing the log failed.
    #[error("WAL I/O error: {0}")]
    Io(String),
    /// The queue does not exist.
    #[error("WAL queue `{0}` does not exist")]
    MissingQueue(String),
    /// Records were appended but could not be made durable (the fsync failed): they are in
    /// the log and may still be indexed.
    #[error(
        "WAL sync failed after the append, the documents may or may not have been ingested: {0}"
    )]
    NotDurable(String),
}

impl WalError {
    /// Whether the failed operation certainly appended nothing (a retry cannot duplicate).
    pub fn nothing_appended(&self) -> bool {
        !matches!(self, WalError::NotDurable(_))
    }
}

/// Result of WAL operations.
pub type WalResult<T> = Result<T, WalError>;

struct Inner {
    log: MultiRecordLog,
    /// Next position to assign, per queue.
    next_positions: HashMap<String, u64>,
    /// A failed write could not be followed by a reopen: the next write reopens first.
    needs_reopen: bool,
}

/// What the fsync rounds know about the files.
struct SyncState {
    /// Files numbered from this one on may hold data written since the last round.
    first_unsynced_file: u64,
    /// The files that existed at the last round (a new file needs a directory fsync).
    known_files: BTreeSet<u64>,
}

/// The node's write-ahead log.
pub struct Wal {
    dir: PathBuf,
    policy: PersistPolicy,
    inner: Mutex<Inner>,
    /// Sequence number of the last operation flushed to the OS.
    written_seq: AtomicU64,
    /// Every operation up to this sequence number is fsynced.
    synced_seq: AtomicU64,
    /// Held by the one fsync round in progress.
    sync_state: Mutex<SyncState>,
    /// fsync rounds done.
    sync_rounds: AtomicU64,
    /// Bytes of the records appended and not yet truncated (the indexing backlog).
    backlog_bytes: AtomicU64,
}

impl std::fmt::Debug for Wal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wal").field("dir", &self.dir).finish()
    }
}

fn io<E: std::fmt::Display>(err: E) -> WalError {
    WalError::Io(err.to_string())
}

/// The number of a `wal-NNNNNNNNNNNNNNNNNNNN` file.
fn wal_file_number(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("wal-")?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Bytes of the records of `queue` in `range`.
fn queue_bytes<R>(log: &MultiRecordLog, queue: &str, range: R) -> u64
where
    R: std::ops::RangeBounds<u64> + 'static,
{
    log.range(queue, range)
        .map(|records| records.map(|(_, payload)| payload.len() as u64).sum())
        .unwrap_or(0)
}

fn wal_file_path(dir: &Path, number: u64) -> PathBuf {
    dir.join(format!("wal-{number:020}"))
}

impl Wal {
    /// Opens (or creates) the WAL in `dir`, replaying it into memory.
    pub async fn open(dir: &Path, policy: PersistPolicy) -> WalResult<Arc<Wal>> {
        tokio::fs::create_dir_all(dir).await.map_err(io)?;
        // Flush on every operation: acknowledged bytes always reach the OS.
        let log = MultiRecordLog::open_with_prefs(dir, SyncPolicy::OnAppend)
            .await
            .map_err(io)?;
        let mut next_positions = HashMap::new();
        let mut backlog: u64 = 0;
        for queue in log.list_queues() {
            backlog += log
                .range(queue, ..)
                .map_err(|_| WalError::MissingQueue(queue.to_string()))?
                .map(|(_, payload)| payload.len() as u64)
                .sum::<u64>();
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
                needs_reopen: false,
            }),
            written_seq: AtomicU64::new(0),
            synced_seq: AtomicU64::new(0),
            // The first round syncs every file: what a previous run wrote may be unsynced.
            sync_state: Mutex::new(SyncState {
                first_unsynced_file: 0,
                known_files: BTreeSet::new(),
            }),
            sync_rounds: AtomicU64::new(0),
            backlog_bytes: AtomicU64::new(backlog),
        });
        // Make what a previous run flushed but did not sync durable before serving from it.
        wal.sync_all().await?;
        if let PersistPolicy::OnDelay(interval) = policy {
            let weak = Arc::downgrade(&wal);
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(interval);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                ticker.tick().await;
                loop {
                    ticker.tick().await;
                    let Some(wal) = weak.upgrade() else { break };
                    if let Err(err) = wal.persist().await {
                        tracing::error!(%err, "periodic WAL fsync failed");
                    }
                }
            });
        }
        Ok(wal)
    }

    /// The persist policy.
    pub fn policy(&self) -> PersistPolicy {
        self.policy
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

    /// Replaces the log by one reopened from its files, after a failed write (see the module
    /// docs); the backlog is counted again from what the files hold.
    async fn reopen(&self, inner: &mut Inner) -> WalResult<()> {
        match MultiRecordLog::open_with_prefs(&self.dir, SyncPolicy::OnAppend).await {
            Ok(log) => {
                let backlog: u64 = log
                    .list_queues()
                    .map(|queue| queue_bytes(&log, queue, ..))
                    .sum();
                inner.log = log;
                inner.needs_reopen = false;
                self.backlog_bytes.store(backlog, Ordering::Release);
                metrics::WAL_REOPENS.inc();
                tracing::warn!(dir = %self.dir.display(), "WAL reopened after a failed write");
                Ok(())
            }
            Err(err) => {
                inner.needs_reopen = true;
                Err(io(format!("reopening the WAL after a failed write: {err}")))
            }
        }
    }

    /// Reopens the log if a failed write left it in doubt; done before any write.
    async fn ready_to_write(&self, inner: &mut Inner) -> WalResult<()> {
        if inner.needs_reopen {
            self.reopen(inner).await?;
        }
        Ok(())
    }

    /// After a failed write other than an append: the log is reopened (what the failed
    /// operation did, if anything, is what its files say) and `err` returned.
    async fn failed_write<E: std::fmt::Display>(&self, inner: &mut Inner, err: E) -> WalError {
        let message = err.to_string();
        match self.reopen(inner).await {
            Ok(()) => WalError::Io(message),
            Err(reopen) => WalError::Io(format!("{message}; {reopen}")),
        }
    }

    /// Records that an operation reached the OS; returns its sequence number.
    fn mark_written(&self) -> u64 {
        self.written_seq.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Creates `queue` if missing (durably), and makes sure its next position is after
    /// `checkpoint` (the last published position), so published positions are never reused.
    pub async fn ensure_queue(&self, queue: &str, checkpoint: Option<u64>) -> WalResult<()> {
        let mut inner = self.inner.lock().await;
        let mut created = None;
        if !inner.log.queue_exists(queue) {
            self.ready_to_write(&mut inner).await?;
            if let Err(err) = inner.log.create_queue(queue).await {
                return Err(self.failed_write(&mut inner, err).await);
            }
            inner.next_positions.insert(queue.to_string(), 0);
            created = Some(self.mark_written());
        }
        let floor = checkpoint.map(|c| c + 1).unwrap_or(0);
        let next = inner.next_positions.entry(queue.to_string()).or_insert(0);
        if *next < floor {
            *next = floor;
        }
        drop(inner);
        if let Some(seq) = created {
            self.sync_through(seq).await?;
        }
        Ok(())
    }

    /// Appends records atomically; returns the positions `(first, last)` they got, `None` if
    /// `records` was empty. When this returns the records have reached the OS (they survive a
    /// process kill), and with `on-append` they are fsynced (they survive a power loss).
    pub async fn append(&self, queue: &str, records: &[&[u8]]) -> WalResult<Option<(u64, u64)>> {
        self.append_with_prefix(queue, &[], records).await
    }

    /// Like [`Wal::append`], every record stored as `prefix` followed by the record (without
    /// copying the records).
    pub async fn append_with_prefix(
        &self,
        queue: &str,
        prefix: &[u8],
        records: &[&[u8]],
    ) -> WalResult<Option<(u64, u64)>> {
        use bytes::Buf;
        if records.is_empty() {
            return Ok(None);
        }
        let mut inner = self.inner.lock().await;
        let first = *inner
            .next_positions
            .get(queue)
            .ok_or_else(|| WalError::MissingQueue(queue.to_string()))?;
        self.ready_to_write(&mut inner).await?;
        let last = first + records.len() as u64 - 1;
        let appended = inner
            .log
            .append_records(
                queue,
                Some(first),
                records.iter().map(|record| prefix.chain(*record)),
            )
            .await;
        if let Err(err) = appended {
            let message = err.to_string();
            if let Err(reopen) = self.reopen(&mut inner).await {
                return Err(WalError::NotDurable(format!("{message}; {reopen}")));
            }
            // What the files hold decides: all of the batch, or none of it.
            let present = inner
                .log
                .range(queue, first..=last)
                .map(|found| found.count())
                .unwrap_or(0);
            if present == 0 {
                return Err(WalError::Io(message));
            }
            if present != records.len() {
                return Err(WalError::NotDurable(format!(
                    "{message}; {present} of the {} records are in the WAL",
                    records.len()
                )));
            }
            tracing::warn!(%message, queue, "a WAL append reported an error but is in the files");
        } else {
            let bytes: u64 = records
                .iter()
                .map(|r| (prefix.len() + r.len()) as u64)
                .sum();
            self.backlog_bytes.fetch_add(bytes, Ordering::AcqRel);
        }
        inner.next_positions.insert(queue.to_string(), last + 1);
        let seq = self.mark_written();
        drop(inner);
        metrics::WAL_APPENDS.inc();
        if self.policy == PersistPolicy::OnAppend {
            self.sync_through(seq).await.map_err(|err| match err {
                WalError::Io(message) => WalError::NotDurable(message),
                other => other,
            })?;
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
            self.ready_to_write(&mut inner).await?;
            let dropped = queue_bytes(&inner.log, queue, ..=position);
            if let Err(err) = inner.log.truncate(queue, position).await {
                return Err(self.failed_write(&mut inner, err).await);
            }
            self.backlog_bytes.fetch_sub(dropped, Ordering::AcqRel);
            self.mark_written();
        }
        Ok(())
    }

    /// Deletes `queue` (index deleted).
    pub async fn delete_queue(&self, queue: &str) -> WalResult<()> {
        let mut inner = self.inner.lock().await;
        if inner.log.queue_exists(queue) {
            self.ready_to_write(&mut inner).await?;
            let dropped = queue_bytes(&inner.log, queue, ..);
            if let Err(err) = inner.log.delete_queue(queue).await {
                return Err(self.failed_write(&mut inner, err).await);
            }
            self.backlog_bytes.fetch_sub(dropped, Ordering::AcqRel);
            self.mark_written();
        }
        inner.next_positions.remove(queue);
        Ok(())
    }

    /// fsyncs everything written so far (periodic persist, shutdown).
    pub async fn persist(&self) -> WalResult<()> {
        self.sync_through(self.written_seq.load(Ordering::Acquire))
            .await
    }

    /// Waits until operation `seq` is fsynced: joins the round in progress or runs the next
    /// one, which covers every operation written before it started.
    async fn sync_through(&self, seq: u64) -> WalResult<()> {
        if self.synced_seq.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        let mut state = self.sync_state.lock().await;
        if self.synced_seq.load(Ordering::Acquire) >= seq {
            return Ok(());
        }
        // Everything up to `target` has been flushed into files that exist now.
        let target = self.written_seq.load(Ordering::Acquire);
        self.sync_round(&mut state).await?;
        self.synced_seq.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// fsyncs every file (re-syncing them all is cheap when clean).
    async fn sync_all(&self) -> WalResult<()> {
        let mut state = self.sync_state.lock().await;
        let target = self.written_seq.load(Ordering::Acquire);
        self.sync_round(&mut state).await?;
        self.synced_seq.fetch_max(target, Ordering::AcqRel);
        Ok(())
    }

    /// One fsync round: the files numbered from the first one written since the last round
    /// (mrecordlog only ever writes to its newest file, and rolls over to higher numbers),
    /// and the directory when files appeared.
    async fn sync_round(&self, state: &mut SyncState) -> WalResult<()> {
        let dir = self.dir.clone();
        let first = state.first_unsynced_file;
        let known = state.known_files.clone();
        let files = tokio::task::spawn_blocking(move || -> std::io::Result<BTreeSet<u64>> {
            let mut files = BTreeSet::new();
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                if let Some(number) = wal_file_number(&entry.file_name().to_string_lossy()) {
                    files.insert(number);
                }
            }
            for &number in files.range(first..) {
                match std::fs::File::open(wal_file_path(&dir, number)) {
                    Ok(file) => file.sync_data()?,
                    // Garbage-collected meanwhile: nothing of it needs to be durable.
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(err),
                }
            }
            if files.iter().any(|number| !known.contains(number)) {
                std::fs::File::open(&dir)?.sync_all()?;
            }
            Ok(files)
        })
        .await
        .map_err(io)?
        .map_err(io)?;
        state.first_unsynced_file = files.last().copied().unwrap_or(0).max(first);
        state.known_files = files;
        self.sync_rounds.fetch_add(1, Ordering::Relaxed);
        metrics::WAL_FSYNCS.inc();
        Ok(())
    }

    /// fsync rounds done since open.
    pub fn sync_rounds(&self) -> u64 {
        self.sync_rounds.load(Ordering::Relaxed)
    }

    /// Bytes of the records appended and not yet truncated: what indexing has not published
    /// yet. Lock-free.
    pub fn backlog_bytes(&self) -> u64 {
        self.backlog_bytes.load(Ordering::Acquire)
    }

    /// Bytes mrecordlog holds in memory (records not yet truncated, plus its overhead).
    pub async fn memory_size(&self) -> usize {
        self.inner.lock().await.log.in_memory_size()
    }

    /// Bytes the WAL files use on disk.
    pub async fn disk_size(&self) -> usize {
        self.inner.lock().await.log.on_disk_size()
    }

    /// Holds the fsync rounds back while the guard lives (tests of group commit).
    #[cfg(test)]
    async fn hold_sync(&self) -> tokio::sync::MutexGuard<'_, SyncState> {
        self.sync_state.lock().await
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

    #[tokio::test]
    async fn backlog_counts_the_bytes_not_yet_truncated() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
                .await
                .unwrap();
            assert_eq!(wal.backlog_bytes(), 0);
            wal.ensure_queue("q", None).await.unwrap();
            wal.ensure_queue("r", None).await.unwrap();
            wal.append("q", &[b"aaaa", b"bb", b"c"]).await.unwrap();
            wal.append("r", &[b"12345"]).await.unwrap();
            assert_eq!(wal.backlog_bytes(), 12);
            wal.truncate("q", 1).await.unwrap();
            assert_eq!(wal.backlog_bytes(), 6);
        }
        // Recomputed at open.
        let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
            .await
            .unwrap();
        assert_eq!(wal.backlog_bytes(), 6);
        wal.delete_queue("r").await.unwrap();
        assert_eq!(wal.backlog_bytes(), 1);
    }

    #[tokio::test]
    async fn appends_reach_the_os_without_waiting_for_the_delayed_fsync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let wal = Wal::open(
                dir.path(),
                PersistPolicy::OnDelay(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
            wal.ensure_queue("q", None).await.unwrap();
            wal.append("q", &[b"acked"]).await.unwrap();
            // Dropped without persist(): as after a kill, only what reached the OS remains.
            std::mem::forget(wal);
        }
        let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
            .await
            .unwrap();
        assert_eq!(
            wal.read("q", 0, 10, 1 << 20).await.unwrap(),
            vec![(0, b"acked".to_vec())]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_appends_share_one_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::open(dir.path(), PersistPolicy::OnAppend)
            .await
            .unwrap();
        wal.ensure_queue("q", None).await.unwrap();
        let rounds_before = wal.sync_rounds();
        let hold = wal.hold_sync().await;
        let mut appends = Vec::new();
        for i in 0..20 {
            let wal = wal.clone();
            appends.push(tokio::spawn(async move {
                let doc = format!("doc{i}");
                wal.append("q", &[doc.as_bytes()]).await.unwrap()
            }));
        }
        // Every append reaches the OS while the fsync is held back: the log is not locked
        // by a waiting fsync.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while wal.read("q", 0, 100, 1 << 20).await.unwrap().len() < 20 {
            assert!(std::time::Instant::now() < deadline, "appends blocked");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            appends.iter().all(|a| !a.is_finished()),
            "acked before fsync"
        );
        drop(hold);
        for append in appends {
            append.await.unwrap();
        }
        // One round (the first waiter's) covered all twenty appends.
        assert_eq!(wal.sync_rounds() - rounds_before, 1);
    }
}
