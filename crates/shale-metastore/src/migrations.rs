//! Schema migrations, embedded in the binary: `migrations/{sqlite,postgres}/NNNN_name.sql`.
//! They run through sqlx's migrator (table `_sqlx_migrations`, checksums, PostgreSQL advisory
//! lock) when a metastore opens. To change the schema, add a file for BOTH backends and list
//! it below; never edit an applied migration.

use std::borrow::Cow;

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::SqlStr;

/// `(version, description, SQL)` of the SQLite migrations.
const SQLITE: &[(i64, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../migrations/sqlite/0001_initial.sql"),
    ),
    (
        2,
        "merge tasks",
        include_str!("../migrations/sqlite/0002_merge_tasks.sql"),
    ),
    (
        3,
        "typed merge scope",
        include_str!("../migrations/sqlite/0003_typed_merge_scope.sql"),
    ),
    (
        4,
        "cluster",
        include_str!("../migrations/sqlite/0004_cluster.sql"),
    ),
    (
        5,
        "merge kind",
        include_str!("../migrations/sqlite/0005_merge_kind.sql"),
    ),
    (
        6,
        "delete tasks",
        include_str!("../migrations/sqlite/0006_delete_tasks.sql"),
    ),
    (
        7,
        "compactions",
        include_str!("../migrations/sqlite/0007_compactions.sql"),
    ),
    (
        8,
        "index templates",
        include_str!("../migrations/sqlite/0008_index_templates.sql"),
    ),
    (
        9,
        "doc mapping versions",
        include_str!("../migrations/sqlite/0009_doc_mapping_versions.sql"),
    ),
    (
        10,
        "metric metadata",
        include_str!("../migrations/sqlite/0010_metric_metadata.sql"),
    ),
    (
        11,
        "index versions",
        include_str!("../migrations/sqlite/0011_index_versions.sql"),
    ),
    (
        12,
        "split versions",
        include_str!("../migrations/sqlite/0012_split_versions.sql"),
    ),
];

/// `(version, description, SQL)` of the PostgreSQL migrations.
const POSTGRES: &[(i64, &str, &str)] = &[
    (
        1,
        "initial",
        include_str!("../migrations/postgres/0001_initial.sql"),
    ),
    (
        2,
        "merge tasks",
        include_str!("../migrations/postgres/0002_merge_tasks.sql"),
    ),
    (
        3,
        "typed merge scope",
        include_str!("../migrations/postgres/0003_typed_merge_scope.sql"),
    ),
    (
        4,
        "cluster",
        include_str!("../migrations/postgres/0004_cluster.sql"),
    ),
    (
        5,
        "merge kind",
        include_str!("../migrations/postgres/0005_merge_kind.sql"),
    ),
    (
        6,
        "delete tasks",
        include_str!("../migrations/postgres/0006_delete_tasks.sql"),
    ),
    (
        7,
        "compactions",
        include_str!("../migrations/postgres/0007_compactions.sql"),
    ),
    (
        8,
        "index templates",
        include_str!("../migrations/postgres/0008_index_templates.sql"),
    ),
    (
        9,
        "doc mapping versions",
        include_str!("../migrations/postgres/0009_doc_mapping_versions.sql"),
    ),
    (
        10,
        "metric metadata",
        include_str!("../migrations/postgres/0010_metric_metadata.sql"),
    ),
    (
        11,
        "index versions",
        include_str!("../migrations/postgres/0011_index_versions.sql"),
    ),
    (
        12,
        "split versions",
        include_str!("../migrations/postgres/0012_split_versions.sql"),
    ),
];

fn migrator(migrations: &'static [(i64, &'static str, &'static str)]) -> Migrator {
    Migrator::with_migrations(
        migrations
            .iter()
            .map(|(version, description, sql)| {
                Migration::new(
                    *version,
                    Cow::Borrowed(*description),
                    MigrationType::Simple,
                    SqlStr::from_static(sql),
                    false,
                )
            })
            .collect(),
    )
}

/// The SQLite migrator.
pub(crate) fn sqlite() -> Migrator {
    migrator(SQLITE)
}

/// The PostgreSQL migrator.
pub(crate) fn postgres() -> Migrator {
    migrator(POSTGRES)
}
