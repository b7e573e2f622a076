//! Delete tasks in SQL (table `delete_tasks`, migration 0006), shared by both backends.
//! Opstamps are assigned under the index row lock (every index writer takes it), so two
//! concurrent creators get consecutive opstamps, never the same one.

use std::collections::BTreeMap;

use shale_types::{DeleteQuery, DeleteTask, IndexUid};
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{from_db, serde_err, to_db, Dialect, SqlMetastore};
use crate::{MetastoreError, MetastoreResult};

impl<DB> SqlMetastore<DB>
where
    DB: Dialect,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<i64>: Encode<'q, DB> + Decode<'q, DB>,
    for<'q> Option<String>: Encode<'q, DB> + Decode<'q, DB>,
    for<'a> &'a str: ColumnIndex<DB::Row>,
{
    fn decode_delete_task(row: &DB::Row) -> MetastoreResult<DeleteTask> {
        let index_uid: String = row.try_get("index_uid")?;
        let query: String = row.try_get("delete_query")?;
        let fields: Option<String> = row.try_get("default_search_fields")?;
        Ok(DeleteTask {
            index_uid: index_uid.parse().map_err(serde_err)?,
            opstamp: from_db(row.try_get("opstamp")?),
            create_timestamp: row.try_get("create_timestamp")?,
            delete_query: serde_json::from_str(&query).map_err(serde_err)?,
            default_search_fields: fields
                .map(|fields| serde_json::from_str(&fields).map_err(serde_err))
                .transpose()?,
            doc_mapping_uid: row.try_get("doc_mapping_uid")?,
        })
    }

    pub(super) async fn insert_delete_task(
        &self,
        index_uid: &IndexUid,
        delete_query: DeleteQuery,
        now: i64,
    ) -> MetastoreResult<DeleteTask> {
        let query_json = serde_json::to_string(&delete_query).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            // Bound to the settings of now, read under the index lock: an update of the index
            // waits for this transaction, and a later one cannot change what the task means.
            let config_row =
                sqlx::query::<DB>("SELECT index_config_json FROM indexes WHERE index_uid = $1")
                    .bind(index_uid.to_string())
                    .fetch_one(&mut *write.tx)
                    .await?;
            let config_json: String = config_row.try_get("index_config_json")?;
            let config =
                shale_config::IndexConfig::from_stored_json(&config_json).map_err(serde_err)?;
            let default_search_fields = config.search_settings.default_search_fields.clone();
            let doc_mapping_uid = config.doc_mapping.doc_mapping_uid.clone();
            let row = sqlx::query::<DB>(
                "SELECT CAST(COALESCE(MAX(opstamp), 0) AS BIGINT) AS last FROM delete_tasks \
                 WHERE index_uid = $1",
            )
            .bind(index_uid.to_string())
            .fetch_one(&mut *write.tx)
            .await?;
            let last: i64 = row.try_get("last")?;
            let opstamp = from_db(last)
                .checked_add(1)
                .ok_or_else(|| MetastoreError::FailedPrecondition("opstamps exhausted".into()))?;
            sqlx::query::<DB>(
                "INSERT INTO delete_tasks (index_uid, opstamp, create_timestamp, delete_query, \
                 default_search_fields, doc_mapping_uid) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(index_uid.to_string())
            .bind(to_db(opstamp))
            .bind(now)
            .bind(query_json)
            .bind(serde_json::to_string(&default_search_fields).map_err(serde_err)?)
            .bind(doc_mapping_uid.clone())
            .execute(&mut *write.tx)
            .await?;
            Ok(DeleteTask {
                index_uid: index_uid.clone(),
                opstamp,
                create_timestamp: now,
                delete_query,
                default_search_fields: Some(default_search_fields),
                doc_mapping_uid: Some(doc_mapping_uid),
            })
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn select_delete_tasks(
        &self,
        index_uid: &IndexUid,
        opstamp_gt: u64,
    ) -> MetastoreResult<Vec<DeleteTask>> {
        let mut conn = self.pool.acquire().await?;
        Self::delete_tasks_on(&mut conn, index_uid, opstamp_gt).await
    }

    /// The delete tasks of `index_uid` above `opstamp_gt`, by opstamp, read on `conn` (in
    /// its transaction, if any).
    pub(super) async fn delete_tasks_on(
        conn: &mut DB::Connection,
        index_uid: &IndexUid,
        opstamp_gt: u64,
    ) -> MetastoreResult<Vec<DeleteTask>> {
        // One round trip (searches call this every time): the index's row, joined with its
        // tasks past `opstamp_gt` — no row means no index, one row without a task means none.
        let rows = sqlx::query::<DB>(AssertSqlSafe(
            "SELECT i.index_uid AS index_uid, d.opstamp AS opstamp, \
             d.create_timestamp AS create_timestamp, d.delete_query AS delete_query, \
             d.default_search_fields AS default_search_fields, \
             d.doc_mapping_uid AS doc_mapping_uid \
             FROM indexes i LEFT JOIN delete_tasks d \
             ON d.index_uid = i.index_uid AND d.opstamp > $2 \
             WHERE i.index_uid = $1 ORDER BY d.opstamp"
                .to_string(),
        ))
        .bind(index_uid.to_string())
        .bind(to_db(opstamp_gt))
        .fetch_all(&mut *conn)
        .await?;
        if rows.is_empty() {
            return Err(super::index_not_found(index_uid));
        }
        let mut tasks = Vec::with_capacity(rows.len());
        for row in &rows {
            let opstamp: Option<i64> = row.try_get("opstamp")?;
            if opstamp.is_some() {
                tasks.push(Self::decode_delete_task(row)?);
            }
        }
        Ok(tasks)
    }

    /// See [`crate::Metastore::purge_delete_tasks`].
    pub(super) async fn delete_delete_tasks(
        &self,
        index_uid: &IndexUid,
        up_to: u64,
        marked_since: i64,
    ) -> MetastoreResult<usize> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            // Under the index lock: no split is published or merged meanwhile.
            Self::lock_index(&mut write.tx, index_uid).await?;
            let row = sqlx::query::<DB>(
                "SELECT CAST(COALESCE(MAX(opstamp), 0) AS BIGINT) AS newest FROM delete_tasks \
                 WHERE index_uid = $1",
            )
            .bind(index_uid.to_string())
            .fetch_one(&mut *write.tx)
            .await?;
            let newest: i64 = row.try_get("newest")?;
            let row = sqlx::query::<DB>(
                "SELECT CAST(MIN(delete_opstamp) AS BIGINT) AS least_clean FROM splits \
                 WHERE index_uid = $1 AND (split_state <> 'MarkedForDeletion' \
                 OR update_timestamp >= $2)",
            )
            .bind(index_uid.to_string())
            .bind(marked_since)
            .fetch_one(&mut *write.tx)
            .await?;
            let least_clean: Option<i64> = row.try_get("least_clean")?;
            let mut limit = up_to.min(from_db(newest).saturating_sub(1));
            if let Some(least_clean) = least_clean {
                limit = limit.min(from_db(least_clean));
            }
            if limit == 0 {
                return Ok(0);
            }
            let deleted = sqlx::query::<DB>(
                "DELETE FROM delete_tasks WHERE index_uid = $1 AND opstamp <= $2",
            )
            .bind(index_uid.to_string())
            .bind(to_db(limit))
            .execute(&mut *write.tx)
            .await?;
            Ok(DB::rows_affected(&deleted) as usize)
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn select_last_delete_opstamps(
        &self,
    ) -> MetastoreResult<BTreeMap<IndexUid, u64>> {
        let rows = sqlx::query::<DB>(
            "SELECT index_uid, CAST(MAX(opstamp) AS BIGINT) AS last FROM delete_tasks \
             GROUP BY index_uid",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let index_uid: String = row.try_get("index_uid")?;
                let last: i64 = row.try_get("last")?;
                Ok((index_uid.parse().map_err(serde_err)?, from_db(last)))
            })
            .collect()
    }
}
