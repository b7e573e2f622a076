//! The auth matrix: every route of the REST listener (the gate's table, the only way routes
//! are added) against no credentials, a wrong token, each role and the cluster secret; the
//! gRPC listener the same way; the internal API closed on a node with tokens and no cluster
//! secret; refusals counted in `/metrics`.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value::Value as OtlpValue, AnyValue};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use reqwest::Method;
use serde_json::Value;
use shale_config::{ApiToken, TokenRole};
use shale_server::auth::Access;

use crate::common::{config_in, TestNode};

const READER: &str = "reader-token-1";
const WRITER: &str = "writer-token-1";
const ADMIN: &str = "admin-token-12";
const SECRET: &str = "cluster-secret-1";

/// A node with one token of each role and a cluster secret.
async fn node_with_tokens(cluster_secret: Option<&str>) -> TestNode {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.api_tokens = [
        (READER, TokenRole::Reader),
        (WRITER, TokenRole::Writer),
        (ADMIN, TokenRole::Admin),
    ]
    .iter()
    .map(|(token, role)| ApiToken {
        token: token.to_string(),
        role: *role,
    })
    .collect();
    config.cluster.cluster_secret = cluster_secret.map(str::to_string);
    let mut node = TestNode::start_with(config).await;
    node.keep_dir(tmp);
    node
}

/// A concrete path for a route pattern: parameters name things that do not exist.
fn concrete(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|segment| {
            if segment.starts_with('{') {
                "no-such-thing"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[derive(Clone, Copy, Debug)]
enum Credential {
    Nothing,
    WrongToken,
    Role(TokenRole),
    ClusterSecret,
}

async fn call(
    node: &TestNode,
    method: &Method,
    path: &str,
    credential: Credential,
) -> (u16, Value) {
    let mut request = node
        .client
        .request(method.clone(), node.url(path))
        .header("content-type", "application/json");
    if *method != Method::GET {
        request = request.body("{}");
    }
    request = match credential {
        Credential::Nothing => request,
        Credential::WrongToken => request.bearer_auth("not-a-token-at-all"),
        Credential::Role(TokenRole::Reader) => request.bearer_auth(READER),
        Credential::Role(TokenRole::Writer) => request.bearer_auth(WRITER),
        Credential::Role(TokenRole::Admin) => request.bearer_auth(ADMIN),
        Credential::ClusterSecret => request.header("x-shale-cluster-secret", SECRET),
    };
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Whether `credential` may call a route needing `access`.
fn allowed(access: Access, credential: Credential) -> bool {
    match (access, credential) {
        (Access::Public, _) => true,
        (Access::Internal, credential) => matches!(credential, Credential::ClusterSecret),
        (_, Credential::Role(role)) => access.granted_to(role),
        _ => false,
    }
}

/// The refusal is in the route's API's own shape.
fn assert_shape(path: &str, status: u16, body: &Value) {
    if path.starts_with("/api/v1/_elastic") {
        assert_eq!(
            body["error"]["type"], "security_exception",
            "{path}: {body}"
        );
        assert_eq!(body["status"], status, "{path}: {body}");
    } else if path.starts_with("/prometheus/") {
        assert_eq!(body["status"], "error", "{path}: {body}");
        let expected = if status == 401 {
            "unauthorized"
        } else {
            "forbidden"
        };
        assert_eq!(body["errorType"], expected, "{path}: {body}");
    } else {
        assert!(body["message"].is_string(), "{path}: {body}");
    }
}

#[tokio::test]
async fn every_route_answers_each_credential_as_its_role_says() {
    let node = node_with_tokens(Some(SECRET)).await;
    let routes = shale_server::http::api_routes();
    let table = routes.table();
    assert!(
        table.len() > 80,
        "the table lists every route: {}",
        table.len()
    );
    // The write routes of remote write, OTLP and the internal API are in it.
    for (path, access) in [
        ("/prometheus/api/v1/write", Access::Write),
        ("/api/v1/otlp/v1/logs", Access::Write),
        ("/internal/v1/control/round", Access::Internal),
        ("/internal/v1/search/leaf", Access::Internal),
        ("/api/v1/_sql", Access::Read),
        ("/api/v1/{index_id}/delete-tasks", Access::Admin),
    ] {
        assert!(
            table.iter().any(|r| r.path == path && r.access == access),
            "{path} {access:?} missing"
        );
    }
    let credentials = [
        Credential::Nothing,
        Credential::WrongToken,
        Credential::Role(TokenRole::Reader),
        Credential::Role(TokenRole::Writer),
        Credential::Role(TokenRole::Admin),
        Credential::ClusterSecret,
    ];
    let mut checked = 0;
    for route in table {
        let path = concrete(&route.path);
        for credential in credentials {
            let (status, body) = call(&node, &route.method, &path, credential).await;
            let what = format!(
                "{} {} ({:?}) with {credential:?}: {status} {body}",
                route.method, route.path, route.access
            );
            if allowed(route.access, credential) {
                assert!(status != 401 && status != 403, "{what}");
            } else {
                let expected = match (route.access, credential) {
                    (Access::Internal, _) => 401,
                    (_, Credential::Role(_)) => 403,
                    _ => 401,
                };
                assert_eq!(status, expected, "{what}");
                assert_shape(&path, status, &body);
            }
            checked += 1;
        }
    }
    assert_eq!(checked, table.len() * credentials.len());
    // A path no route matches needs a token too (then it is a 404).
    let (status, _) = call(
        &node,
        &Method::GET,
        "/api/v1/nowhere/at/all",
        Credential::Nothing,
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = call(
        &node,
        &Method::GET,
        "/api/v1/nowhere/at/all",
        Credential::Role(TokenRole::Reader),
    )
    .await;
    assert_eq!(status, 404);
    // Refusals are counted.
    let metrics = node
        .client
        .get(node.url("/metrics"))
        .bearer_auth(READER)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused = |reason: &str| {
        let prefix = format!("shale_requests_refused_total{{reason=\"{reason}\"}} ");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        refused("unauthenticated") >= table.len() as f64,
        "{metrics}"
    );
    assert!(refused("forbidden") > 0.0);
    node.stop().await;
}

#[tokio::test]
async fn remote_write_and_ingest_need_a_writer_and_store_nothing_otherwise() {
    let node = node_with_tokens(Some(SECRET)).await;
    let series = "{\"timestamp\": 1700000000, \"message\": \"hello\"}\n";
    let mut index = node
        .client
        .post(node.url("/api/v1/indexes"))
        .bearer_auth(ADMIN);
    index = index.body(
        "version: 0.8\nindex_id: guarded\ndoc_mapping:\n  field_mappings:\n    - {name: timestamp, type: datetime, fast: true}\n    - {name: message, type: text}\n  timestamp_field: timestamp\n",
    );
    assert_eq!(index.send().await.unwrap().status().as_u16(), 200);
    for (token, expected) in [(None, 401), (Some(READER), 403), (Some(WRITER), 200)] {
        let mut request = node
            .client
            .post(node.url("/api/v1/guarded/ingest?commit=force"))
            .body(series);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        assert_eq!(request.send().await.unwrap().status().as_u16(), expected);
    }
    // Remote write without credentials: refused before the body is read.
    let response = node
        .client
        .post(node.url("/prometheus/api/v1/write"))
        .header("content-encoding", "snappy")
        .body(vec![0u8; 16])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    // The one writer's document is the only one there, and a writer cannot read it.
    let search = |token: &'static str| {
        node.client
            .get(node.url("/api/v1/guarded/search?query=*"))
            .bearer_auth(token)
            .send()
    };
    assert_eq!(search(WRITER).await.unwrap().status().as_u16(), 403);
    let body: Value = search(READER).await.unwrap().json().await.unwrap();
    assert_eq!(body["num_hits"], 1, "{body}");
    node.stop().await;
}

#[tokio::test]
async fn tokens_without_a_cluster_secret_close_the_internal_api() {
    let node = node_with_tokens(None).await;
    for credential in [Credential::Nothing, Credential::Role(TokenRole::Admin)] {
        let (status, body) = call(
            &node,
            &Method::POST,
            "/internal/v1/control/round",
            credential,
        )
        .await;
        assert_eq!(status, 403, "{body}");
        assert!(
            body["message"].as_str().unwrap().contains("cluster_secret"),
            "{body}"
        );
    }
    node.stop().await;
}

#[tokio::test]
async fn the_ui_login_tells_each_role_what_it_may_do() {
    let node = node_with_tokens(Some(SECRET)).await;
    for (token, role, may) in [
        (READER, "reader", [true, false, false]),
        (WRITER, "writer", [false, true, false]),
        (ADMIN, "admin", [true, true, true]),
    ] {
        let body: Value = node
            .client
            .get(node.url("/api/v1/auth"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["role"], role);
        assert_eq!(body["may"]["read"], may[0], "{body}");
        assert_eq!(body["may"]["write"], may[1], "{body}");
        assert_eq!(body["may"]["admin"], may[2], "{body}");
        // The version (the login's check) answers any role.
        let version = node
            .client
            .get(node.url("/api/v1/version"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(version.status().as_u16(), 200);
    }
    node.stop().await;
}

/// One OTLP/gRPC log export with `token` (if any).
async fn export_log(url: &str, token: Option<&str>) -> Result<(), tonic::Status> {
    let mut client = LogsServiceClient::connect(url.to_string()).await.unwrap();
    let mut request = tonic::Request::new(ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            scope_logs: vec![ScopeLogs {
                log_records: vec![LogRecord {
                    time_unix_nano: 1_700_000_000_000_000_000,
                    body: Some(AnyValue {
                        value: Some(OtlpValue::StringValue("over grpc".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
    });
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    client.export(request).await.map(|_| ())
}

#[tokio::test]
async fn otlp_grpc_needs_a_writer_token() {
    let node = node_with_tokens(Some(SECRET)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served: Arc<shale_server::Node> = node.node.clone();
    tokio::spawn(async move {
        shale_server::otlp_grpc::serve_grpc(served, listener, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    let code = |result: Result<(), tonic::Status>| result.err().map(|status| status.code());
    assert_eq!(
        code(export_log(&url, None).await),
        Some(tonic::Code::Unauthenticated)
    );
    assert_eq!(
        code(export_log(&url, Some("not-a-token-at-all")).await),
        Some(tonic::Code::Unauthenticated)
    );
    assert_eq!(
        code(export_log(&url, Some(READER)).await),
        Some(tonic::Code::PermissionDenied)
    );
    assert_eq!(code(export_log(&url, Some(WRITER)).await), None);
    let _ = stop.send(());
    node.stop().await;
}
