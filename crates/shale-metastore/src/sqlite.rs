//! The SQLite backend: the embedded default, one file in the data dir.
//!
//! The file is opened in WAL mode (readers never block the writer) with a busy timeout.
//! Write transactions start with `BEGIN IMMEDIATE`, which takes SQLite's single write lock up
//! front (so two processes sharing the file serialize their writes), and are queued behind an
//! in-process mutex (so this process's writers wait in line instead of polling the busy
//! handler). While a process is the only one using the file (see [`Users`]), it answers index
//! versions from memory between its own writes (see [`crate::sql::versions`]).

use std::path::Path;
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
async fn lock_exclusive(path: std::path::PathBuf) -> MetastoreResult<std::fs::File> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        file.lock()?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(|err| MetastoreError::Db(format!("migration lock task failed: {err}")))?
    .map_err(|err| MetastoreError::Db(format!("cannot lock the metastore for migrations: {err}")))
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
                std::path::PathBuf::from(name)
            })
        };
        let lock_path = next_to_db("-migrations.lock");
        let users_path = next_to_db("-users");
        // Two processes opening a fresh file at once race twice: switching it to WAL mode (the
        // loser gets "database is locked" at once, the busy handler is not consulted), and
        // sqlx's SQLite migrator, which takes no lock of its own (both apply migration 1). An
        // exclusive lock on a file next to the database, held from the first connection to
        // the last migration, serializes them; the second one finds everything done.
        let lock = match lock_path {
            Some(path) => Some(lock_exclusive(path).await?),
            None => None,
        };
        let pool = pool_options.connect_with(options).await?;
        migrations::sqlite().run(&pool).await?;
        // Joined while the lock is held: no other process joins meanwhile.
        let alone: crate::sql::versions::Alone = match users_path {
            Some(path) => {
                let users = join_users(path).await?;
                Box::new(move || users.alone())
            }
            // An in-memory database lives and dies with this handle: no one else writes it.
            None => Box::new(|| true),
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
struct Users {
    file: std::fs::File,
    /// The file's length when this process joined alone.
    alone_at: Option<u64>,
}

impl Users {
    /// Whether no other process has joined since this one joined alone: one `fstat`, no
    /// query.
    fn alone(&self) -> bool {
        self.alone_at
            .is_some_and(|len| self.file.metadata().is_ok_and(|meta| meta.len() == len))
    }
}

/// Joins the users of a database (see [`Users`]); must be called under the migrations lock.
async fn join_users(path: std::path::PathBuf) -> MetastoreResult<Users> {
    let joined = tokio::task::spawn_blocking(move || -> std::io::Result<Users> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        // The exclusive lock is free only when no running process holds the shared one.
        let alone = file.try_lock().is_ok();
        if alone {
            // Nobody else runs: the marks of those gone can go.
            file.set_len(0)?;
            file.unlock()?;
        }
        file.lock_shared()?;
        file.write_all(b"+")?;
        let len = file.metadata()?.len();
        Ok(Users {
            file,
            alone_at: alone.then_some(len),
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
