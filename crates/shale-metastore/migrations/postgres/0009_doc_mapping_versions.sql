-- Shale metastore schema v9: every doc mapping version of an index is kept (the index config
-- of the day it was created), so that splits, WAL records and merges of an older version are
-- read and written with the mapping that shaped them. Delete tasks record what they meant
-- when they were created: the default search fields of that day and the doc mapping uid.
CREATE TABLE doc_mappings (
    index_uid         TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    doc_mapping_uid   TEXT    NOT NULL,
    index_config_json TEXT    NOT NULL,
    create_timestamp  BIGINT  NOT NULL,
    PRIMARY KEY (index_uid, doc_mapping_uid)
);

INSERT INTO doc_mappings (index_uid, doc_mapping_uid, index_config_json, create_timestamp)
SELECT index_uid, (index_config_json::jsonb) #>> '{doc_mapping,doc_mapping_uid}',
       index_config_json, create_timestamp
FROM indexes
WHERE (index_config_json::jsonb) #>> '{doc_mapping,doc_mapping_uid}' IS NOT NULL;

ALTER TABLE delete_tasks ADD COLUMN default_search_fields TEXT; -- JSON array, NULL: unbound
ALTER TABLE delete_tasks ADD COLUMN doc_mapping_uid TEXT;
