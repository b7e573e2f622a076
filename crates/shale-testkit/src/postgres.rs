//! PostgreSQL test harness: [`test_database_url`] hands each caller a fresh, empty database.
//!
//! Where the server comes from:
//! - **`SHALE_TEST_POSTGRES_URL`** (e.g. `postgres://postgres@127.0.0.1:5432/postgres`, what
//!   `scripts/start-postgres.sh` prints): that server is used as is; CI sets it.
//! - Otherwise a **private cluster**, started once per process on first use: `initdb` in a
//!   temporary directory, then `pg_ctl start` listening on a free 127.0.0.1 port only, trusting
//!   local connections as user `postgres`, fsync off. `initdb` refuses to run as root, so as
//!   root the cluster belongs to an unprivileged user (`$SHALE_PG_USER`, else `postgres` if it
//!   exists, else `nobody`) and the binaries run under `setpriv`. The binaries come from
//!   `$PG_BIN`, else `PATH`, else the newest `/usr/lib/postgresql/*/bin`.
//!
//! The private cluster is stopped when the process exits, however it exits (even
//! `SIGKILL`): statics are never dropped, so a watchdog `sh`, in its own process group, blocks
//! reading a pipe whose only write end this process holds (close-on-exec, so no child
//! inherits it). It is started before `initdb`. At exit the kernel closes the pipe; the
//! watchdog reads EOF, sends `SIGQUIT` (immediate shutdown) to the postmaster by the PID in its
//! pid file, waits for it to remove that file and deletes the directory. (Only a kill landing
//! during the fraction of a second `pg_ctl start` runs can leave a server behind.)
//!
//! If no server can be had: under CI ([`crate::under_ci`]) that is a panic, never a skip;
//! elsewhere a warning is printed and `None` returned, and callers skip their test.

use std::fs;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::OnceLock;

use sqlx::Connection;

/// Environment variable naming an already running server to create test databases in.
pub const POSTGRES_URL_ENV: &str = "SHALE_TEST_POSTGRES_URL";

/// Tries with different free ports before giving up (another process may grab the port).
const START_ATTEMPTS: usize = 3;

/// The URL of a fresh, empty database (`shale_test_<ulid>`), created on the server of
/// [`server_url`]; `None` when there is no server and we are not under CI. Must be called
/// within a Tokio runtime; the first call may block for a second or two (cluster start).
///
/// # Panics
/// When the database cannot be created, or under CI when no server can be started.
pub async fn test_database_url() -> Option<String> {
    let server = server_url()?;
    let name = format!(
        "shale_test_{}",
        ulid::Ulid::new().to_string().to_ascii_lowercase()
    );
    if let Err(err) = create_database(&server, &name).await {
        panic!("cannot create test database `{name}` on {server}: {err}");
    }
    Some(with_database(&server, &name))
}

/// The URL of the test server's `postgres` database (the private cluster, or
/// `$SHALE_TEST_POSTGRES_URL`); `None` when there is none and we are not under CI.
///
/// # Panics
/// Under CI, when the private cluster cannot be started.
pub fn server_url() -> Option<String> {
    if let Ok(url) = std::env::var(POSTGRES_URL_ENV) {
        if !url.trim().is_empty() {
            return Some(url.trim().to_string());
        }
    }
    static CLUSTER: OnceLock<Option<PrivateCluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| match PrivateCluster::start(false) {
            Ok(cluster) => Some(cluster),
            Err(err) if crate::under_ci() => panic!(
                "cannot start a private PostgreSQL cluster, and CI must not skip PostgreSQL \
                 tests: {err}\nInstall PostgreSQL (initdb, pg_ctl) or set {POSTGRES_URL_ENV} \
                 (see scripts/start-postgres.sh)."
            ),
            Err(err) => {
                // Straight to stderr, past the test harness's output capture: a skip must show.
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: skipping PostgreSQL tests: cannot start a private cluster: {err} \
                     (set {POSTGRES_URL_ENV} to use a running server)"
                );
                None
            }
        })
        .as_ref()
        .map(|cluster| cluster.url.clone())
}

async fn create_database(server_url: &str, name: &str) -> Result<(), String> {
    let mut conn = sqlx::PgConnection::connect(server_url)
        .await
        .map_err(|err| format!("cannot connect: {err}"))?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut conn)
        .await
        .map_err(|err| err.to_string())?;
    conn.close().await.map_err(|err| err.to_string())
}

/// `server_url` with its database replaced by `name`.
fn with_database(server_url: &str, name: &str) -> String {
    match url::Url::parse(server_url) {
        Ok(mut url) => {
            url.set_path(&format!("/{name}"));
            url.to_string()
        }
        Err(err) => {
            panic!("{POSTGRES_URL_ENV} must be a postgres:// URL, not `{server_url}`: {err}")
        }
    }
}

/// A cluster this process started; stopped by its watchdog when the process exits (or when
/// dropped).
struct PrivateCluster {
    /// URL of its `postgres` database.
    url: String,
    /// Where `initdb` and `pg_ctl` are.
    bin: PathBuf,
    /// Its directory (data, log, socket).
    dir: PathBuf,
    /// Write end of the watchdog's pipe: never written, closed by the kernel at exit.
    _watchdog: ChildStdin,
}

impl PrivateCluster {
    /// A new cluster in a fresh temporary directory (see [`PrivateCluster::start_in`] for
    /// `durable_commits`).
    fn start(durable_commits: bool) -> Result<PrivateCluster, String> {
        let bin = find_bin_dir()?;
        let dir = tempfile::Builder::new()
            .prefix("shale-pg-")
            .tempdir()
            .map_err(|err| format!("cannot create a temporary directory: {err}"))?
            .keep();
        // The watchdog comes first, so that no exit, however early, leaks the directory.
        let watchdog = match spawn_watchdog(&dir) {
            Ok(watchdog) => watchdog,
            Err(err) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(err);
            }
        };
        // On failure, dropping the watchdog's pipe makes it clean up right away.
        let url = Self::start_in(&bin, &dir, durable_commits)?;
        Ok(PrivateCluster {
            url,
            bin,
            dir,
            _watchdog: watchdog,
        })
    }

    /// Creates and starts the cluster in `dir`; returns the URL of its `postgres` database.
    /// With `durable_commits`, a commit is answered once in the server's WAL (written to the
    /// OS, not fsynced): it survives a crash of the server, not of the machine. Without, a
    /// crash of the server loses the last commits (faster: what tests that never crash it
    /// want).
    fn start_in(bin: &Path, dir: &Path, durable_commits: bool) -> Result<String, String> {
        let as_owner = unprivileged_prefix(dir)?;
        let data = dir.join("data");
        let initdb = run(
            &as_owner,
            &bin.join("initdb"),
            dir,
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth=trust".as_ref(),
                "--no-sync".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C".as_ref(),
            ],
        );
        initdb.map_err(|err| format!("initdb failed: {err}"))?;

        let log = dir.join("postgres.log");
        let mut last_err = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = crate::free_port();
            let options = format!(
                "-c listen_addresses=127.0.0.1 -p {port} -k {} -c fsync=off \
                 -c synchronous_commit={} -c full_page_writes=off -c max_connections=300",
                dir.display(),
                if durable_commits { "on" } else { "off" }
            );
            let started = run(
                &as_owner,
                &bin.join("pg_ctl"),
                dir,
                &[
                    "-D".as_ref(),
                    data.as_os_str(),
                    "-l".as_ref(),
                    log.as_os_str(),
                    "-o".as_ref(),
                    options.as_ref(),
                    "-w".as_ref(),
                    "-t".as_ref(),
                    "60".as_ref(),
                    "start".as_ref(),
                ],
            );
            match started {
                Ok(()) => return Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres")),
                Err(err) => {
                    let log_tail = fs::read_to_string(&log).unwrap_or_default();
                    let log_tail: Vec<&str> = log_tail.lines().rev().take(10).collect();
                    last_err = format!(
                        "pg_ctl start failed: {err}\nlog tail (newest first):\n{}",
                        log_tail.join("\n")
                    );
                }
            }
        }
        Err(last_err)
    }
}

/// A private cluster of a test's own, which the test may restart or crash (the shared server
/// of [`server_url`] is never restarted: other tests use it). Its commits survive a crash of
/// the server (`synchronous_commit=on`; not fsynced: a crash of the machine is not tested).
/// Stopped, and its directory deleted, when dropped or when the process exits.
pub struct DedicatedCluster {
    cluster: PrivateCluster,
}

impl DedicatedCluster {
    /// `initdb` and `pg_ctl start` in a fresh temporary directory, on a free loopback port.
    pub fn start() -> Result<DedicatedCluster, String> {
        // Commits must survive the crashes the test causes.
        Ok(DedicatedCluster {
            cluster: PrivateCluster::start(true)?,
        })
    }

    /// The URL of a fresh, empty database on this cluster.
    pub async fn database_url(&self) -> Result<String, String> {
        let name = format!(
            "shale_test_{}",
            ulid::Ulid::new().to_string().to_ascii_lowercase()
        );
        create_database(&self.cluster.url, &name).await?;
        Ok(with_database(&self.cluster.url, &name))
    }

    /// `pg_ctl restart -m immediate`: every connection is cut at once, as in a crash, and
    /// the server recovers from its WAL; returns once it accepts connections again.
    pub fn restart_immediate(&self) -> Result<(), String> {
        let PrivateCluster { bin, dir, .. } = &self.cluster;
        let as_owner = unprivileged_prefix(dir)?;
        let data = dir.join("data");
        let log = dir.join("postgres.log");
        run(
            &as_owner,
            &bin.join("pg_ctl"),
            dir,
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-l".as_ref(),
                log.as_os_str(),
                "-m".as_ref(),
                "immediate".as_ref(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "restart".as_ref(),
            ],
        )
    }
}

/// The directory holding `initdb` and `pg_ctl`.
fn find_bin_dir() -> Result<PathBuf, String> {
    let has_tools = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = std::env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        return if has_tools(&dir) {
            Ok(dir)
        } else {
            Err(format!("PG_BIN={} holds no initdb/pg_ctl", dir.display()))
        };
    }
    if let Some(path) = std::env::var_os("PATH") {
        if let Some(dir) = std::env::split_paths(&path).find(|dir| has_tools(dir)) {
            return Ok(dir);
        }
    }
    // Debian and Ubuntu keep them off PATH.
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_tools(dir))
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, dir)| dir)
        .ok_or_else(|| "initdb/pg_ctl not found on PATH nor in /usr/lib/postgresql".to_string())
}

/// When running as root: hands `dir` to an unprivileged user and returns the command prefix
/// running a program as that user. Empty otherwise.
fn unprivileged_prefix(dir: &Path) -> Result<Vec<String>, String> {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(Vec::new());
    }
    let user = match std::env::var("SHALE_PG_USER") {
        Ok(user) if !user.is_empty() => user,
        _ if id(&["-u", "postgres"]).is_ok() => "postgres".to_string(),
        _ => "nobody".to_string(),
    };
    let uid = id(&["-u", &user])?;
    let gid = id(&["-g", &user])?;
    run(
        &[],
        Path::new("chown"),
        dir,
        &[user.as_ref(), dir.as_os_str()],
    )
    .map_err(|err| format!("cannot give {} to {user}: {err}", dir.display()))?;
    Ok(vec![
        "setpriv".to_string(),
        format!("--reuid={uid}"),
        format!("--regid={gid}"),
        "--init-groups".to_string(),
        "--".to_string(),
    ])
}

/// Output of `id ARGS`, trimmed.
fn id(args: &[&str]) -> Result<String, String> {
    let output = Command::new("id")
        .args(args)
        .output()
        .map_err(|err| format!("cannot run id: {err}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    } else {
        Err(format!(
            "id {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs `prefix… program args…` in `cwd`, failing with its output.
fn run(
    prefix: &[String],
    program: &Path,
    cwd: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<(), String> {
    let mut command = match prefix.split_first() {
        Some((first, rest)) => {
            let mut command = Command::new(first);
            command.args(rest).arg(program);
            command
        }
        None => Command::new(program),
    };
    let output = command
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("cannot run {}: {err}", program.display()))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} exited with {}: {}{}",
            program.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

/// Starts the watchdog that, once this process has exited (or dropped the returned pipe),
/// stops the postmaster of `dir/data` if one runs and deletes `dir`. Returns the write end of
/// its stdin, to be held until exit.
fn spawn_watchdog(dir: &Path) -> Result<ChildStdin, String> {
    // The PID is read at cleanup time, and checked to be a postgres process.
    const SCRIPT: &str = r#"
        trap '' INT HUP TERM
        read -r _ignored
        pid_file="$1/data/postmaster.pid"
        pid=$(head -n 1 "$pid_file" 2>/dev/null)
        if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ]; then
            kill -QUIT "$pid" 2>/dev/null
            i=0
            while [ -e "$pid_file" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        fi
        rm -rf "$1"
    "#;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(SCRIPT)
        .arg("shale-pg-watchdog")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C of the tests must not kill it before cleanup.
        .process_group(0)
        .spawn()
        .map_err(|err| format!("cannot start the cleanup watchdog: {err}"))?;
    child
        .stdin
        .take()
        .ok_or_else(|| "the watchdog has no stdin".to_string())
}
