//! `shale --version` and `shale -V` name the commit and build date of the binary.

use std::process::Command;

fn version(flag: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_shale"))
        .arg(flag)
        .output()
        .expect("run shale");
    assert!(
        output.status.success(),
        "shale {flag} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).to_string()
}

#[test]
fn version_names_the_commit_and_build_date() {
    let build = shale_server::build_info();
    let long = version("--version");
    assert!(
        long.starts_with(&format!("shale {}", env!("CARGO_PKG_VERSION"))),
        "{long}"
    );
    assert!(long.contains(build.commit_hash), "{long}");
    assert!(long.contains(build.commit_date), "{long}");
    assert!(long.contains(build.build_date), "{long}");
    let short = version("-V");
    assert!(short.contains(build.commit_short_hash), "{short}");
    assert_eq!(short.lines().count(), 1, "{short}");

    // Built from this checkout: the commit is one of the repository's (`unknown` only
    // outside a git checkout).
    let head = Command::new("git")
        .args(["rev-parse", "--verify", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output();
    if head.is_ok_and(|out| out.status.success()) {
        assert_eq!(build.commit_hash.len(), 40, "{long}");
        let known = Command::new("git")
            .args([
                "cat-file",
                "-e",
                &format!("{}^{{commit}}", build.commit_hash),
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run git");
        assert!(known.success(), "{long}");
    }
}
