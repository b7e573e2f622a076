//! Storage against a real S3-compatible server (moto on loopback, started by the testkit).

use shale_storage::{S3Options, StorageError, StorageResolver};

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
