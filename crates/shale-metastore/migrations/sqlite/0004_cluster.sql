-- Shale metastore, SQLite schema v4: cluster membership, leases and shards.
-- Times in milliseconds since the epoch, from the writer's clock.

-- One row per node of a cluster; a registration bumps the generation (fencing: a zombie of
-- an older generation is refused).
CREATE TABLE nodes (
    cluster_id        TEXT    NOT NULL,
    node_id           TEXT    NOT NULL,
    generation        INTEGER NOT NULL,
    advertise_address TEXT    NOT NULL,
    roles             TEXT    NOT NULL, -- JSON array of role names
    started_at_ms     INTEGER NOT NULL,
    last_heartbeat_ms INTEGER NOT NULL,
    info              TEXT    NOT NULL, -- JSON object the node reports with its heartbeats
    PRIMARY KEY (cluster_id, node_id)
);

-- Named leases (the leader's); the fencing token grows whenever the holder changes.
CREATE TABLE leases (
    cluster_id        TEXT    NOT NULL,
    name              TEXT    NOT NULL,
    holder_node_id    TEXT    NOT NULL,
    holder_generation INTEGER NOT NULL,
    fencing_token     INTEGER NOT NULL,
    expires_at_ms     INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, name)
);

-- The shards of each (index, source): which node hosts each, open (accepting documents) or
-- closed (its node publishes what it holds, then deletes it).
CREATE TABLE shards (
    index_uid        TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    source_id        TEXT    NOT NULL,
    shard_id         TEXT    NOT NULL,
    node_id          TEXT    NOT NULL,
    shard_state      TEXT    NOT NULL CHECK (shard_state IN ('Open', 'Closed')),
    create_timestamp INTEGER NOT NULL,
    update_timestamp INTEGER NOT NULL,
    PRIMARY KEY (index_uid, source_id, shard_id)
);

CREATE INDEX shards_node_id ON shards (node_id);
