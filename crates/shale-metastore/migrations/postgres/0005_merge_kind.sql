-- Shale metastore schema v5: a merge task records what its merge does (`merge`: the inputs
-- become one split; `locality`: the inputs of one time bucket are rewritten as level-1
-- splits cut at sort-key boundaries). Existing tasks are plain merges.
ALTER TABLE merge_tasks ADD COLUMN merge_kind TEXT NOT NULL DEFAULT 'merge';
