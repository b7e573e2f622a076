//! A split written to the local file system is durable before `put_file` returns: its data
//! is fsynced before the rename that makes it visible, and the directory is fsynced after it
//! (new directories on the way included). Checked on the system calls, under strace.

use shale_storage::{LocalStorage, Storage};

#[tokio::test]
async fn local_put_file_fsyncs_the_file_then_the_directory() {
    if let Some(scratch) = shale_testkit::strace::is_child() {
        let root = LocalStorage::open(&scratch.join("root")).unwrap();
        let src = scratch.join("src.split");
        std::fs::write(&src, vec![42u8; 1 << 20]).unwrap();
        root.child("my-index")
            .put_file("0001.split", &src)
            .await
            .unwrap();
        return;
    }
    let scratch = tempfile::tempdir().unwrap();
    let scratch_path = scratch.path().canonicalize().unwrap();
    let Some(trace) = shale_testkit::strace::trace_test(
        "local_put_file_fsyncs_the_file_then_the_directory",
        &scratch_path,
    ) else {
        return;
    };
    let index_dir = scratch_path.join("root/my-index");
    let dest = index_dir.join("0001.split");
    assert_eq!(std::fs::read(&dest).unwrap().len(), 1 << 20);
    let rename = trace
        .find(
            0,
            &["rename", "renameat", "renameat2"],
            &format!("\"{}\"", dest.display()),
        )
        .unwrap_or_else(|| panic!("no rename to {}: {:#?}", dest.display(), trace.calls));
    // The temporary file's data is synced before it becomes the object.
    let tmp_synced = trace.calls[..rename].iter().any(|call| {
        matches!(call.name.as_str(), "fsync" | "fdatasync")
            && call
                .line
                .contains(&format!("<{}/.0001.split.", index_dir.display()))
    });
    assert!(
        tmp_synced,
        "file not fsynced before the rename: {:#?}",
        trace.calls
    );
    // The directory entry is synced after the rename.
    assert!(
        trace.synced_between(&index_dir, rename + 1..trace.calls.len()),
        "directory not fsynced after the rename: {:#?}",
        trace.calls
    );
    // The new index directory was made durable in its parent.
    assert!(
        trace.synced_between(&scratch_path.join("root"), 0..rename),
        "new directory's parent not fsynced: {:#?}",
        trace.calls
    );
}
