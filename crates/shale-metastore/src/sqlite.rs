//! The SQLite backend: the embedded default, one file in the data dir.
//!
//! The file is opened in WAL mode (readers never block the writer) with a busy timeout.
//! Write transactions start with `BEGIN IMMEDIATE`, which takes SQLite's single write lock up
//! front (so two processes sharing the file serialize their writes), and are queued behind an
//! in-process mutex (so this process's writers wait in line instead of polling the busy
//! handler). While a process is the only one using the file (see [`Users`]), it answers index
//! versions from memory between its own writes (see [`crate::sql::versions`]).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteQueryResult,
    SqliteSynchronous,
};
use sqlx::Sqlite;

use crate::migrations;
use crate::sql::{Dialect, SqlMetastore};
use crate::{MetastoreError, MetastoreResult};

/// How long a statement waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections of the pool (readers run concurrently with the single writer).
const MAX_CONNECTIONS: u32 = 4;

/// The metastore in a SQLite file.
pub type SqliteMetastore = SqlMetastore<Sqlite>;

impl Dialect for Sqlite {
    const BEGIN_WRITE: &'static str = "BEGIN IMMEDIATE";
    const FOR_SHARE: &'static str = "";
    const FOR_UPDATE: &'static str = "";
    const FOR_UPDATE_SKIP_LOCKED: &'static str = "";
    const BEGIN_SNAPSHOT: &'static str = "BEGIN";
    const NOW_MS: &'static str =
        "CAST(ROUND((julianday('now') - 2440587.5) * 86400000.0) AS INTEGER)";

    fn rows_affected(result: &SqliteQueryResult) -> u64 {
        result.rows_affected()
    }
}

/// Opens (creating it) and locks `path` exclusively, waiting for another process to release it;
/// the lock is released when the returned file is dropped.
async fn lock_exclusive(path: PathBuf) -> MetastoreResult<std::fs::File> {
    tokio::task::spawn_blocking(move || lock_file(&path, true))
        .await
        .map_err(|err| MetastoreError::Db(format!("migration lock task failed: {err}")))?
        .map_err(|err| {
            MetastoreError::Db(format!("cannot lock the metastore for migrations: {err}"))
        })?
        .ok_or_else(|| MetastoreError::Db("the migrations lock was not taken".to_string()))
}

/// Opens (creating it) and locks `path` exclusively: waiting for it when `wait`, else `None`
/// when another process holds it. A lock file removed (and made again by another process)
/// while this one waited is not a lock: the file locked must still be the one at `path`.
fn lock_file(path: &Path, wait: bool) -> std::io::Result<Option<std::fs::File>> {
    loop {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        if wait {
            file.lock()?;
        } else {
            match file.try_lock() {
                Ok(()) => {}
                Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
                Err(std::fs::TryLockError::Error(err)) => return Err(err),
            }
        }
        if held_at(&file, path)?.is_some() {
            return Ok(Some(file));
        }
    }
}

/// The metadata of `file` if `path` still names it (it was not removed, nor replaced by
/// another file), else `None`: one `fstat` and one `stat`.
#[cfg(unix)]
fn held_at(file: &std::fs::File, path: &Path) -> std::io::Result<Option<std::fs::Metadata>> {
    use std::os::unix::fs::MetadataExt;
    let held = file.metadata()?;
    match std::fs::metadata(path) {
        Ok(at_path) if held.dev() == at_path.dev() && held.ino() == at_path.ino() => Ok(Some(held)),
        Ok(_) => Ok(None),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// The metadata of `file` if something is at `path` (without file identities to compare,
/// a replaced file goes unnoticed: such a process never answers from memory).
#[cfg(not(unix))]
fn held_at(file: &std::fs::File, path: &Path) -> std::io::Result<Option<std::fs::Metadata>> {
    let held = file.metadata()?;
    Ok(path.exists().then_some(held))
}

/// Symbolic links followed before giving up (as the kernel does).
const MAX_SYMLINKS: usize = 40;

/// The database file's canonical path (absolute, `.`, `..` and symbolic links resolved, as
/// SQLite resolves them itself), so that processes reaching one file through different
/// spellings name the same files next to it. A file not created yet is named in its
/// canonical directory (following a dangling link to where SQLite will create it).
fn canonical_db_path(path: &Path) -> std::io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..MAX_SYMLINKS {
        match std::fs::canonicalize(&path) {
            Ok(canonical) => return Ok(canonical),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(err),
        }
        let name = path.file_name().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("`{}` names no file", path.display()),
            )
        })?;
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let candidate = std::fs::canonicalize(parent)?.join(name);
        match std::fs::read_link(&candidate) {
            // A dangling link: SQLite creates its target.
            Ok(target) => path = candidate.parent().unwrap_or(Path::new("/")).join(target),
            Err(_) => return Ok(candidate),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("too many symbolic links at `{}`", path.display()),
    ))
}

/// Whether `uri` names an in-memory database.
fn is_in_memory(uri: &str) -> bool {
    matches!(uri, ":memory:" | "sqlite::memory:" | "sqlite://:memory:")
        || uri.contains("mode=memory")
}

impl SqlMetastore<Sqlite> {
    /// Opens (creating it and its parent directory if missing) the SQLite metastore at
    /// `path_or_uri` — a file path, a `sqlite://path` URI, or `sqlite::memory:` — and applies
    /// pending migrations.
    pub async fn open(path_or_uri: &str) -> MetastoreResult<Self> {
        let in_memory = is_in_memory(path_or_uri);
        let options = if path_or_uri.starts_with("sqlite:") || path_or_uri == ":memory:" {
            let uri = if path_or_uri == ":memory:" {
                "sqlite::memory:"
            } else {
                path_or_uri
            };
            SqliteConnectOptions::from_str(uri)
                .map_err(|err| MetastoreError::Db(format!("invalid SQLite URI `{uri}`: {err}")))?
        } else {
            SqliteConnectOptions::new().filename(path_or_uri)
        };
        if !in_memory {
            if let Some(parent) = options.get_filename().parent() {
                if !parent.as_os_str().is_empty() && !Path::new(parent).exists() {
                    tokio::fs::create_dir_all(parent).await.map_err(|err| {
                        MetastoreError::Db(format!(
                            "cannot create the metastore directory `{}`: {err}",
                            parent.display()
                        ))
                    })?;
                }
            }
        }
        // Every process names the file (and the files next to it) by its canonical path,
        // whichever spelling or symbolic link it was given.
        let options = if in_memory {
            options
        } else {
            let given = options.get_filename().to_path_buf();
            let canonical = tokio::task::spawn_blocking(move || canonical_db_path(&given))
                .await
                .map_err(|err| MetastoreError::Db(format!("path task failed: {err}")))?
                .map_err(|err| {
                    MetastoreError::Db(format!(
                        "cannot resolve the metastore path `{}`: {err}",
                        options.get_filename().display()
                    ))
                })?;
            options.filename(canonical)
        };
        let options = options
            .create_if_missing(true)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool_options = if in_memory {
            // One connection holds the database alive, and shared-cache locking is avoided.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            SqlitePoolOptions::new().max_connections(MAX_CONNECTIONS)
        };
        let options = if in_memory {
            options
        } else {
            options
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
        };
        // Files next to the database: `{db}{suffix}`.
        let next_to_db = |suffix: &str| {
            (!in_memory).then(|| {
                let mut name = options.get_filename().as_os_str().to_owned();
                name.push(suffix);
                PathBuf::from(name)
            })
        };
        let lock_path = next_to_db("-migrations.lock");
        let users_path = next_to_db("-users");
        // Two processes opening a fresh file at once race twice: switching it to WAL mode (the
        // loser gets "database is locked" at once, the busy handler is not consulted), and
        // sqlx's SQLite migrator, which takes no lock of its own (both apply migration 1). An
        // exclusive lock on a file next to the database, held from the first connection to
        // the last migration, serializes them; the second one finds everything done.
        let lock = match &lock_path {
            Some(path) => Some(lock_exclusive(path.clone()).await?),
            None => None,
        };
        let pool = pool_options.connect_with(options).await?;
        migrations::sqlite().run(&pool).await?;
        // Joined while the lock is held: no other process joins meanwhile.
        let alone: crate::sql::versions::Alone = match (users_path, lock_path) {
            (Some(path), Some(lock_path)) => {
                let users = join_users(path, lock_path).await?;
                Box::new(move || users.alone())
            }
            // An in-memory database lives and dies with this handle: no one else writes it.
            _ => Box::new(|| true),
        };
        drop(lock);
        tracing::debug!(uri = path_or_uri, "opened SQLite metastore");
        Ok(SqlMetastore::from_pool(pool, true).with_version_cache(alone))
    }
}

/// This process's place among those using one SQLite file: the file `{db}-users`, which
/// every process opening the database holds a shared lock on for as long as it runs and
/// appends one byte to when it opens it (under the migrations lock, so one at a time).
/// A process that found no other holder when it joined writes the database alone for as long
/// as the file keeps the length it left it at; once another process joins, it no longer
/// does (until it restarts).
///
/// The file may be removed while processes hold it (by hand, by a temporary files cleaner):
/// the next process to open the database then makes a new one and finds itself alone. So
/// every check also makes sure the path still names the file held; when it does not, this
/// process stops answering from memory for good and joins the new file, which the process
/// alone on it sees grow. Checks run before each kept version is used and after each write
/// transaction ends (before the write is acknowledged), so a process that made a new file
/// learns of this one before any write of this one is acknowledged after the new file was
/// made.
struct Users {
    /// `{db}-users`.
    path: PathBuf,
    /// `{db}-migrations.lock`, held while joining.
    lock_path: PathBuf,
    joined: std::sync::Mutex<Joined>,
}

/// The users file this process joined.
struct Joined {
    file: std::fs::File,
    /// The file's length when this process joined alone.
    alone_at: Option<u64>,
}

impl Users {
    /// Whether no other process has joined since this one joined alone: one `fstat` and one
    /// `stat`, no query (more when the file was replaced: see [`Users`]).
    fn alone(&self) -> bool {
        let mut joined = self.joined.lock().unwrap_or_else(|p| p.into_inner());
        match held_at(&joined.file, &self.path) {
            Ok(Some(held)) => joined.alone_at == Some(held.len()),
            Ok(None) => {
                if joined.alone_at.take().is_some() {
                    tracing::warn!(
                        path = %self.path.display(),
                        "the SQLite metastore's users file was removed or replaced: index \
                         versions are read from the database from now on"
                    );
                }
                // Another process may have made a new file and think itself alone: join it.
                match lock_file(&self.lock_path, false) {
                    Ok(Some(_lock)) => match join_file(&self.path) {
                        Ok((file, _)) => joined.file = file,
                        Err(err) => {
                            tracing::warn!(%err, "cannot join the SQLite metastore's users file")
                        }
                    },
                    // Another process is joining: it appends to the file before it is done,
                    // so the one alone on it (if any) stops being alone. Joined next time.
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(%err, "cannot lock the SQLite metastore to join its users")
                    }
                }
                false
            }
            Err(err) => {
                tracing::debug!(%err, "cannot check the SQLite metastore's users file");
                false
            }
        }
    }
}

/// Opens (creating it) the users file at `path`, holds a shared lock on it and appends this
/// process's byte; with whether no other process held it (then the marks of those gone are
/// cleared first). Must be called under the migrations lock.
fn join_file(path: &Path) -> std::io::Result<(std::fs::File, bool)> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    // The exclusive lock is free only when no running process holds the shared one.
    let alone = file.try_lock().is_ok();
    if alone {
        // Nobody else runs: the marks of those gone can go.
        file.set_len(0)?;
        file.unlock()?;
    }
    file.lock_shared()?;
    file.write_all(b"+")?;
    Ok((file, alone))
}

/// Joins the users of a database (see [`Users`]); must be called under the migrations lock
/// (at `lock_path`).
async fn join_users(path: PathBuf, lock_path: PathBuf) -> MetastoreResult<Users> {
    let joined = tokio::task::spawn_blocking(move || -> std::io::Result<Users> {
        let (file, alone) = join_file(&path)?;
        let len = file.metadata()?.len();
        // Without file identities, a replaced file would go unnoticed: never alone.
        let alone = alone && cfg!(unix);
        Ok(Users {
            path,
            lock_path,
            joined: std::sync::Mutex::new(Joined {
                file,
                alone_at: alone.then_some(len),
            }),
        })
    })
    .await
    .map_err(|err| MetastoreError::Db(format!("users file task failed: {err}")))?;
    joined.map_err(|err| {
        MetastoreError::Db(format!(
            "cannot join the users of the SQLite metastore: {err}"
        ))
    })
}
