-- Shale metastore, SQLite schema v2: merge tasks, claimed by any node under a lease.

CREATE TABLE merge_tasks (
    task_id          TEXT    NOT NULL PRIMARY KEY, -- ULID: sorts by creation time
    index_uid        TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    scope            TEXT    NOT NULL,
    split_ids        TEXT    NOT NULL, -- JSON array of the input split ids, in policy order
    task_state       TEXT    NOT NULL
        CHECK (task_state IN ('Pending', 'Running', 'Succeeded', 'Failed')),
    lease_owner      TEXT,
    lease_expires_at INTEGER,
    attempts         INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    output_split_ids TEXT    NOT NULL, -- JSON array, filled on success
    error            TEXT,
    compaction_id    TEXT,
    create_timestamp INTEGER NOT NULL,
    update_timestamp INTEGER NOT NULL
);

-- Claim (oldest claimable first) and listing.
CREATE INDEX merge_tasks_state_task_id ON merge_tasks (task_state, task_id);
CREATE INDEX merge_tasks_index_uid_state ON merge_tasks (index_uid, task_state);
-- Janitor.
CREATE INDEX merge_tasks_state_update_timestamp ON merge_tasks (task_state, update_timestamp);

-- The inputs of LIVE (Pending or Running) tasks only: rows are deleted when their task
-- finishes. The primary key makes "a split is in at most one live task" a constraint.
CREATE TABLE merge_task_splits (
    index_uid TEXT NOT NULL,
    split_id  TEXT NOT NULL,
    task_id   TEXT NOT NULL REFERENCES merge_tasks (task_id) ON DELETE CASCADE,
    PRIMARY KEY (index_uid, split_id)
);

CREATE INDEX merge_task_splits_task_id ON merge_task_splits (task_id);
