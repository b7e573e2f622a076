//! Storage against a real S3-compatible server (moto on loopback, started by the testkit).

use std::time::{Duration, Instant};

use shale_storage::{S3Options, StorageError, StorageResolver};
use shale_testkit::fault_proxy::{Fault, FaultProxy, FaultRule, RequestKind};

#[tokio::test]
async fn s3_storage_round_trips_large_files() {
    let Some((endpoint, bucket)) = shale_testkit::s3::test_bucket() else {
        return;
    };
    let resolver = StorageResolver::new(S3Options {
        endpoint: Some(endpoint),
        region: Some("us-east-1".into()),
        access_key_id: Some(shale_testkit::s3::ACCESS_KEY.into()),
        secret_access_key: Some(shale_testkit::s3::SECRET_KEY.into()),
        force_path_style: Some(true),
        allow_http: Some(true),
        ..Default::default()
    });
    let storage = resolver
        .resolve(&format!("s3://{bucket}/indexes"))
        .unwrap()
        .child("logs");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("big.split");
    // larger than one multipart chunk
    let data: Vec<u8> = (0..(9 * 1024 * 1024 + 123))
        .map(|i| (i % 251) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    storage.put_file("x.split", &src).await.unwrap();
    assert_eq!(storage.list().await.unwrap(), vec!["x.split".to_string()]);
    let dest = dir.path().join("back.split");
    assert_eq!(
        storage.get_to_file("x.split", &dest).await.unwrap(),
        data.len() as u64
    );
    assert_eq!(std::fs::read(&dest).unwrap(), data);
    assert_eq!(
        storage
            .get_bytes("x.split")
            .await
            .unwrap()
            .slice(10..20)
            .as_ref(),
        &data[10..20]
    );
    storage.delete("x.split").await.unwrap();
    assert!(!storage.exists("x.split").await.unwrap());
    assert!(matches!(
        storage.get_bytes("x.split").await,
        Err(StorageError::NotFound(_))
    ));
}

/// A request S3 accepts but never answers costs seconds, not the client's 30 s request
/// timeout: the attempt fails as a timeout once its answer is late, and is retried — a GET
/// that was never answered, and a PUT whose answer was lost after the object was written.
#[tokio::test]
async fn a_request_never_answered_is_retried_within_seconds() {
    let Some((endpoint, bucket)) = shale_testkit::s3::test_bucket() else {
        return;
    };
    let proxy = FaultProxy::start(&endpoint).unwrap();
    let resolver = StorageResolver::new(S3Options {
        endpoint: Some(proxy.endpoint()),
        region: Some("us-east-1".into()),
        access_key_id: Some(shale_testkit::s3::ACCESS_KEY.into()),
        secret_access_key: Some(shale_testkit::s3::SECRET_KEY.into()),
        force_path_style: Some(true),
        allow_http: Some(true),
        ..Default::default()
    });
    let storage = resolver.resolve(&format!("s3://{bucket}/held")).unwrap();
    storage.put_bytes("a", b"hello".to_vec()).await.unwrap();
    proxy.add_rule(FaultRule::next(&[RequestKind::GetObject], Fault::Hold, 1));
    proxy.add_rule(FaultRule::next(
        &[RequestKind::PutObject],
        Fault::HoldAfterForward,
        1,
    ));
    let started = Instant::now();
    assert_eq!(storage.get_bytes("a").await.unwrap().as_ref(), b"hello");
    let get = started.elapsed();
    storage.put_bytes("b", b"world".to_vec()).await.unwrap();
    let put = started.elapsed() - get;
    assert_eq!(storage.get_bytes("b").await.unwrap().as_ref(), b"world");
    let stats = proxy.stats();
    eprintln!("held GET answered after {get:?}, held PUT after {put:?}; {stats}");
    assert_eq!(stats.total_injected(), 2);
    assert_eq!(stats.total_retries(), 2);
    assert!(get < Duration::from_secs(20), "{get:?}");
    assert!(put < Duration::from_secs(20), "{put:?}");
}
