//! Secrets stay secret: a metastore password, an S3 secret key and an API token given to
//! `shale run` never appear in its logs (even at debug level), in `--print-config`, in error
//! messages, or in `/metrics`.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common;

const PG_PASSWORD: &str = "pg-Sup3rSecret-4711";
const PG_QUERY_PASSWORD: &str = "pg-QuerySecret-1234";
const S3_SECRET: &str = "s3-V3rySecret-0815";
const API_TOKEN: &str = "api-T0kenSecret-2718";

fn assert_no_secret(what: &str, text: &str) {
    for secret in [PG_PASSWORD, PG_QUERY_PASSWORD, S3_SECRET, API_TOKEN] {
        assert!(
            !text.contains(secret),
            "{what} shows a secret ({secret}):\n{text}"
        );
    }
}

/// `postgres://user@host[/db]` with a password (trust authentication ignores it).
fn with_password(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (userinfo, host) = rest.split_once('@').expect("a user in the URL");
    let user = userinfo.split(':').next().unwrap_or(userinfo);
    format!("{scheme}://{user}:{PG_PASSWORD}@{host}")
}

fn node_config_file(dir: &std::path::Path, metastore_uri: &str) -> std::path::PathBuf {
    let path = dir.join("node.yaml");
    std::fs::write(
        &path,
        format!(
            "metastore_uri: \"{metastore_uri}\"\ns3:\n  endpoint: http://127.0.0.1:9\n  access_key_id: AKIDEXAMPLE\n  secret_access_key: {S3_SECRET}\n"
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn secrets_never_appear_in_logs_dumps_errors_or_metrics() {
    let tmp = tempfile::tempdir().unwrap();

    // --print-config: redacted.
    let unreachable =
        format!("postgres://shale:{PG_PASSWORD}@127.0.0.1:1/shale?password={PG_QUERY_PASSWORD}");
    let config = node_config_file(tmp.path(), &unreachable);
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args([
            "run",
            "--print-config",
            "--api-token",
            API_TOKEN,
            "--config",
        ])
        .arg(&config)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let dump = String::from_utf8_lossy(&output.stdout);
    assert_no_secret("--print-config", &dump);
    assert!(
        dump.contains("postgres://shale:***@127.0.0.1:1/shale?password=***"),
        "{dump}"
    );
    assert!(
        dump.contains("secret_access_key: '***'") || dump.contains("secret_access_key: ***"),
        "{dump}"
    );
    assert!(
        dump.contains("api_token: '***'") || dump.contains("api_token: ***"),
        "{dump}"
    );

    let Some(database) = shale_testkit::postgres::test_database_url().await else {
        return;
    };
    // A metastore that refuses the connection (no such database): a clear error, without
    // the password.
    let (server, _) = database.rsplit_once('/').expect("a database in the URL");
    let missing = format!("{}/no_such_database", with_password(server));
    let config = node_config_file(tmp.path(), &missing);
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(["run", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .env("SHALE_LOG", "debug")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_no_secret("the startup error", &stderr);
    assert!(stderr.contains("no_such_database"), "{stderr}");

    // A running node on PostgreSQL with a password in its URI, logging at debug level.
    let config = node_config_file(tmp.path(), &with_password(&database));
    let port = shale_testkit::free_port();
    let log_path = tmp.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_shale"))
        .args(["run", "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("SHALE_LOG", "debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let node = common::NodeProcess {
        child,
        base: format!("http://127.0.0.1:{port}"),
    };
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    common::wait_ready(&client, &node.base).await;
    let resp = client
        .post(format!("{}/api/v1/indexes", node.base))
        .body(common::kill_test_index("secret-logs", ""))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let resp = client
        .post(format!(
            "{}/api/v1/secret-logs/ingest?commit=force",
            node.base
        ))
        .body("{\"ts\": 1700000000, \"doc_id\": \"a\", \"body\": \"hello\"}\n")
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let metrics = client
        .get(format!("{}/metrics", node.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("shale_splits"), "{metrics}");
    assert_no_secret("/metrics", &metrics);
    drop(node);
    let logs = std::fs::read_to_string(&log_path).unwrap();
    assert!(logs.contains("starting node"), "{logs}");
    assert!(logs.contains(":***@"), "the redacted URI is logged: {logs}");
    // In the startup summary line.
    assert!(
        logs.lines().any(|line| line.contains("starting node")
            && line.contains("metastore=postgres://")
            && line.contains(":***@")),
        "{logs}"
    );
    assert_no_secret("the node's logs", &logs);
}
