//! With `api_token` set, every REST call but `/health/*` must present it — as a bearer
//! token, or the way Elasticsearch clients send credentials — else a 401.

use crate::common;

use base64::Engine;
use common::{config_in, TestNode};

const TOKEN: &str = "s3cret-token-123";

async fn status(
    node: &TestNode,
    path: &str,
    authorization: Option<String>,
) -> (u16, reqwest::header::HeaderMap, serde_json::Value) {
    let mut request = node.client.get(node.url(path));
    if let Some(value) = authorization {
        request = request.header("authorization", value);
    }
    let resp = request.send().await.unwrap();
    let code = resp.status().as_u16();
    let headers = resp.headers().clone();
    (
        code,
        headers,
        resp.json().await.unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test]
async fn every_call_but_health_needs_the_token() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.api_token = Some(TOKEN.to_string());
    let node = TestNode::start_with(config).await;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);

    let (code, headers, body) = status(&node, "/api/v1/indexes", None).await;
    assert_eq!(code, 401, "{body}");
    assert!(body["message"].as_str().unwrap().contains("API token"));
    assert_eq!(headers.get("www-authenticate").unwrap(), "Bearer");
    for wrong in [
        "Bearer nope-nope-nope".to_string(),
        format!("Bearer {TOKEN}x"),
        format!("Token {TOKEN}"),
        format!("Basic {}", b64(&format!("elastic:{TOKEN}x"))),
    ] {
        assert_eq!(
            status(&node, "/api/v1/indexes", Some(wrong.clone()))
                .await
                .0,
            401,
            "{wrong}"
        );
    }
    for right in [
        format!("Bearer {TOKEN}"),
        format!("ApiKey {TOKEN}"),
        format!("ApiKey {}", b64(&format!("key-id:{TOKEN}"))),
        format!("Basic {}", b64(&format!("elastic:{TOKEN}"))),
    ] {
        assert_eq!(
            status(&node, "/api/v1/indexes", Some(right.clone()))
                .await
                .0,
            200,
            "{right}"
        );
    }
    // Health stays open; metrics do not.
    assert_eq!(status(&node, "/health/livez", None).await.0, 200);
    assert_eq!(status(&node, "/health/readyz", None).await.0, 200);
    assert_eq!(status(&node, "/metrics", None).await.0, 401);
    // The Elasticsearch API answers in its own shape, with its product header.
    let resp = node
        .client
        .post(node.url("/api/v1/_elastic/_bulk"))
        .body("{}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 401);
    assert_eq!(
        resp.headers().get("x-elastic-product").unwrap(),
        "Elasticsearch"
    );
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "security_exception");
    node.stop().await;
}
