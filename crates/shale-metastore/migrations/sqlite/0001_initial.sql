-- Shale metastore, SQLite schema v1. Unsigned 64-bit values (partition ids, positions,
-- counters) are stored bit-for-bit in signed INTEGER columns.

CREATE TABLE indexes (
    index_uid         TEXT    NOT NULL PRIMARY KEY,
    index_id          TEXT    NOT NULL UNIQUE,
    index_config_json TEXT    NOT NULL,
    create_timestamp  INTEGER NOT NULL
);

-- One row per (index, source, partition): the last published position.
CREATE TABLE checkpoints (
    index_uid    TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    source_id    TEXT    NOT NULL,
    partition_id TEXT    NOT NULL,
    position     INTEGER NOT NULL,
    PRIMARY KEY (index_uid, source_id, partition_id)
);

CREATE TABLE splits (
    split_id            TEXT    NOT NULL PRIMARY KEY,
    index_uid           TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    source_id           TEXT    NOT NULL,
    node_id             TEXT    NOT NULL,
    partition_id        INTEGER NOT NULL,
    doc_mapping_uid     TEXT    NOT NULL,
    split_state         TEXT    NOT NULL
        CHECK (split_state IN ('Staged', 'Published', 'MarkedForDeletion')),
    num_docs            INTEGER NOT NULL,
    size_bytes          INTEGER NOT NULL,
    time_range_start    INTEGER,
    time_range_end      INTEGER,
    tags                TEXT    NOT NULL, -- JSON array of strings
    create_timestamp    INTEGER NOT NULL,
    update_timestamp    INTEGER NOT NULL,
    publish_timestamp   INTEGER,
    maturity_timestamp  INTEGER NOT NULL,
    num_merge_ops       INTEGER NOT NULL,
    delete_opstamp      INTEGER NOT NULL,
    split_metadata_json TEXT    NOT NULL
);

CREATE INDEX splits_index_uid_state ON splits (index_uid, split_state);
CREATE INDEX splits_index_uid_time_range ON splits (index_uid, time_range_start, time_range_end);
CREATE INDEX splits_index_uid_update_timestamp ON splits (index_uid, update_timestamp);
