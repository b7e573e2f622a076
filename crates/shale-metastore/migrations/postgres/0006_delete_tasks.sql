-- Shale metastore schema v6: delete tasks. Each index numbers its tasks 1, 2, … (the
-- opstamp); a task deletes the documents matching its query that were acknowledged before it
-- was created.
CREATE TABLE delete_tasks (
    index_uid        TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    opstamp          BIGINT    NOT NULL,
    create_timestamp BIGINT    NOT NULL,
    delete_query     TEXT    NOT NULL, -- JSON: query, search_field, start/end timestamps
    PRIMARY KEY (index_uid, opstamp)
);
