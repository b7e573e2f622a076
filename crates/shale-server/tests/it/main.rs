//! The integration tests of `shale-server`, in one binary (one link of the whole dependency
//! graph instead of one per file): each module is one area.

mod common;

mod aggregations;
mod api;
mod api_table;
mod api_token;
mod cluster;
mod compaction;
mod compaction_controls;
mod data_dir_paths;
mod dates;
mod deletes;
mod doc_mapping_options;
mod elastic;
mod elastic_more;
mod elastic_read;
mod field_types;
mod full_disk;
mod grafana_dashboard;
mod index_update;
mod limits;
mod locality;
mod metrics_compaction;
mod metrics_endpoint;
mod metrics_ingest;
mod otel_sdk;
mod otlp;
mod otlp_grpc;
mod partial_cache;
mod postgres_s3;
mod promql_diff;
mod query_errors;
mod readme_examples;
mod request_forms;
mod s3_faults;
mod sorting;
mod sql;
mod templates;
mod time_filter;
mod time_order;
mod time_travel;
mod ui;
mod unreachable_storage;
mod update_safety;
mod version;
