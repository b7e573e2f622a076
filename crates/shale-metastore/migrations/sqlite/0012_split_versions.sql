-- Lets a searcher refresh its view of an index by reading only what changed: every write
-- to a split row records the index version of its transaction, and deleting split rows
-- records the newest version among them (a view older than that reads the index whole,
-- since rows it would have needed to see are gone).
ALTER TABLE splits ADD COLUMN update_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE indexes ADD COLUMN splits_gone_version BIGINT NOT NULL DEFAULT 0;
CREATE INDEX splits_index_uid_update_version ON splits (index_uid, update_version);
