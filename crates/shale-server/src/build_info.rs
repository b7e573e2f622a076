//! What this binary was built from: the package version, the git commit and the build date
//! captured by `build.rs` (`unknown` when built outside a git checkout). `GET /api/v1/version`
//! and `shale --version` report it.

use serde::Serialize;

/// The version, commit and build of this binary, in Quickwit's field names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BuildInfo {
    /// The release version (the package version).
    pub version: &'static str,
    /// The package version, as Cargo knows it.
    pub cargo_pkg_version: &'static str,
    /// The full git commit hash, or `unknown`.
    pub commit_hash: &'static str,
    /// Its first 12 hex digits, or `unknown`.
    pub commit_short_hash: &'static str,
    /// The commit's date (RFC 3339, UTC), or `unknown`.
    pub commit_date: &'static str,
    /// When it was built (RFC 3339, UTC; `SOURCE_DATE_EPOCH` when set).
    pub build_date: &'static str,
    /// Cargo's profile: `debug` or `release`.
    pub build_profile: &'static str,
    /// The target triple.
    pub build_target: &'static str,
}

/// This binary's build.
pub const fn build_info() -> BuildInfo {
    BuildInfo {
        version: env!("CARGO_PKG_VERSION"),
        cargo_pkg_version: env!("CARGO_PKG_VERSION"),
        commit_hash: env!("SHALE_COMMIT_HASH"),
        commit_short_hash: env!("SHALE_COMMIT_SHORT_HASH"),
        commit_date: env!("SHALE_COMMIT_DATE"),
        build_date: env!("SHALE_BUILD_DATE"),
        build_profile: env!("SHALE_BUILD_PROFILE"),
        build_target: env!("SHALE_BUILD_TARGET"),
    }
}

/// One line for `shale -V`: `0.1.0 (commit 0123456789ab, built 2026-05-01T10:00:00Z)`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SHALE_COMMIT_SHORT_HASH"),
    ", built ",
    env!("SHALE_BUILD_DATE"),
    ")"
);

/// The text of `shale --version`: the version, then the commit, its date and the build.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit:      ",
    env!("SHALE_COMMIT_HASH"),
    "\ncommit date: ",
    env!("SHALE_COMMIT_DATE"),
    "\nbuild date:  ",
    env!("SHALE_BUILD_DATE"),
    "\nbuild:       ",
    env!("SHALE_BUILD_PROFILE"),
    " ",
    env!("SHALE_BUILD_TARGET"),
);
