-- Shale metastore, PostgreSQL schema v1. Unsigned 64-bit values (partition ids, positions,
-- counters) are stored bit-for-bit in signed BIGINT columns.
-- Ids compare byte-wise (COLLATE "C"), as in SQLite, whatever the database locale.

CREATE TABLE indexes (
    index_uid         TEXT    NOT NULL PRIMARY KEY,
    index_id          TEXT    COLLATE "C" NOT NULL UNIQUE,
    index_config_json TEXT    NOT NULL,
    create_timestamp  BIGINT  NOT NULL
);

-- One row per (index, source, partition): the last published position.
CREATE TABLE checkpoints (
    index_uid    TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    source_id    TEXT    NOT NULL,
    partition_id TEXT    NOT NULL,
    position     BIGINT  NOT NULL,
    PRIMARY KEY (index_uid, source_id, partition_id)
);

CREATE TABLE splits (
    split_id            TEXT    COLLATE "C" NOT NULL PRIMARY KEY,
    index_uid           TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    source_id           TEXT    NOT NULL,
    node_id             TEXT    NOT NULL,
    partition_id        BIGINT  NOT NULL,
    doc_mapping_uid     TEXT    NOT NULL,
    split_state         TEXT    NOT NULL
        CHECK (split_state IN ('Staged', 'Published', 'MarkedForDeletion')),
    num_docs            BIGINT  NOT NULL,
    size_bytes          BIGINT  NOT NULL,
    time_range_start    BIGINT ,
    time_range_end      BIGINT ,
    tags                TEXT    NOT NULL, -- JSON array of strings
    create_timestamp    BIGINT  NOT NULL,
    update_timestamp    BIGINT  NOT NULL,
    publish_timestamp   BIGINT ,
    maturity_timestamp  BIGINT  NOT NULL,
    num_merge_ops       BIGINT  NOT NULL,
    delete_opstamp      BIGINT  NOT NULL,
    split_metadata_json TEXT    NOT NULL
);

CREATE INDEX splits_index_uid_state ON splits (index_uid, split_state);
CREATE INDEX splits_index_uid_time_range ON splits (index_uid, time_range_start, time_range_end);
CREATE INDEX splits_index_uid_update_timestamp ON splits (index_uid, update_timestamp);
