-- Shale metastore schema v7: why a merge task was planned (`policy`, `small_splits`,
-- `delete_ratio`, `delete_bytes`, `manual`), and manual compactions: one row per request,
-- its tasks pointing back to it through `merge_tasks.compaction_id`.
ALTER TABLE merge_tasks ADD COLUMN merge_trigger TEXT NOT NULL DEFAULT 'policy';
ALTER TABLE merge_tasks ADD COLUMN compaction_id TEXT;
CREATE INDEX merge_tasks_compaction_id ON merge_tasks (compaction_id);

CREATE TABLE compactions (
    compaction_id    TEXT COLLATE "C" NOT NULL PRIMARY KEY, -- ULID: sorts by creation time
    index_uid        TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    state            TEXT    NOT NULL
        CHECK (state IN ('pending', 'executing', 'completed', 'failed')),
    request          TEXT    NOT NULL, -- JSON: time range, force
    progress         TEXT    NOT NULL, -- JSON: plan counts, splits and bytes
    error            TEXT,
    create_timestamp BIGINT    NOT NULL,
    start_timestamp  BIGINT,
    finish_timestamp BIGINT,
    update_timestamp BIGINT    NOT NULL
);
CREATE INDEX compactions_index_uid ON compactions (index_uid, compaction_id);
