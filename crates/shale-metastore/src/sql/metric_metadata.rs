//! Metric metadata in SQL (table `metric_metadata`, migration 0010), shared by both backends:
//! one row per (index, metric family), the last written kept.

use shale_types::{IndexUid, MetricMetadata};
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{Dialect, SqlMetastore};
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
    pub(super) async fn write_metric_metadata(
        &self,
        index_uid: &IndexUid,
        metadata: &[MetricMetadata],
    ) -> MetastoreResult<()> {
        if metadata.is_empty() {
            return Ok(());
        }
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let exists = sqlx::query::<DB>("SELECT 1 AS one FROM indexes WHERE index_uid = $1")
                .bind(index_uid.to_string())
                .fetch_optional(&mut *write.tx)
                .await?;
            if exists.is_none() {
                return Err(MetastoreError::NotFound {
                    kind: "index",
                    id: index_uid.to_string(),
                });
            }
            for entry in metadata {
                sqlx::query::<DB>(
                    "INSERT INTO metric_metadata (index_uid, metric_family, metric_type, help, \
                         unit, update_timestamp) \
                     VALUES ($1, $2, $3, $4, $5, $6) \
                     ON CONFLICT (index_uid, metric_family) DO UPDATE SET \
                         metric_type = excluded.metric_type, help = excluded.help, \
                         unit = excluded.unit, update_timestamp = excluded.update_timestamp",
                )
                .bind(index_uid.to_string())
                .bind(entry.metric_family.clone())
                .bind(entry.metric_type.clone())
                .bind(entry.help.clone())
                .bind(entry.unit.clone())
                .bind(now)
                .execute(&mut *write.tx)
                .await?;
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn select_metric_metadata(
        &self,
        index_uid: &IndexUid,
    ) -> MetastoreResult<Vec<MetricMetadata>> {
        let rows = sqlx::query::<DB>(
            "SELECT metric_family, metric_type, help, unit FROM metric_metadata \
             WHERE index_uid = $1 ORDER BY metric_family",
        )
        .bind(index_uid.to_string())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(MetricMetadata {
                    metric_family: row.try_get("metric_family")?,
                    metric_type: row.try_get("metric_type")?,
                    help: row.try_get("help")?,
                    unit: row.try_get("unit")?,
                })
            })
            .collect()
    }
}
