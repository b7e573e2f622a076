-- A number every write that touches an index (its splits, delete tasks, config, shards,
-- merge tasks) raises in its transaction: searchers keep a view of an index's splits and
-- delete tasks, and read only this number to know it is still current.
ALTER TABLE indexes ADD COLUMN version BIGINT NOT NULL DEFAULT 0;
