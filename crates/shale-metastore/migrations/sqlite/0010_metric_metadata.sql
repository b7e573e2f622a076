-- Shale metastore schema v10: metric metadata of metrics indexes (type, help and unit of a
-- metric family, as Prometheus remote write and OTLP send them), the last written kept.
CREATE TABLE metric_metadata (
    index_uid        TEXT    NOT NULL REFERENCES indexes (index_uid) ON DELETE CASCADE,
    metric_family    TEXT    NOT NULL,
    metric_type      TEXT    NOT NULL,
    help             TEXT    NOT NULL,
    unit             TEXT    NOT NULL,
    update_timestamp BIGINT  NOT NULL,
    PRIMARY KEY (index_uid, metric_family)
);
