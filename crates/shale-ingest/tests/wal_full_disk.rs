//! A WAL append that fails partway (the file system is full) leaves nothing behind: the
//! batch it refused never shows up later — not when the next append succeeds, not after a
//! reopen — and the WAL still opens. mrecordlog keeps the bytes its buffered writer could
//! not write and writes them with the next append; without recovery the refused batch came
//! back, under a position the next batch reused, and the reopen failed on the duplicate.
//!
//! The WAL lives on a small tmpfs (needs root; skipped with a warning elsewhere, a failure
//! under CI).

use std::time::Duration;

use shale_ingest::{PersistPolicy, Wal};
use shale_testkit::tmpfs::Tmpfs;

/// A batch of 16 records of 16 KiB, each starting with its batch number.
fn batch(n: u32) -> Vec<Vec<u8>> {
    (0..16u8)
        .map(|i| {
            let mut record = format!("batch {n:06} record {i:02} ").into_bytes();
            record.resize(16 << 10, b'a' + i % 26);
            record
        })
        .collect()
}

/// The batch number a record starts with.
fn batch_of(record: &[u8]) -> u32 {
    let text = String::from_utf8_lossy(&record[..12]);
    text["batch ".len()..]
        .trim()
        .parse()
        .expect("a batch number")
}

async fn contents(wal: &Wal) -> Vec<(u64, u32)> {
    wal.read("q", 0, usize::MAX, usize::MAX)
        .await
        .expect("the queue reads")
        .into_iter()
        .map(|(position, record)| (position, batch_of(&record)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_append_never_comes_back() {
    let scratch = tempfile::tempdir().expect("scratch");
    let Some(fs) = Tmpfs::mount(&scratch.path().join("fs"), "6m") else {
        return;
    };
    let dir = fs.path().join("queues");
    let policy = PersistPolicy::OnDelay(Duration::from_secs(3600));
    let wal = Wal::open(&dir, policy).await.expect("the WAL opens");
    wal.ensure_queue("q", None).await.expect("a queue");
    // Leave room for a few batches only.
    let ballast = fs.fill("ballast", 1 << 20);

    let mut accepted: Vec<u32> = Vec::new();
    let mut refused: Vec<u32> = Vec::new();
    let mut n = 0;
    while refused.len() < 3 {
        n += 1;
        assert!(n < 1_000, "the file system never filled up");
        let records = batch(n);
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        match wal.append("q", &refs).await {
            Ok(_) => accepted.push(n),
            Err(err) => {
                assert!(
                    err.nothing_appended(),
                    "a refused append says nothing was appended: {err}"
                );
                refused.push(n);
            }
        }
    }
    assert!(!accepted.is_empty(), "some batches fit");

    // Space comes back; the next appends succeed.
    std::fs::remove_file(&ballast).expect("ballast removed");
    for _ in 0..3 {
        n += 1;
        let records = batch(n);
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        wal.append("q", &refs)
            .await
            .expect("appends succeed once space is freed");
        accepted.push(n);
    }

    let check = |what: &str, contents: Vec<(u64, u32)>| {
        let positions: Vec<u64> = contents.iter().map(|(p, _)| *p).collect();
        let mut unique = positions.clone();
        unique.dedup();
        assert_eq!(positions, unique, "{what}: positions are unique");
        let mut batches: Vec<u32> = contents.iter().map(|(_, b)| *b).collect();
        batches.dedup();
        assert_eq!(
            batches, accepted,
            "{what}: exactly the accepted batches, in order (refused: {refused:?})"
        );
        assert_eq!(contents.len(), accepted.len() * 16, "{what}: every record");
    };
    check("in memory", contents(&wal).await);
    drop(wal);
    let wal = Wal::open(&dir, policy)
        .await
        .expect("the WAL reopens after a full disk");
    check("after a reopen", contents(&wal).await);
}
