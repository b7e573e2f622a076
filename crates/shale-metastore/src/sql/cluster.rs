//! Cluster bookkeeping in SQL (tables `nodes`, `leases`, `shards`, migration 0004) and the
//! fence check every write transaction of a fenced handle runs first.
//!
//! Lock order (PostgreSQL): a fenced write reads the lease or node row `FOR SHARE` before
//! anything else, so a leader takeover (which updates the lease row) waits for the writes of
//! the previous leader in progress, and none of its writes commits after the takeover.

use shale_types::IndexUid;
use sqlx::{AssertSqlSafe, ColumnIndex, Decode, Encode, Executor, IntoArguments, Row, Type};

use super::{from_db, placeholders, serde_err, to_db, Dialect, SqlMetastore};
use crate::{
    Fence, Lease, MetastoreError, MetastoreResult, NodeIdentity, NodeRecord, Shard, ShardKey,
    ShardState, LEADER_LEASE,
};

const NODE_COLUMNS: &str = "cluster_id, node_id, generation, advertise_address, roles, \
     started_at_ms, last_heartbeat_ms, info";

const SHARD_COLUMNS: &str =
    "index_uid, source_id, shard_id, node_id, shard_state, create_timestamp, update_timestamp";

fn fenced(message: String) -> MetastoreError {
    MetastoreError::FailedPrecondition(format!("fenced: {message}"))
}

/// Milliseconds since the epoch on the cluster's clock (the metastore's).
pub(crate) fn now_ms() -> i64 {
    shale_types::clock::now_ms()
}

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
    /// A handle whose write transactions all check `fence` first.
    pub fn fenced(&self, fence: Fence) -> Self {
        SqlMetastore {
            fence: Some(fence),
            ..self.clone()
        }
    }

    /// `FailedPrecondition` unless `fence` holds (see [`Fence`]).
    pub(super) async fn check_fence(
        conn: &mut DB::Connection,
        fence: &Fence,
    ) -> MetastoreResult<()> {
        match fence {
            Fence::Leader {
                cluster_id,
                holder,
                fencing_token,
            } => {
                let sql = format!(
                    "SELECT holder_node_id, holder_generation, fencing_token, expires_at_ms \
                     FROM leases WHERE cluster_id = $1 AND name = $2{}",
                    DB::FOR_SHARE
                );
                let row = sqlx::query::<DB>(AssertSqlSafe(sql))
                    .bind(cluster_id.clone())
                    .bind(LEADER_LEASE.to_string())
                    .fetch_optional(&mut *conn)
                    .await?;
                let Some(row) = row else {
                    return Err(fenced("no leader lease".to_string()));
                };
                let holder_node_id: String = row.try_get("holder_node_id")?;
                let holder_generation: i64 = row.try_get("holder_generation")?;
                let token: i64 = row.try_get("fencing_token")?;
                let expires_at_ms: i64 = row.try_get("expires_at_ms")?;
                if holder_node_id != holder.node_id
                    || from_db(holder_generation) != holder.generation
                    || from_db(token) != *fencing_token
                {
                    return Err(fenced(format!(
                        "the leader lease is held by {holder_node_id}#{holder_generation} with \
                         token {token}, not by {holder} with token {fencing_token}"
                    )));
                }
                if expires_at_ms <= now_ms() {
                    return Err(fenced(format!("the leader lease of {holder} expired")));
                }
                Ok(())
            }
            Fence::Node {
                cluster_id,
                identity,
            } => {
                let sql = format!(
                    "SELECT generation FROM nodes WHERE cluster_id = $1 AND node_id = $2{}",
                    DB::FOR_SHARE
                );
                let row = sqlx::query::<DB>(AssertSqlSafe(sql))
                    .bind(cluster_id.clone())
                    .bind(identity.node_id.clone())
                    .fetch_optional(&mut *conn)
                    .await?;
                let generation: Option<i64> = match row {
                    Some(row) => Some(row.try_get("generation")?),
                    None => None,
                };
                match generation.map(from_db) {
                    Some(generation) if generation == identity.generation => Ok(()),
                    Some(generation) => Err(fenced(format!(
                        "{identity} was superseded by generation {generation}"
                    ))),
                    None => Err(fenced(format!("{identity} is not registered"))),
                }
            }
        }
    }

    fn decode_node(row: &DB::Row) -> MetastoreResult<NodeRecord> {
        let generation: i64 = row.try_get("generation")?;
        let roles: String = row.try_get("roles")?;
        let info: String = row.try_get("info")?;
        Ok(NodeRecord {
            cluster_id: row.try_get("cluster_id")?,
            node_id: row.try_get("node_id")?,
            generation: from_db(generation),
            advertise_address: row.try_get("advertise_address")?,
            roles: serde_json::from_str(&roles).map_err(serde_err)?,
            started_at_ms: row.try_get("started_at_ms")?,
            last_heartbeat_ms: row.try_get("last_heartbeat_ms")?,
            info: serde_json::from_str(&info).map_err(serde_err)?,
        })
    }

    fn decode_shard(row: &DB::Row) -> MetastoreResult<Shard> {
        let index_uid: String = row.try_get("index_uid")?;
        let state: String = row.try_get("shard_state")?;
        Ok(Shard {
            key: ShardKey {
                index_uid: index_uid.parse().map_err(serde_err)?,
                source_id: row.try_get("source_id")?,
                shard_id: row.try_get("shard_id")?,
            },
            node_id: row.try_get("node_id")?,
            state: ShardState::parse(&state)
                .ok_or_else(|| serde_err(format!("unknown shard state `{state}`")))?,
            create_timestamp: row.try_get("create_timestamp")?,
            update_timestamp: row.try_get("update_timestamp")?,
        })
    }

    /// See [`crate::Metastore::register_node`].
    pub(super) async fn register(
        &self,
        cluster_id: &str,
        node_id: &str,
        advertise_address: &str,
        roles: &[String],
        now_ms: i64,
    ) -> MetastoreResult<NodeRecord> {
        let roles_json = serde_json::to_string(roles).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let sql = format!(
                "SELECT generation FROM nodes WHERE cluster_id = $1 AND node_id = $2{}",
                DB::FOR_UPDATE
            );
            let previous: Option<i64> = match sqlx::query::<DB>(AssertSqlSafe(sql))
                .bind(cluster_id.to_string())
                .bind(node_id.to_string())
                .fetch_optional(&mut *write.tx)
                .await?
            {
                Some(row) => Some(row.try_get("generation")?),
                None => None,
            };
            let generation = previous.map_or(1, |g| from_db(g) + 1);
            sqlx::query::<DB>(
                "INSERT INTO nodes (cluster_id, node_id, generation, advertise_address, roles, \
                     started_at_ms, last_heartbeat_ms, info) \
                 VALUES ($1, $2, $3, $4, $5, $6, $6, '{}') \
                 ON CONFLICT (cluster_id, node_id) DO UPDATE SET \
                     generation = excluded.generation, \
                     advertise_address = excluded.advertise_address, roles = excluded.roles, \
                     started_at_ms = excluded.started_at_ms, \
                     last_heartbeat_ms = excluded.last_heartbeat_ms, info = excluded.info",
            )
            .bind(cluster_id.to_string())
            .bind(node_id.to_string())
            .bind(to_db(generation))
            .bind(advertise_address.to_string())
            .bind(roles_json.clone())
            .bind(now_ms)
            .execute(&mut *write.tx)
            .await?;
            Ok(NodeRecord {
                cluster_id: cluster_id.to_string(),
                node_id: node_id.to_string(),
                generation,
                advertise_address: advertise_address.to_string(),
                roles: roles.to_vec(),
                started_at_ms: now_ms,
                last_heartbeat_ms: now_ms,
                info: serde_json::json!({}),
            })
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::heartbeat_node`].
    pub(super) async fn heartbeat(
        &self,
        cluster_id: &str,
        identity: &NodeIdentity,
        info: &serde_json::Value,
        now_ms: i64,
    ) -> MetastoreResult<()> {
        let info = serde_json::to_string(info).map_err(serde_err)?;
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let updated = sqlx::query::<DB>(
                "UPDATE nodes SET last_heartbeat_ms = $4, info = $5 \
                 WHERE cluster_id = $1 AND node_id = $2 AND generation = $3",
            )
            .bind(cluster_id.to_string())
            .bind(identity.node_id.clone())
            .bind(to_db(identity.generation))
            .bind(now_ms)
            .bind(info)
            .execute(&mut *write.tx)
            .await?;
            if DB::rows_affected(&updated) == 0 {
                Self::check_fence(
                    &mut write.tx,
                    &Fence::Node {
                        cluster_id: cluster_id.to_string(),
                        identity: identity.clone(),
                    },
                )
                .await?;
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::list_nodes`].
    pub(super) async fn select_nodes(&self, cluster_id: &str) -> MetastoreResult<Vec<NodeRecord>> {
        let sql =
            format!("SELECT {NODE_COLUMNS} FROM nodes WHERE cluster_id = $1 ORDER BY node_id");
        let rows = sqlx::query::<DB>(AssertSqlSafe(sql))
            .bind(cluster_id.to_string())
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(Self::decode_node).collect()
    }

    /// See [`crate::Metastore::forget_nodes`].
    pub(super) async fn delete_nodes(
        &self,
        cluster_id: &str,
        heartbeat_before_ms: i64,
    ) -> MetastoreResult<usize> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let deleted = sqlx::query::<DB>(
                "DELETE FROM nodes WHERE cluster_id = $1 AND last_heartbeat_ms < $2",
            )
            .bind(cluster_id.to_string())
            .bind(heartbeat_before_ms)
            .execute(&mut *write.tx)
            .await?;
            Ok(DB::rows_affected(&deleted) as usize)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::acquire_lease`].
    pub(super) async fn try_acquire_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
        ttl_ms: u64,
        now_ms: i64,
    ) -> MetastoreResult<Option<Lease>> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            // Only the current generation of a node may hold a lease.
            Self::check_fence(
                &mut write.tx,
                &Fence::Node {
                    cluster_id: cluster_id.to_string(),
                    identity: holder.clone(),
                },
            )
            .await?;
            let sql = format!(
                "SELECT holder_node_id, holder_generation, fencing_token, expires_at_ms \
                 FROM leases WHERE cluster_id = $1 AND name = $2{}",
                DB::FOR_UPDATE
            );
            let row = sqlx::query::<DB>(AssertSqlSafe(sql))
                .bind(cluster_id.to_string())
                .bind(name.to_string())
                .fetch_optional(&mut *write.tx)
                .await?;
            let expires_at_ms = now_ms.saturating_add(i64::try_from(ttl_ms).unwrap_or(i64::MAX));
            let token = match row {
                None => {
                    // Concurrent candidates may all see no row: the first insert wins.
                    let inserted = sqlx::query::<DB>(
                        "INSERT INTO leases (cluster_id, name, holder_node_id, \
                             holder_generation, fencing_token, expires_at_ms) \
                         VALUES ($1, $2, $3, $4, 1, $5) \
                         ON CONFLICT (cluster_id, name) DO NOTHING",
                    )
                    .bind(cluster_id.to_string())
                    .bind(name.to_string())
                    .bind(holder.node_id.clone())
                    .bind(to_db(holder.generation))
                    .bind(expires_at_ms)
                    .execute(&mut *write.tx)
                    .await?;
                    if DB::rows_affected(&inserted) == 0 {
                        return Ok(None);
                    }
                    1
                }
                Some(row) => {
                    let holder_node_id: String = row.try_get("holder_node_id")?;
                    let holder_generation: i64 = row.try_get("holder_generation")?;
                    let token: i64 = row.try_get("fencing_token")?;
                    let expires: i64 = row.try_get("expires_at_ms")?;
                    let same_holder = holder_node_id == holder.node_id
                        && from_db(holder_generation) == holder.generation;
                    // An older generation of the same node is gone (fenced out): take over.
                    let superseded_holder = holder_node_id == holder.node_id
                        && from_db(holder_generation) < holder.generation;
                    if !same_holder && !superseded_holder && expires > now_ms {
                        return Ok(None);
                    }
                    let token = if same_holder && expires > now_ms {
                        from_db(token)
                    } else {
                        from_db(token) + 1
                    };
                    sqlx::query::<DB>(
                        "UPDATE leases SET holder_node_id = $3, holder_generation = $4, \
                             fencing_token = $5, expires_at_ms = $6 \
                         WHERE cluster_id = $1 AND name = $2",
                    )
                    .bind(cluster_id.to_string())
                    .bind(name.to_string())
                    .bind(holder.node_id.clone())
                    .bind(to_db(holder.generation))
                    .bind(to_db(token))
                    .bind(expires_at_ms)
                    .execute(&mut *write.tx)
                    .await?;
                    token
                }
            };
            Ok(Some(Lease {
                cluster_id: cluster_id.to_string(),
                name: name.to_string(),
                holder: holder.clone(),
                fencing_token: token,
                expires_at_ms,
            }))
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::release_lease`].
    pub(super) async fn give_up_lease(
        &self,
        cluster_id: &str,
        name: &str,
        holder: &NodeIdentity,
    ) -> MetastoreResult<()> {
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            sqlx::query::<DB>(
                "UPDATE leases SET expires_at_ms = 0 \
                 WHERE cluster_id = $1 AND name = $2 AND holder_node_id = $3 \
                     AND holder_generation = $4",
            )
            .bind(cluster_id.to_string())
            .bind(name.to_string())
            .bind(holder.node_id.clone())
            .bind(to_db(holder.generation))
            .execute(&mut *write.tx)
            .await?;
            Ok(())
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::get_lease`].
    pub(super) async fn select_lease(
        &self,
        cluster_id: &str,
        name: &str,
    ) -> MetastoreResult<Option<Lease>> {
        let row = sqlx::query::<DB>(
            "SELECT holder_node_id, holder_generation, fencing_token, expires_at_ms \
             FROM leases WHERE cluster_id = $1 AND name = $2",
        )
        .bind(cluster_id.to_string())
        .bind(name.to_string())
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let generation: i64 = row.try_get("holder_generation")?;
        let token: i64 = row.try_get("fencing_token")?;
        Ok(Some(Lease {
            cluster_id: cluster_id.to_string(),
            name: name.to_string(),
            holder: NodeIdentity {
                node_id: row.try_get("holder_node_id")?,
                generation: from_db(generation),
            },
            fencing_token: from_db(token),
            expires_at_ms: row.try_get("expires_at_ms")?,
        }))
    }

    /// See [`crate::Metastore::list_shards`].
    pub(super) async fn select_shards(
        &self,
        index_uid: Option<&IndexUid>,
    ) -> MetastoreResult<Vec<Shard>> {
        let rows = match index_uid {
            Some(index_uid) => {
                let sql = format!(
                    "SELECT {SHARD_COLUMNS} FROM shards WHERE index_uid = $1 \
                     ORDER BY source_id, shard_id"
                );
                sqlx::query::<DB>(AssertSqlSafe(sql))
                    .bind(index_uid.to_string())
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                let sql = format!(
                    "SELECT {SHARD_COLUMNS} FROM shards ORDER BY index_uid, source_id, shard_id"
                );
                sqlx::query::<DB>(AssertSqlSafe(sql))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(Self::decode_shard).collect()
    }

    /// See [`crate::Metastore::open_shards`].
    pub(super) async fn insert_shards(
        &self,
        shards: &[(ShardKey, String)],
    ) -> MetastoreResult<Vec<Shard>> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            let mut opened = Vec::with_capacity(shards.len());
            for (key, node_id) in shards {
                Self::lock_index(&mut write.tx, &key.index_uid).await?;
                sqlx::query::<DB>(
                    "INSERT INTO shards (index_uid, source_id, shard_id, node_id, shard_state, \
                         create_timestamp, update_timestamp) \
                     VALUES ($1, $2, $3, $4, 'Open', $5, $5)",
                )
                .bind(key.index_uid.to_string())
                .bind(key.source_id.clone())
                .bind(key.shard_id.clone())
                .bind(node_id.clone())
                .bind(now)
                .execute(&mut *write.tx)
                .await?;
                opened.push(Shard {
                    key: key.clone(),
                    node_id: node_id.clone(),
                    state: ShardState::Open,
                    create_timestamp: now,
                    update_timestamp: now,
                });
            }
            Ok(opened)
        }
        .await;
        write.finish(result).await
    }

    /// See [`crate::Metastore::close_shards`] and [`crate::Metastore::delete_shards`].
    pub(super) async fn update_or_delete_shards(
        &self,
        keys: &[ShardKey],
        delete: bool,
    ) -> MetastoreResult<()> {
        let now = shale_types::now_unix_secs();
        let mut write = self.begin_write().await?;
        let result: MetastoreResult<_> = async {
            for key in keys {
                let sql = if delete {
                    "DELETE FROM shards WHERE index_uid = $1 AND source_id = $2 \
                     AND shard_id IN ($3)"
                        .to_string()
                } else {
                    format!(
                        "UPDATE shards SET shard_state = 'Closed', update_timestamp = $4 \
                         WHERE index_uid = $1 AND source_id = $2 AND shard_id IN ({}) \
                         AND shard_state = 'Open'",
                        placeholders(3, 1)
                    )
                };
                let mut query = sqlx::query::<DB>(AssertSqlSafe(sql))
                    .bind(key.index_uid.to_string())
                    .bind(key.source_id.clone())
                    .bind(key.shard_id.clone());
                if !delete {
                    query = query.bind(now);
                }
                query.execute(&mut *write.tx).await?;
                if delete {
                    // A deleted shard was drained (everything it held is published) and its
                    // id is never reused: its checkpoint guards nothing any more.
                    sqlx::query::<DB>(
                        "DELETE FROM checkpoints WHERE index_uid = $1 AND source_id = $2 \
                         AND partition_id = $3",
                    )
                    .bind(key.index_uid.to_string())
                    .bind(key.source_id.clone())
                    .bind(key.shard_id.clone())
                    .execute(&mut *write.tx)
                    .await?;
                }
            }
            Ok(())
        }
        .await;
        write.finish(result).await
    }
}
