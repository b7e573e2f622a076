//! `shale run` with TLS and mutual TLS from its node config, end to end: the CLI creates an
//! index, ingests and searches over HTTPS with the node's private CA (`--ca-cert`) and a client
//! certificate (`--client-cert`, `--client-key`); without the certificate, with a certificate
//! of another CA, or over plain HTTP it gets a clear failure; probes use the plaintext health
//! listener.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shale_testkit::pki::Ca;

use crate::common::{cli, succeeded, NodeProcess};

/// Runs the CLI against `endpoint` with the TLS flags `tls`.
fn shale(args: &[&str], endpoint: &str, tls: &[&str]) -> Output {
    let all: Vec<&str> = args.iter().chain(tls).copied().collect();
    cli(&all, endpoint)
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_cli_works_with_a_node_under_mutual_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ca = Ca::new("shale test CA");
    let (node_cert, node_key) = ca.leaf("node", 1);
    let (client_cert, client_key) = ca.leaf("operator", 2);
    let stranger = Ca::new("another CA");
    let (stranger_cert, stranger_key) = stranger.leaf("stranger", 3);
    let ca_path = write(dir, "ca.pem", &ca.pem());
    let node_cert = write(dir, "node.pem", &node_cert);
    let node_key = write(dir, "node.key", &node_key);
    let client_cert = write(dir, "client.pem", &client_cert);
    let client_key = write(dir, "client.key", &client_key);
    let stranger_cert = write(dir, "stranger.pem", &stranger_cert);
    let stranger_key = write(dir, "stranger.key", &stranger_key);

    let port = shale_testkit::free_port();
    let health_port = shale_testkit::free_port();
    let config = write(
        dir,
        "node.yaml",
        &format!(
            "rest:\n  tls:\n    cert_path: {node_cert}\n    key_path: {node_key}\n    \
             ca_path: {ca_path}\n    verify_client_cert: true\n\
             health_listen_address: 127.0.0.1:{health_port}\n"
        ),
    );
    let _node = NodeProcess {
        base: format!("https://localhost:{port}"),
        child: Command::new(env!("CARGO_BIN_EXE_shale"))
            .args(["run", "--config", &config])
            .env("SHALE_DATA_DIR", dir.join("data"))
            .env("SHALE_LISTEN", format!("127.0.0.1:{port}"))
            .env("SHALE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    };
    // Probes: the plaintext health listener answers once the node is up.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = std::net::TcpStream::connect(("127.0.0.1", health_port)).is_ok_and(|mut s| {
            use std::io::{Read, Write};
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            s.write_all(b"GET /health/livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .is_ok()
                && {
                    let mut answer = String::new();
                    let _ = s.read_to_string(&mut answer);
                    answer.starts_with("HTTP/1.1 200")
                }
        });
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "node did not start");
        std::thread::sleep(Duration::from_millis(100));
    }

    let endpoint = format!("https://localhost:{port}");
    let tls = [
        "--ca-cert",
        ca_path.as_str(),
        "--client-cert",
        client_cert.as_str(),
        "--client-key",
        client_key.as_str(),
    ];
    let index = write(
        dir,
        "index.yaml",
        "index_id: tls-logs\ndoc_mapping:\n  field_mappings:\n    - {name: ts, type: datetime, fast: true}\n    - {name: msg, type: text}\n  timestamp_field: ts\n",
    );
    let out = succeeded(&shale(
        &["index", "create", "--index-config", &index],
        &endpoint,
        &tls,
    ));
    assert!(out.contains("created index `tls-logs`"), "{out}");
    let docs: String = (0..100)
        .map(|i| {
            format!(
                "{{\"ts\": {}, \"msg\": \"over tls {i}\"}}\n",
                1_700_000_000 + i
            )
        })
        .collect();
    let input = write(dir, "docs.ndjson", &docs);
    let out = succeeded(&shale(
        &["ingest", "--index", "tls-logs", "--input", &input],
        &endpoint,
        &tls,
    ));
    assert!(out.contains("ingested 100 documents"), "{out}");
    let out = succeeded(&shale(
        &["search", "--index", "tls-logs", "--query", "msg:\"tls 42\""],
        &endpoint,
        &tls,
    ));
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["num_hits"], 1, "{answer}");
    assert_eq!(answer["hits"][0]["msg"], "over tls 42");

    // Without a client certificate, with one of another CA, without the CA, over HTTP: each
    // fails, and says it could not talk to the node.
    let refused = [
        vec!["--ca-cert", ca_path.as_str()],
        vec![
            "--ca-cert",
            ca_path.as_str(),
            "--client-cert",
            stranger_cert.as_str(),
            "--client-key",
            stranger_key.as_str(),
        ],
        vec![
            "--client-cert",
            client_cert.as_str(),
            "--client-key",
            client_key.as_str(),
        ],
    ];
    for flags in refused {
        let output = shale(&["index", "list"], &endpoint, &flags);
        assert!(!output.status.success(), "{flags:?} was let in");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.starts_with("error:"), "{flags:?}: {stderr}");
    }
    let output = shale(
        &["index", "list"],
        &format!("http://localhost:{port}"),
        &tls,
    );
    assert!(!output.status.success(), "plain HTTP was answered");
    // A certificate without its key is a usage error that names the missing flag.
    let output = shale(
        &["index", "list", "--client-cert", &client_cert],
        &endpoint,
        &[],
    );
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--client-key"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // A CA file that holds no certificate is named.
    let empty = write(dir, "empty.pem", "");
    let output = shale(&["index", "list", "--ca-cert", &empty], &endpoint, &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--ca-cert") && stderr.contains("empty.pem"),
        "{stderr}"
    );
}
