//! The conformance suite against SQLite (a fresh file per test), plus SQLite specifics.

use std::sync::Arc;

use shale_metastore::conformance::{self, Fixture};
use shale_metastore::{open_metastore, Metastore, NewMergeTask, SqliteMetastore};

async fn setup() -> Option<Fixture> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let metastore = SqliteMetastore::open(path.to_str().expect("utf-8 path"))
        .await
        .expect("open SQLite metastore");
    Some(Fixture::new(Arc::new(metastore)).with_guard(dir))
}

shale_metastore::metastore_conformance_tests!(setup);

#[tokio::test]
async fn open_creates_missing_directories_and_reopens_with_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nested/data/metastore.db");
    let path = path.to_str().expect("utf-8 path");
    {
        let metastore = SqliteMetastore::open(path).await.expect("open");
        metastore
            .create_index(conformance::index_config("logs"))
            .await
            .expect("create");
        metastore.close().await;
    }
    // Migrations are applied once; the data survives.
    let metastore = SqliteMetastore::open(path).await.expect("reopen");
    let index = metastore.index_metadata("logs").await.expect("index");
    assert_eq!(index.index_id(), "logs");
    // The file is in WAL mode.
    assert!(dir.path().join("nested/data/metastore.db-wal").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_opening_a_fresh_file_at_once_all_start() {
    // Several nodes of a cluster started together on one shared SQLite file: each applies the
    // pending migrations or finds them applied, none fails with "table already exists" or
    // "database is locked" (switching a fresh file to WAL mode).
    for _ in 0..20 {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("metastore.db");
        let path = path.to_str().expect("utf-8 path").to_string();
        let opens: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { SqliteMetastore::open(&path).await })
            })
            .collect();
        for open in opens {
            let metastore = open.await.expect("task").expect("open at once");
            assert!(metastore.list_indexes().await.expect("list").is_empty());
        }
    }
}

#[tokio::test]
async fn open_metastore_accepts_sqlite_uris_and_paths() {
    let dir = tempfile::tempdir().expect("temp dir");
    let uri = format!("sqlite://{}", dir.path().join("a.db").display());
    let plain = dir.path().join("b.db").display().to_string();
    for uri in [uri.as_str(), plain.as_str(), "sqlite::memory:", ":memory:"] {
        let metastore: Arc<dyn Metastore> = open_metastore(uri).await.expect(uri);
        metastore
            .create_index(conformance::index_config("logs"))
            .await
            .expect(uri);
        assert_eq!(metastore.list_indexes().await.expect(uri).len(), 1, "{uri}");
    }
    assert!(dir.path().join("a.db").exists());
    assert!(dir.path().join("b.db").exists());
}

#[tokio::test]
async fn two_handles_on_one_file_serialize_their_publishes() {
    // Two metastores on one file stand for two processes: `BEGIN IMMEDIATE` must serialize
    // them where the in-process mutex cannot.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    let first: Arc<dyn Metastore> = Arc::new(SqliteMetastore::open(path).await.expect("open"));
    let second: Arc<dyn Metastore> = Arc::new(SqliteMetastore::open(path).await.expect("open"));
    let index = first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    let uid = index.index_uid.clone();
    let splits = ["input", "out-1", "out-2"]
        .iter()
        .map(|id| conformance::split_metadata(&uid, id))
        .collect();
    first.stage_splits(&uid, splits).await.expect("stage");
    first
        .publish_splits(&uid, &["input".to_string()], &[], None)
        .await
        .expect("publish input");
    let race = |metastore: Arc<dyn Metastore>, output: &str| {
        let uid = uid.clone();
        let output = output.to_string();
        tokio::spawn(async move {
            metastore
                .publish_splits(&uid, &[output], &["input".to_string()], None)
                .await
        })
    };
    let a = race(first.clone(), "out-1");
    let b = race(second.clone(), "out-2");
    let results = [a.await.expect("task"), b.await.expect("task")];
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handles_on_one_file_never_claim_one_merge_task_twice() {
    // As above: two handles stand for two processes claiming from one file.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    let first: Arc<dyn Metastore> = Arc::new(SqliteMetastore::open(path).await.expect("open"));
    let second: Arc<dyn Metastore> = Arc::new(SqliteMetastore::open(path).await.expect("open"));
    let index = first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    let uid = index.index_uid.clone();
    let split_ids: Vec<String> = (0..16).map(|i| format!("split-{i:02}")).collect();
    let splits = split_ids
        .iter()
        .map(|id| conformance::split_metadata(&uid, id))
        .collect();
    first.stage_splits(&uid, splits).await.expect("stage");
    first
        .publish_splits(&uid, &split_ids, &[], None)
        .await
        .expect("publish");
    let tasks = split_ids
        .chunks(2)
        .map(|pair| NewMergeTask::new(conformance::scope_of(&uid, None), pair.to_vec()))
        .collect();
    let created = first
        .create_merge_tasks(&uid, tasks, 3)
        .await
        .expect("create_merge_tasks");
    assert_eq!(created.len(), 8);

    let claimers: Vec<_> = (0..16)
        .map(|i| {
            let metastore = if i % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            tokio::spawn(async move {
                metastore
                    .claim_merge_task(&format!("node-{i}"), 3600, 1_000_000, None, None, false)
                    .await
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for claimer in claimers {
        if let Some(task) = claimer.await.expect("task").expect("claim") {
            claimed.push(task.task_id);
        }
    }
    claimed.sort();
    let mut expected: Vec<String> = created.into_iter().map(|t| t.task_id).collect();
    expected.sort();
    assert_eq!(claimed, expected);
}

#[tokio::test]
async fn open_metastore_rejects_unknown_schemes() {
    for uri in ["mysql://localhost/db", "s3://bucket/metastore"] {
        match open_metastore(uri).await {
            Err(shale_metastore::MetastoreError::Db(message)) => {
                assert!(message.contains("unsupported"), "{message}")
            }
            Err(err) => panic!("{uri}: unexpected error {err}"),
            Ok(_) => panic!("{uri}: opened"),
        }
    }
}

/// A full disk fails the writes that need space — and nothing else, for no longer than the
/// disk is full: once space is freed every connection of the pool works again (a failed
/// `COMMIT` used to leave its connection inside the transaction, and every later write on it
/// failed until a restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resume_once_a_full_disk_has_room_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(fs) = shale_testkit::tmpfs::Tmpfs::mount(&dir.path().join("fs"), "4m") else {
        return;
    };
    let path = fs.path().join("metastore.db");
    let metastore = SqliteMetastore::open(path.to_str().expect("utf-8 path"))
        .await
        .expect("open");
    let logs = metastore
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create")
        .index_uid;
    let ballast = fs.fill("ballast", 0);
    let query = |i: usize| shale_types::DeleteQuery {
        query: format!("body:{}", "x".repeat(2000 + i)),
        ..Default::default()
    };
    let mut failures = 0;
    for i in 0..64 {
        if metastore
            .create_delete_task(&logs, query(i), 1)
            .await
            .is_err()
        {
            failures += 1;
        }
    }
    assert!(failures > 0, "the disk never filled up");
    std::fs::remove_file(&ballast).expect("free space");
    // Every connection of the pool (several writes and reads in parallel) works again.
    for round in 0..4 {
        let writes =
            (0..8).map(|i| metastore.create_delete_task(&logs, query(100 + round * 8 + i), 2));
        for result in futures::future::join_all(writes).await {
            result.expect("writes work again once space is freed");
        }
        let reads = (0..8).map(|_| metastore.index_metadata("logs"));
        for result in futures::future::join_all(reads).await {
            result.expect("reads work");
        }
    }
    metastore
        .create_index(conformance::index_config("other"))
        .await
        .expect("a new index after the disk was full");
}

/// The version of `logs` written straight into the file by a connection that is not a
/// metastore (no Shale process writes so; it shows whether a metastore reads the row again).
async fn bump_behind_its_back(path: &str) {
    let raw = sqlx::SqlitePool::connect(&format!("sqlite://{path}"))
        .await
        .expect("raw connection");
    sqlx::query("UPDATE indexes SET version = version + 100 WHERE index_id = 'logs'")
        .execute(&raw)
        .await
        .expect("raw update");
    raw.close().await;
}

#[tokio::test]
async fn a_process_alone_answers_versions_from_memory_and_another_sees_every_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    let first = SqliteMetastore::open(path).await.expect("open");
    let index = first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    let uid = index.index_uid.clone();
    let v0 = first.index_version("logs").await.expect("version");

    // Alone, it does not read the row again between its own writes...
    bump_behind_its_back(path).await;
    assert_eq!(first.index_version("logs").await.expect("version"), v0);
    // ...and reads it after each of them.
    first
        .stage_splits(&uid, vec![conformance::split_metadata(&uid, "a")])
        .await
        .expect("stage");
    let v1 = first.index_version("logs").await.expect("version");
    assert_eq!(v1.version, v0.version + 101);

    // A second process joins the file: the first no longer answers from memory, so the
    // second's writes are seen by the first's next read, and the other way round.
    let second = SqliteMetastore::open(path).await.expect("open second");
    second
        .publish_splits(&uid, &["a".to_string()], &[], None)
        .await
        .expect("publish from the second");
    let v2 = first.index_version("logs").await.expect("version");
    assert_eq!(v2.version, v1.version + 1);
    assert_eq!(second.index_version("logs").await.expect("version"), v2);
    bump_behind_its_back(path).await;
    assert_eq!(
        first.index_version("logs").await.expect("version").version,
        v2.version + 100
    );
    first
        .mark_splits_for_deletion(&uid, &["a".to_string()])
        .await
        .expect("mark from the first");
    assert_eq!(
        second.index_version("logs").await.expect("version").version,
        v2.version + 101
    );

    // Deleting the index is seen at once by the process that cached its version.
    drop(second);
    first.delete_index(&uid).await.expect("delete");
    assert!(first.index_version("logs").await.is_err());
}

#[tokio::test]
async fn a_process_alone_after_the_others_exit_answers_from_memory_again_on_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    {
        let first = SqliteMetastore::open(path).await.expect("open");
        let second = SqliteMetastore::open(path).await.expect("open");
        first
            .create_index(conformance::index_config("logs"))
            .await
            .expect("create");
        assert!(second.index_version("logs").await.is_ok());
        first.close().await;
        second.close().await;
    }
    // Both gone (their shared locks released): a new process finds itself alone.
    let alone = SqliteMetastore::open(path).await.expect("reopen");
    let v0 = alone.index_version("logs").await.expect("version");
    bump_behind_its_back(path).await;
    assert_eq!(alone.index_version("logs").await.expect("version"), v0);
}

/// `second` sees a write of `first` at once, and `first` one of `second`, each after having
/// read (and maybe kept) the version the other then changes; `split` names the split they
/// write.
async fn each_sees_the_others_writes_at_once(
    first: &SqliteMetastore,
    second: &SqliteMetastore,
    uid: &shale_types::IndexUid,
    split: &str,
) {
    let v0 = first.index_version("logs").await.expect("version");
    assert_eq!(second.index_version("logs").await.expect("version"), v0);
    second
        .stage_splits(uid, vec![conformance::split_metadata(uid, split)])
        .await
        .expect("stage from the second");
    let v1 = first.index_version("logs").await.expect("version");
    assert_eq!(
        v1.version,
        v0.version + 1,
        "the first sees the second's write"
    );
    assert_eq!(second.index_version("logs").await.expect("version"), v1);
    first
        .publish_splits(uid, &[split.to_string()], &[], None)
        .await
        .expect("publish from the first");
    let v2 = second.index_version("logs").await.expect("version");
    assert_eq!(
        v2.version,
        v1.version + 1,
        "the second sees the first's write"
    );
    assert_eq!(first.index_version("logs").await.expect("version"), v2);
    second
        .mark_splits_for_deletion(uid, &[split.to_string()])
        .await
        .expect("mark from the second");
    assert_eq!(
        first.index_version("logs").await.expect("version").version,
        v2.version + 1,
        "the first sees the second's second write"
    );
}

#[tokio::test]
async fn a_second_process_through_a_symlink_is_seen_by_the_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let first = SqliteMetastore::open(path.to_str().expect("utf-8 path"))
        .await
        .expect("open");
    let index = first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&path, &link).expect("symlink");
    // Through the link, and through a spelling with `.` and `..` in it.
    let second = SqliteMetastore::open(link.to_str().expect("utf-8 path"))
        .await
        .expect("open through the link");
    each_sees_the_others_writes_at_once(&first, &second, &index.index_uid, "a").await;
    let spelled = dir.path().join("sub").join("..").join(".").join("link.db");
    std::fs::create_dir(dir.path().join("sub")).expect("sub dir");
    let third = SqliteMetastore::open(&format!("sqlite://{}", spelled.display()))
        .await
        .expect("open through another spelling");
    each_sees_the_others_writes_at_once(&third, &first, &index.index_uid, "b").await;
    each_sees_the_others_writes_at_once(&second, &third, &index.index_uid, "c").await;
}

#[tokio::test]
async fn processes_on_a_removed_users_file_see_each_others_writes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    let first = SqliteMetastore::open(path).await.expect("open");
    let index = first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    // The first is alone and keeps versions; then its users file goes.
    first.index_version("logs").await.expect("version");
    std::fs::remove_file(format!("{path}-users")).expect("remove the users file");
    // The second makes a new users file, on which it is alone for all it can tell.
    let second = SqliteMetastore::open(path).await.expect("open second");
    each_sees_the_others_writes_at_once(&first, &second, &index.index_uid, "a").await;
    each_sees_the_others_writes_at_once(&second, &first, &index.index_uid, "b").await;

    // The same when the second reads (and keeps) a version before the first does anything.
    drop(second);
    std::fs::remove_file(format!("{path}-users")).expect("remove the users file again");
    let second = SqliteMetastore::open(path)
        .await
        .expect("open second again");
    let v0 = second.index_version("logs").await.expect("version");
    first
        .stage_splits(
            &index.index_uid,
            vec![conformance::split_metadata(&index.index_uid, "c")],
        )
        .await
        .expect("stage from the first");
    assert_eq!(
        second.index_version("logs").await.expect("version").version,
        v0.version + 1,
        "the second sees the first's write"
    );
}

/// What answering versions from memory saves: `index_version` alone on the file (from
/// memory) and with another process on it (the row read). Prints both; run with
/// `--nocapture` to see them.
#[tokio::test]
async fn index_version_from_memory_and_from_the_row_timed() {
    const CALLS: u32 = 2000;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("metastore.db");
    let path = path.to_str().expect("utf-8 path");
    let first = SqliteMetastore::open(path).await.expect("open");
    first
        .create_index(conformance::index_config("logs"))
        .await
        .expect("create");
    let time = |label: &'static str| {
        let first = &first;
        async move {
            first.index_version("logs").await.expect("version");
            let start = std::time::Instant::now();
            for _ in 0..CALLS {
                first.index_version("logs").await.expect("version");
            }
            let per_call = start.elapsed() / CALLS;
            eprintln!("index_version {label}: {per_call:?} per call");
            per_call
        }
    };
    let from_memory = time("alone (from memory)").await;
    let _second = SqliteMetastore::open(path).await.expect("open second");
    let from_row = time("not alone (row read)").await;
    eprintln!(
        "index_version: from memory {:.1}x faster",
        from_row.as_secs_f64() / from_memory.as_secs_f64().max(1e-9)
    );
}

#[tokio::test]
async fn the_default_metastore_uri_of_any_data_dir_opens_a_file_in_it() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for name in [
        "odd%41dir",
        "what?mode=ro",
        "hash#tag",
        "with space",
        "données-日本",
        "100%",
    ] {
        let data_dir = tmp.path().join(name);
        let uri = shale_config::NodeConfig::default_metastore_uri(&data_dir);
        let metastore = open_metastore(&uri)
            .await
            .unwrap_or_else(|err| panic!("{name}: {uri}: {err}"));
        metastore
            .create_index(conformance::index_config("logs"))
            .await
            .expect("create");
        assert!(
            data_dir.join("metastore.db").is_file(),
            "{name}: {uri} put the metastore elsewhere"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("list")
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "100%",
            "données-日本",
            "hash#tag",
            "odd%41dir",
            "what?mode=ro",
            "with space"
        ]
    );
}
