//! The conformance suite against PostgreSQL: a fresh database per test, on the server of
//! `shale_testkit::postgres` (`SHALE_TEST_POSTGRES_URL`, or a private cluster). Without a
//! server the tests are skipped, except under CI where that is a failure.

use std::sync::Arc;

use shale_metastore::conformance::{self, Fixture};
use shale_metastore::{open_metastore, PostgresMetastore};

async fn setup() -> Option<Fixture> {
    let url = shale_testkit::postgres::test_database_url().await?;
    let metastore = PostgresMetastore::connect(&url)
        .await
        .expect("connect to PostgreSQL metastore");
    Some(Fixture::new(Arc::new(metastore)))
}

shale_metastore::metastore_conformance_tests!(setup);

#[tokio::test]
async fn open_metastore_selects_postgres_and_migrations_are_idempotent() {
    let Some(url) = shale_testkit::postgres::test_database_url().await else {
        return;
    };
    let postgresql_url = url.replacen("postgres://", "postgresql://", 1);
    for uri in [url.as_str(), postgresql_url.as_str()] {
        let metastore = open_metastore(uri).await.expect("open_metastore");
        if metastore.list_indexes().await.expect("list").is_empty() {
            metastore
                .create_index(conformance::index_config("logs"))
                .await
                .expect("create");
        }
    }
    // Nodes starting together apply migrations once.
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresMetastore::connect(&url).await.map(|_| ()) })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("connect");
    }
    let metastore = open_metastore(&url).await.expect("open_metastore");
    assert_eq!(metastore.list_indexes().await.expect("list").len(), 1);
}
