//! Manual compactions in SQL (table `compactions`, migration 0007), shared by both backends.

use shale_types::IndexUid;
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{serde_err, Dialect, SqlMetastore};
use crate::{
    Compaction, CompactionProgress, CompactionRequest, CompactionState, MetastoreError,
    MetastoreResult,
};

const COMPACTION_COLUMNS: &str = "compaction_id, index_uid, state, request, progress, error, \
     create_timestamp, start_timestamp, finish_timestamp, update_timestamp";

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
    fn decode_compaction(row: &DB::Row) -> MetastoreResult<Compaction> {
        let index_uid: String = row.try_get("index_uid")?;
        let state: String = row.try_get("state")?;
        let request: String = row.try_get("request")?;
        let progress: String = row.try_get("progress")?;
        Ok(Compaction {
            compaction_id: row.try_get("compaction_id")?,
            index_uid: index_uid.parse().map_err(serde_err)?,
            state: CompactionState::parse(&state)
                .ok_or_else(|| serde_err(format!("unknown compaction state `{state}`")))?,
            request: serde_json::from_str(&request).map_err(serde_err)?,
            progress: serde_json::from_str(&progress).map_err(serde_err)?,
            error: row.try_get("error")?,
            create_timestamp: row.try_get("create_timestamp")?,
            start_timestamp: row.try_get("start_timestamp")?,
            finish_timestamp: row.try_get("finish_timestamp")?,
            update_timestamp: row.try_get("update_timestamp")?,
        })
    }

    pub(super) async fn insert_compaction(
        &self,
        index_uid: &IndexUid,
        request: CompactionRequest,
        now: i64,
    ) -> MetastoreResult<Compaction> {
        let compaction = Compaction {
            compaction_id: super::merge_tasks::next_task_id(),
            index_uid: index_uid.clone(),
            state: CompactionState::Pending,
            request,
            progress: CompactionProgress::default(),
            error: None,
            create_timestamp: now,
            start_timestamp: None,
            finish_timestamp: None,
            update_timestamp: now,
        };
        let request_json = serde_json::to_string(&compaction.request).map_err(serde_err)?;
        let progress_json = serde_json::to_string(&compaction.progress).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            Self::lock_index(&mut write.tx, index_uid).await?;
            sqlx::query::<DB>(
                "INSERT INTO compactions (compaction_id, index_uid, state, request, progress, \
                     error, create_timestamp, start_timestamp, finish_timestamp, \
                     update_timestamp) \
                 VALUES ($1, $2, $3, $4, $5, NULL, $6, NULL, NULL, $6)",
            )
            .bind(compaction.compaction_id.clone())
            .bind(index_uid.to_string())
            .bind(compaction.state.as_str().to_string())
            .bind(request_json)
            .bind(progress_json)
            .bind(now)
            .execute(&mut *write.tx)
            .await?;
            Ok(compaction)
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn select_compactions(
        &self,
        index_uid: Option<&IndexUid>,
        states: &[CompactionState],
    ) -> MetastoreResult<Vec<Compaction>> {
        let mut filters = String::new();
        if index_uid.is_some() {
            filters.push_str(" AND index_uid = $1");
        }
        if !states.is_empty() {
            let names: Vec<String> = states
                .iter()
                .map(|state| format!("'{}'", state.as_str()))
                .collect();
            filters.push_str(&format!(" AND state IN ({})", names.join(", ")));
        }
        let sql = format!(
            "SELECT {COMPACTION_COLUMNS} FROM compactions WHERE 1 = 1{filters} \
             ORDER BY compaction_id DESC"
        );
        let mut query = sqlx::query::<DB>(AssertSqlSafe(sql));
        if let Some(index_uid) = index_uid {
            query = query.bind(index_uid.to_string());
        }
        let rows = query.fetch_all(&self.pool).await?;
        rows.iter().map(Self::decode_compaction).collect()
    }

    pub(super) async fn store_compaction(&self, compaction: &Compaction) -> MetastoreResult<()> {
        let progress_json = serde_json::to_string(&compaction.progress).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let updated = sqlx::query::<DB>(
                "UPDATE compactions SET state = $3, progress = $4, error = $5, \
                     start_timestamp = $6, finish_timestamp = $7, update_timestamp = $8 \
                 WHERE compaction_id = $1 AND index_uid = $2",
            )
            .bind(compaction.compaction_id.clone())
            .bind(compaction.index_uid.to_string())
            .bind(compaction.state.as_str().to_string())
            .bind(progress_json)
            .bind(compaction.error.clone())
            .bind(compaction.start_timestamp)
            .bind(compaction.finish_timestamp)
            .bind(compaction.update_timestamp)
            .execute(&mut *write.tx)
            .await?;
            if DB::rows_affected(&updated) == 0 {
                return Err(MetastoreError::NotFound {
                    kind: "compaction",
                    id: compaction.compaction_id.clone(),
                });
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }
}
