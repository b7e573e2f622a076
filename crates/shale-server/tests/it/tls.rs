//! TLS and mutual TLS on every listener, with certificates made here (rcgen): REST over
//! HTTPS, client certificates checked against the CA, OTLP/gRPC over TLS, the plaintext
//! health listener, certificates reloaded without a restart (the listeners' and the internal
//! client's), and node-to-node calls over mutual TLS.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{config_in, TestNode};
use opentelemetry_proto::tonic::collector::logs::v1::logs_service_client::LogsServiceClient;
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as OtlpValue;
use opentelemetry_proto::tonic::common::v1::AnyValue;
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use shale_config::{ClusterConfig, NodeConfig, TlsConfig};
use shale_testkit::pki::Ca;

/// The files of a node's TLS: the CA, the node's certificate and key, in `dir`.
struct Pki {
    ca: Ca,
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Pki {
        let ca = Ca::new("shale test CA");
        std::fs::write(dir.join("ca.pem"), ca.pem()).unwrap();
        let (cert, key) = ca.leaf("node-one", 1);
        std::fs::write(dir.join("cert.pem"), cert).unwrap();
        std::fs::write(dir.join("key.pem"), key).unwrap();
        Pki {
            ca,
            dir: dir.to_path_buf(),
        }
    }

    fn tls(&self, verify_client_cert: bool) -> TlsConfig {
        TlsConfig {
            cert_path: self.dir.join("cert.pem"),
            key_path: self.dir.join("key.pem"),
            ca_path: Some(self.dir.join("ca.pem")),
            verify_client_cert,
        }
    }

    /// A reqwest client trusting the CA, presenting `identity` (cert, key) if given.
    fn client(&self, identity: Option<&(String, String)>) -> reqwest::Client {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.pem().as_bytes()).unwrap())
            .timeout(Duration::from_secs(120));
        if let Some((cert, key)) = identity {
            let pem = format!("{key}\n{cert}");
            builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
        }
        builder.build().unwrap()
    }
}

/// A node whose REST listener has `tls`, reached over HTTPS by a client trusting the CA and
/// presenting `identity`.
async fn tls_node(
    mut config: NodeConfig,
    pki: &Pki,
    verify_client_cert: bool,
    identity: Option<&(String, String)>,
) -> TestNode {
    config.rest.tls = Some(pki.tls(verify_client_cert));
    let mut node = TestNode::start_with(config).await;
    node.base = node.base.replace("http://", "https://");
    node.client = pki.client(identity);
    node
}

async fn livez(client: &reqwest::Client, url: &str) -> Result<u16, reqwest::Error> {
    Ok(client
        .get(format!("{url}/health/livez"))
        .send()
        .await?
        .status()
        .as_u16())
}

#[tokio::test]
async fn rest_over_tls_serves_the_api_and_refuses_plain_http() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let node = tls_node(config_in(&tmp.path().join("node")), &pki, false, None).await;
    assert_eq!(livez(&node.client, &node.base).await.unwrap(), 200);
    node.create_index(common::LOGS_INDEX).await;
    node.ingest(
        "logs",
        &common::log_docs(0, 20, 1_700_000_000, "api"),
        "force",
    )
    .await;
    assert_eq!(node.count("logs", "*").await, 20);
    // Plain HTTP to the TLS port gets no answer.
    let plain = node.base.replace("https://", "http://");
    let result = livez(&reqwest::Client::new(), &plain).await;
    assert!(result.is_err(), "plain http answered: {result:?}");
    // Nor does a client that does not trust the CA.
    let untrusting = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(
            reqwest::Certificate::from_pem(Ca::new("another CA").pem().as_bytes()).unwrap(),
        )
        .build()
        .unwrap();
    assert!(livez(&untrusting, &node.base).await.is_err());
    node.stop().await;
}

#[tokio::test]
async fn mutual_tls_wants_a_client_certificate_of_the_ca() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let client_cert = pki.ca.leaf("client", 10);
    let node = tls_node(
        config_in(&tmp.path().join("node")),
        &pki,
        true,
        Some(&client_cert),
    )
    .await;
    assert_eq!(livez(&node.client, &node.base).await.unwrap(), 200);
    let (status, body) = node.get("/api/v1/indexes").await;
    assert_eq!(status, 200, "{body}");
    // No client certificate: refused.
    let result = livez(&pki.client(None), &node.base).await;
    assert!(
        result.is_err(),
        "answered without a client cert: {result:?}"
    );
    // A certificate of another CA: refused.
    let stranger = Ca::new("another CA").leaf("intruder", 11);
    let result = livez(&pki.client(Some(&stranger)), &node.base).await;
    assert!(result.is_err(), "answered a cert of another CA: {result:?}");
    node.stop().await;
}

#[tokio::test]
async fn otlp_grpc_over_mutual_tls_ingests_searchable_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let mut config = config_in(&tmp.path().join("node"));
    config.grpc.tls = Some(pki.tls(true));
    let node = TestNode::start_with(config).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(shale_server::otlp_grpc::serve_grpc(
        node.node.clone(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let (cert, key) = pki.ca.leaf("collector", 20);
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pki.ca.pem()))
        .domain_name("localhost")
        .identity(tonic::transport::Identity::from_pem(cert, key));
    let channel = tonic::transport::Channel::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let now = u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos()).unwrap();
    let response = LogsServiceClient::new(channel)
        .export(ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs {
                    log_records: vec![LogRecord {
                        time_unix_nano: now,
                        body: Some(AnyValue {
                            value: Some(OtlpValue::StringValue("over tls".to_string())),
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(response.partial_success.is_none(), "{response:?}");
    let (status, body) = node
        .post("/api/v1/otel-logs-v0_9/ingest?commit=force", "")
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(node.count("otel-logs-v0_9", "body.message:tls").await, 1);

    // Without a client certificate, the export is refused.
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pki.ca.pem()))
        .domain_name("localhost");
    let refused = async {
        let channel = tonic::transport::Channel::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|err| err.to_string())?;
        LogsServiceClient::new(channel)
            .export(ExportLogsServiceRequest::default())
            .await
            .map_err(|err| err.to_string())
    };
    assert!(refused.await.is_err());
    node.stop().await;
}

#[tokio::test]
async fn the_health_listener_answers_in_plaintext_while_rest_wants_client_certs() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let node = tls_node(config_in(&tmp.path().join("node")), &pki, true, None).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let health = format!("http://{}", listener.local_addr().unwrap());
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(shale_server::serve_health(
        node.node.clone(),
        listener,
        async {
            let _ = stopped.await;
        },
    ));
    let plain = reqwest::Client::new();
    assert_eq!(livez(&plain, &health).await.unwrap(), 200);
    let readyz = plain
        .get(format!("{health}/health/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status().as_u16(), 200);
    for path in [
        "/api/v1/indexes",
        "/metrics",
        "/internal/v1/control/round",
        "/ui",
    ] {
        let status = plain
            .get(format!("{health}{path}"))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16();
        assert_eq!(status, 404, "{path}");
    }
    // The REST listener itself still wants a client certificate.
    assert!(livez(&node.client, &node.base).await.is_err());
    node.stop().await;
}

/// The certificate the server at `port` presents to a new connection (DER).
async fn served_certificate(port: u16, ca_pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let stream = connector.connect(name, tcp).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn der_of(pem: &str) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

/// Writes `contents` to `path` at once (a rename), as certificate managers do.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn certificates_are_reloaded_when_their_files_change() {
    shale_server::tls::set_reload_interval(Duration::from_millis(100));
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let first = der_of(&std::fs::read_to_string(tmp.path().join("cert.pem")).unwrap());
    let node = tls_node(config_in(&tmp.path().join("node")), &pki, false, None).await;
    let port: u16 = node.base.rsplit(':').next().unwrap().parse().unwrap();
    node.create_index(common::LOGS_INDEX).await;
    assert_eq!(served_certificate(port, &pki.ca.pem()).await, first);

    // A bad certificate file keeps the certificate in use.
    replace(&tmp.path().join("cert.pem"), "not a certificate\n");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(served_certificate(port, &pki.ca.pem()).await, first);

    // A new certificate and key: new connections get it, the node goes on.
    let (cert, key) = pki.ca.leaf("node-two", 2);
    replace(&tmp.path().join("key.pem"), &key);
    replace(&tmp.path().join("cert.pem"), &cert);
    let second = der_of(&cert);
    let deadline = Instant::now() + Duration::from_secs(20);
    while served_certificate(port, &pki.ca.pem()).await != second {
        assert!(
            Instant::now() < deadline,
            "the new certificate is never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Same node: the index made before the reload is there, over a fresh connection.
    let (status, body) = node.get("/api/v1/indexes/logs").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(node.count("logs", "*").await, 0);
    node.stop().await;
}

#[tokio::test]
async fn nodes_search_each_others_splits_over_mutual_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let metastore = format!("sqlite://{}/metastore.db", tmp.path().display());
    let node_config = |node_id: &str| {
        let mut config = config_in(&tmp.path().join(node_id));
        config.node_id = node_id.to_string();
        config.metastore_uri = metastore.clone();
        config.default_index_root_uri = format!("file://{}/indexes", tmp.path().display());
        config.cluster = ClusterConfig {
            heartbeat_interval_ms: 100,
            dead_after_ms: 600,
            leader_lease_ms: 500,
            ..ClusterConfig::default()
        };
        config
    };
    let identity = pki.ca.leaf("operator", 30);
    let a = tls_node(node_config("a"), &pki, true, Some(&identity)).await;
    let b = tls_node(node_config("b"), &pki, true, Some(&identity)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = a.get("/api/v1/cluster").await;
        assert_eq!(status, 200, "{body}");
        if body["live_nodes"].as_array().unwrap().len() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "two live nodes: {body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let no_merge = common::LOGS_INDEX.replace(
        "  commit_timeout_secs: 1\n",
        "  commit_timeout_secs: 1\n  merge_policy:\n    type: no_merge\n",
    );
    a.create_index(&no_merge).await;
    // Ingest through both nodes (routed to the shards over the internal API).
    for batch in 0..6 {
        let node = [&a, &b][batch % 2];
        node.ingest(
            "logs",
            &common::log_docs(batch * 20, 20, 1_700_000_000, "api"),
            "force",
        )
        .await;
    }
    // Every split is searched, some on the other node, over mutual TLS.
    for node in [&a, &b] {
        let response = node
            .search("logs", serde_json::json!({"query": "*", "max_hits": 5}))
            .await;
        assert_eq!(response["num_hits"], 120, "{response}");
        assert!(
            response["errors"].as_array().is_none_or(|e| e.is_empty()),
            "{response}"
        );
        assert!(
            response["num_nodes"].as_u64().unwrap() >= 2,
            "splits searched on both nodes: {response}"
        );
    }
    for node in [a, b] {
        node.stop().await;
    }
}

#[tokio::test]
async fn the_internal_client_presents_its_certificate_file_as_it_changes() {
    shale_server::tls::set_reload_interval(Duration::from_millis(100));
    let tmp = tempfile::tempdir().unwrap();
    let pki = Pki::new(tmp.path());
    let mut config = config_in(&tmp.path().join("node"));
    config.cluster.cluster_secret = Some("a-cluster-secret-for-tls".to_string());
    let node = tls_node(config, &pki, true, Some(&pki.ca.leaf("operator", 40))).await;
    let address = node.base.trim_start_matches("https://").to_string();

    // Another node's internal client, whose certificate is one the node's CA did not sign.
    let client_dir = tmp.path().join("client");
    std::fs::create_dir_all(&client_dir).unwrap();
    let stranger = Ca::new("another CA");
    let (cert, key) = stranger.leaf("stranger", 41);
    replace(&client_dir.join("cert.pem"), &cert);
    replace(&client_dir.join("key.pem"), &key);
    let client_tls = TlsConfig {
        cert_path: client_dir.join("cert.pem"),
        key_path: client_dir.join("key.pem"),
        ca_path: Some(tmp.path().join("ca.pem")),
        verify_client_cert: true,
    };
    let client = shale_server::internal::InternalClient::with_tls(
        Some("a-cluster-secret-for-tls".to_string()),
        Some(&client_tls),
    )
    .unwrap();
    assert!(
        client.control_round(&address).await.is_err(),
        "a certificate of another CA was let in"
    );
    // Its files are replaced by a certificate of the node's CA: the same client gets in,
    // with no restart.
    let (cert, key) = pki.ca.leaf("node-two", 42);
    replace(&client_dir.join("key.pem"), &key);
    replace(&client_dir.join("cert.pem"), &cert);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.control_round(&address).await {
            Ok(()) => break,
            Err(err) => assert!(
                Instant::now() < deadline,
                "the new certificate is never presented: {err}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.stop().await;
}
