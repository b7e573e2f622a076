//! Captures what `shale_server::build_info()` reports: the git commit (hash and date) of the
//! source tree and the build date, as `SHALE_*` compile-time variables. Without git or a
//! `.git` directory (a source tarball) the commit fields are `unknown`. The build date is
//! `SOURCE_DATE_EPOCH` when set (reproducible builds), else the time this script ran: it
//! reruns only when the checked-out commit changes, not on every build.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");

    let commit_hash = git(&manifest_dir, &["rev-parse", "--verify", "HEAD"])
        .filter(|hash| hash.len() >= 7 && hash.bytes().all(|b| b.is_ascii_hexdigit()));
    let commit_date = commit_hash
        .as_ref()
        .and_then(|_| git(&manifest_dir, &["log", "-1", "--format=%ct", "HEAD"]))
        .and_then(|secs| secs.parse::<i64>().ok())
        .map(rfc3339);
    if commit_hash.is_some() {
        watch_git_head(&manifest_dir);
    }
    let build_secs = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|secs| secs.trim().parse::<i64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0)
        });

    let unknown = || "unknown".to_string();
    let short_hash = commit_hash
        .as_ref()
        .map(|hash| hash[..12.min(hash.len())].to_string());
    set("SHALE_COMMIT_HASH", &commit_hash.unwrap_or_else(unknown));
    set(
        "SHALE_COMMIT_SHORT_HASH",
        &short_hash.unwrap_or_else(unknown),
    );
    set("SHALE_COMMIT_DATE", &commit_date.unwrap_or_else(unknown));
    set("SHALE_BUILD_DATE", &rfc3339(build_secs));
    set(
        "SHALE_BUILD_PROFILE",
        &std::env::var("PROFILE").unwrap_or_else(|_| unknown()),
    );
    set(
        "SHALE_BUILD_TARGET",
        &std::env::var("TARGET").unwrap_or_else(|_| unknown()),
    );
}

fn set(name: &str, value: &str) {
    println!("cargo:rustc-env={name}={value}");
}

/// The trimmed output of `git args` run in `dir`, if git ran and succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

/// Reruns this script when the checked-out commit changes: on `HEAD` (another branch, a
/// detached checkout), on the current branch's ref (a commit) and on `packed-refs`. Only
/// existing paths are watched (a missing one would rerun the script on every build); a
/// branch whose ref is only packed is watched through its loose ref's directory, where a
/// commit writes it.
fn watch_git_head(dir: &Path) {
    let absolute = |path: String| {
        let path = PathBuf::from(path);
        let path = if path.is_absolute() {
            path
        } else {
            dir.join(path)
        };
        path.canonicalize().unwrap_or(path)
    };
    let Some(git_dir) = git(dir, &["rev-parse", "--git-dir"]).map(absolute) else {
        return;
    };
    let common_dir = git(dir, &["rev-parse", "--git-common-dir"])
        .map(absolute)
        .unwrap_or_else(|| git_dir.clone());
    let watch = |path: &Path| {
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    };
    watch(&git_dir.join("HEAD"));
    watch(&common_dir.join("packed-refs"));
    if let Some(reference) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        let loose = common_dir.join(&reference);
        if loose.exists() {
            watch(&loose);
        } else if let Some(parent) = loose.parent() {
            watch(parent);
        }
    }
}

/// `secs` since the Unix epoch as `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
