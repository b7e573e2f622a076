//! `GET /api/v1/version`: the version, commit and build date of the running binary, in
//! Quickwit's shape, behind the API token like the rest of the API.

use crate::common::{config_in, TestNode};

/// A date `build.rs` wrote: RFC 3339 in UTC.
fn is_rfc3339(date: &str) -> bool {
    time::OffsetDateTime::parse(date, &time::format_description::well_known::Rfc3339).is_ok()
}

#[tokio::test]
async fn version_reports_the_version_commit_and_build_date() {
    let node = TestNode::start().await;
    let (status, body) = node.get("/api/v1/version").await;
    assert_eq!(status, 200, "{body}");
    let build = &body["build"];
    for field in [
        "version",
        "cargo_pkg_version",
        "commit_hash",
        "commit_short_hash",
        "commit_date",
        "build_date",
        "build_profile",
        "build_target",
    ] {
        let value = build[field].as_str().unwrap_or_default();
        assert!(!value.is_empty(), "build.{field} is empty: {body}");
    }
    assert_eq!(build["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(build["cargo_pkg_version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(body["commit"], build["commit_hash"]);
    assert_eq!(body["build_date"], build["build_date"]);
    assert!(is_rfc3339(build["build_date"].as_str().unwrap()), "{body}");

    // Built from this repository's checkout: a real commit (a source tarball says `unknown`).
    let hash = build["commit_hash"].as_str().unwrap();
    let short = build["commit_short_hash"].as_str().unwrap();
    let in_checkout = std::process::Command::new("git")
        .args(["rev-parse", "--verify", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .is_ok_and(|out| out.status.success());
    if in_checkout {
        assert_eq!(hash.len(), 40, "{body}");
        assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "{body}");
        assert!(hash.starts_with(short), "{body}");
        assert!(is_rfc3339(build["commit_date"].as_str().unwrap()), "{body}");
        let known = std::process::Command::new("git")
            .args(["cat-file", "-e", &format!("{hash}^{{commit}}")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status();
        if let Ok(known) = known {
            assert!(known.success(), "{hash} is not a commit of this repository");
        }
    }
    assert_eq!(
        build,
        &serde_json::to_value(shale_server::build_info()).unwrap()
    );
    node.stop().await;
}

#[tokio::test]
async fn version_is_behind_the_api_token() {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config_in(tmp.path());
    config.api_token = Some("version-token".to_string());
    let node = TestNode::start_with(config).await;
    let (status, _) = node.get("/api/v1/version").await;
    assert_eq!(status, 401);
    let resp = node
        .client
        .get(node.url("/api/v1/version"))
        .bearer_auth("version-token")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["version"], env!("CARGO_PKG_VERSION"));
    node.stop().await;
}
