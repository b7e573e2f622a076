//! Index templates in SQL (table `index_templates`, migration 0008), shared by both backends.
//! A template is stored as its JSON; its id is the key.

use shale_config::IndexTemplate;
use sqlx::{ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{serde_err, Dialect, SqlMetastore};
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
    fn decode_template(row: &DB::Row) -> MetastoreResult<IndexTemplate> {
        let json: String = row.try_get("template_json")?;
        serde_json::from_str(&json).map_err(serde_err)
    }

    pub(super) async fn insert_template(&self, template: &IndexTemplate) -> MetastoreResult<()> {
        let json = serde_json::to_string(template).map_err(serde_err)?;
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let inserted = sqlx::query::<DB>(
                "INSERT INTO index_templates (template_id, template_json, create_timestamp, \
                     update_timestamp) \
                 VALUES ($1, $2, $3, $3)",
            )
            .bind(template.template_id.clone())
            .bind(json)
            .bind(now)
            .execute(&mut *write.tx)
            .await;
            match inserted {
                Ok(_) => Ok(()),
                Err(sqlx::Error::Database(err)) if err.is_unique_violation() => {
                    Err(MetastoreError::AlreadyExists {
                        kind: "index template",
                        id: template.template_id.clone(),
                    })
                }
                Err(err) => Err(err.into()),
            }
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn replace_template(&self, template: &IndexTemplate) -> MetastoreResult<()> {
        let json = serde_json::to_string(template).map_err(serde_err)?;
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let updated = sqlx::query::<DB>(
                "UPDATE index_templates SET template_json = $2, update_timestamp = $3 \
                 WHERE template_id = $1",
            )
            .bind(template.template_id.clone())
            .bind(json)
            .bind(now)
            .execute(&mut *write.tx)
            .await?;
            if DB::rows_affected(&updated) == 0 {
                return Err(MetastoreError::NotFound {
                    kind: "index template",
                    id: template.template_id.clone(),
                });
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    pub(super) async fn select_template(
        &self,
        template_id: &str,
    ) -> MetastoreResult<IndexTemplate> {
        let row =
            sqlx::query::<DB>("SELECT template_json FROM index_templates WHERE template_id = $1")
                .bind(template_id.to_string())
                .fetch_optional(&self.pool)
                .await?;
        match row {
            Some(row) => Self::decode_template(&row),
            None => Err(MetastoreError::NotFound {
                kind: "index template",
                id: template_id.to_string(),
            }),
        }
    }

    pub(super) async fn select_templates(&self) -> MetastoreResult<Vec<IndexTemplate>> {
        let rows =
            sqlx::query::<DB>("SELECT template_json FROM index_templates ORDER BY template_id")
                .fetch_all(&self.pool)
                .await?;
        rows.iter().map(Self::decode_template).collect()
    }

    pub(super) async fn remove_templates(&self, template_ids: &[String]) -> MetastoreResult<()> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            for template_id in template_ids {
                let deleted =
                    sqlx::query::<DB>("DELETE FROM index_templates WHERE template_id = $1")
                        .bind(template_id.clone())
                        .execute(&mut *write.tx)
                        .await?;
                if DB::rows_affected(&deleted) == 0 {
                    return Err(MetastoreError::NotFound {
                        kind: "index template",
                        id: template_id.clone(),
                    });
                }
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }
}
