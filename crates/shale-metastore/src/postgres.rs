//! The PostgreSQL backend: the metastore shared by the nodes of a cluster.
//!
//! Transactions run at READ COMMITTED; writers lock the index row, then the split rows they
//! change, with `SELECT … FOR UPDATE` (always in that order, split rows by id, so writers
//! cannot deadlock). Migrations take sqlx's advisory lock, so nodes starting together apply
//! them once.

use std::time::Duration;

use sqlx::postgres::{PgPoolOptions, PgQueryResult};
use sqlx::Postgres;

use crate::migrations;
use crate::sql::{Dialect, SqlMetastore};
use crate::MetastoreResult;

/// Connections of the pool.
const MAX_CONNECTIONS: u32 = 10;
/// How long to wait for a connection (server unreachable, pool exhausted).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// The metastore in a PostgreSQL database.
pub type PostgresMetastore = SqlMetastore<Postgres>;

impl Dialect for Postgres {
    const BEGIN_WRITE: &'static str = "BEGIN";
    const FOR_SHARE: &'static str = " FOR SHARE";
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    const FOR_UPDATE_SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const BEGIN_SNAPSHOT: &'static str = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY";
    const NOW_MS: &'static str = "CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)";

    fn rows_affected(result: &PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

impl SqlMetastore<Postgres> {
    /// Connects to the PostgreSQL database at `uri` (`postgres://user@host:port/db`) and
    /// applies pending migrations.
    pub async fn connect(uri: &str) -> MetastoreResult<Self> {
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect(uri)
            .await?;
        migrations::postgres().run(&pool).await?;
        tracing::debug!("connected to PostgreSQL metastore");
        Ok(SqlMetastore::from_pool(pool, false))
    }
}
