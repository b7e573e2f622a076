-- Shale metastore schema v8: index templates (the config of indexes created on their first
-- write when their id matches one of the template's patterns).
CREATE TABLE index_templates (
    template_id      TEXT    NOT NULL PRIMARY KEY,
    template_json    TEXT    NOT NULL,
    create_timestamp BIGINT  NOT NULL,
    update_timestamp BIGINT  NOT NULL
);
