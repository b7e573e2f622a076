-- Shale metastore, SQLite schema v3.
-- 1. Merge tasks carry their merge scope as typed columns (the scope was an opaque string
--    matched by suffix). Merge tasks are derived state — the planner re-plans whatever is not
--    in a live task — so the tables are recreated empty: a merge running across the upgrade
--    fails to publish (its task is gone), discards its output, and is planned again.
-- 2. The planner reads only immature Published splits: an index for that.

DROP TABLE merge_task_splits;
DROP TABLE merge_tasks;

CREATE TABLE merge_tasks (
    task_id               TEXT    NOT NULL PRIMARY KEY, -- ULID: sorts by creation time
    index_uid             TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    scope_source_id       TEXT    NOT NULL,
    scope_partition_id    INTEGER NOT NULL,
    scope_doc_mapping_uid TEXT    NOT NULL,
    scope_node_id         TEXT,             -- NULL: cluster scope; else node_local scope
    split_ids             TEXT    NOT NULL, -- JSON array of the input split ids, in policy order
    task_state            TEXT    NOT NULL
        CHECK (task_state IN ('Pending', 'Running', 'Succeeded', 'Failed')),
    lease_owner           TEXT,
    lease_expires_at      INTEGER,
    attempts              INTEGER NOT NULL,
    max_attempts          INTEGER NOT NULL,
    output_split_ids      TEXT    NOT NULL, -- JSON array, filled on success
    error                 TEXT,
    create_timestamp      INTEGER NOT NULL,
    update_timestamp      INTEGER NOT NULL
);

CREATE INDEX merge_tasks_state_task_id ON merge_tasks (task_state, task_id);
CREATE INDEX merge_tasks_index_uid_state ON merge_tasks (index_uid, task_state);
CREATE INDEX merge_tasks_state_update_timestamp ON merge_tasks (task_state, update_timestamp);
CREATE INDEX merge_tasks_scope_node_id ON merge_tasks (scope_node_id, task_state);

CREATE TABLE merge_task_splits (
    index_uid TEXT NOT NULL,
    split_id  TEXT NOT NULL,
    task_id   TEXT NOT NULL REFERENCES merge_tasks (task_id) ON DELETE CASCADE,
    PRIMARY KEY (index_uid, split_id)
);

CREATE INDEX merge_task_splits_task_id ON merge_task_splits (task_id);

CREATE INDEX splits_index_uid_state_maturity ON splits (index_uid, split_state, maturity_timestamp);
