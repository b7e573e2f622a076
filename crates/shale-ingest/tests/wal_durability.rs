//! The WAL fsyncs every file written since the last fsync, not only the newest one: appends
//! that made mrecordlog roll over to a new file leave data in the previous file too, and a
//! power loss must not take it. Checked on the system calls, under strace.

use std::time::Duration;

use shale_ingest::{PersistPolicy, Wal};

/// mrecordlog's WAL files are 128 MiB.
const ROLL_BYTES: usize = 128 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_round_covers_the_files_rolled_over_since_the_last_one() {
    if let Some(scratch) = shale_testkit::strace::is_child() {
        let wal = Wal::open(
            &scratch.join("queues"),
            PersistPolicy::OnDelay(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
        wal.ensure_queue("q", None).await.unwrap();
        let record = vec![b'x'; 1 << 20];
        let batch: Vec<&[u8]> = (0..8).map(|_| record.as_slice()).collect();
        for _ in 0..(ROLL_BYTES / (8 << 20) + 2) {
            wal.append("q", &batch).await.unwrap();
        }
        // A marker in the trace: the fsync round of interest comes after it.
        std::fs::write(scratch.join("marker-a"), b"").unwrap();
        std::fs::rename(scratch.join("marker-a"), scratch.join("marker-b")).unwrap();
        wal.persist().await.unwrap();
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let scratch_path = scratch.path().canonicalize().unwrap();
    let Some(trace) = shale_testkit::strace::trace_test(
        "an_fsync_round_covers_the_files_rolled_over_since_the_last_one",
        &scratch_path,
    ) else {
        return;
    };
    let queues = scratch_path.join("queues");
    let first = queues.join(format!("wal-{:020}", 0));
    let second = queues.join(format!("wal-{:020}", 1));
    assert!(
        second.exists(),
        "the appends did not roll over to a second file"
    );
    let marker = trace
        .find(0, &["rename", "renameat", "renameat2"], "marker-b")
        .expect("marker rename traced");
    let end = trace.calls.len();
    assert!(
        trace.synced_between(&second, marker..end),
        "the file being written was not fsynced: {:#?}",
        &trace.calls[marker..]
    );
    assert!(
        trace.synced_between(&first, marker..end),
        "the file rolled over from was not fsynced: {:#?}",
        &trace.calls[marker..]
    );
    assert!(
        trace.synced_between(&queues, marker..end),
        "the directory holding a new WAL file was not fsynced: {:#?}",
        &trace.calls[marker..]
    );
}
