//! Schema migrations: numbered, forward-only SQL files embedded in the
//! binary, applied in order under an advisory lock, followed by the
//! idempotent trigger and function definitions of `triggers/`.
//!
//! Three `pgwake migrate` processes started at once serialise on the lock:
//! the first applies everything, the others find nothing left to do.

use tokio_postgres::Client;

use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Version number; migrations apply in ascending order.
    pub version: i32,
    /// File name, for logs.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

/// Every migration this binary knows, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "0001_jobs.sql",
        sql: include_str!("../migrations/0001_jobs.sql"),
    },
    Migration {
        version: 2,
        name: "0002_leases.sql",
        sql: include_str!("../migrations/0002_leases.sql"),
    },
    Migration {
        version: 3,
        name: "0003_waiting_workers.sql",
        sql: include_str!("../migrations/0003_waiting_workers.sql"),
    },
];

/// Idempotent definitions re-applied by every migrate.
pub const TRIGGERS: &[(&str, &str)] = &[
    ("notify.sql", include_str!("../triggers/notify.sql")),
    ("enqueue.sql", include_str!("../triggers/enqueue.sql")),
];

/// The schema version this binary was built for.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map(|m| m.version).unwrap_or(0)
}

/// Advisory lock key that serialises migrations: `hashtext('pgwake.migrate')`
/// computed once, as a constant, so every version of pgwake uses the same key.
const MIGRATE_LOCK_KEY: i64 = 0x7067_7761_6b65_6d67; // "pgwakemg"

/// What a migrate run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this run (empty when the schema was current).
    pub applied: Vec<i32>,
    /// The schema version afterwards.
    pub version: i32,
}

/// Apply every pending migration and re-apply the triggers, under the
/// migrate advisory lock. Refuses a schema newer than this binary.
pub async fn migrate(client: &mut Client) -> Result<MigrateReport> {
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATE_LOCK_KEY])
        .await
        .map_err(Error::db("cannot take the migration lock"))?;
    let result = migrate_locked(client).await;
    // Unlock even when a migration failed; a lost connection drops it anyway.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATE_LOCK_KEY])
        .await;
    result
}

async fn migrate_locked(client: &mut Client) -> Result<MigrateReport> {
    client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS pgwake;
             CREATE TABLE IF NOT EXISTS pgwake.schema_migrations (
                 version    integer PRIMARY KEY,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now()
             );",
        )
        .await
        .map_err(Error::db("cannot create the pgwake schema"))?;
    let current = current_version(client).await?.unwrap_or(0);
    if current > latest_version() {
        return Err(newer_schema(current));
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        let tx = client
            .transaction()
            .await
            .map_err(Error::db("cannot begin a migration"))?;
        tx.batch_execute(m.sql).await.map_err(|source| Error::Db {
            context: "migration failed",
            source,
        })?;
        tx.execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .map_err(Error::db("cannot record a migration"))?;
        tx.commit()
            .await
            .map_err(Error::db("cannot commit a migration"))?;
        tracing::info!(version = m.version, name = m.name, "applied migration");
        applied.push(m.version);
    }
    let tx = client
        .transaction()
        .await
        .map_err(Error::db("cannot begin the trigger definitions"))?;
    for (name, sql) in TRIGGERS {
        tx.batch_execute(sql).await.map_err(|source| {
            tracing::error!(file = name, "trigger definition failed");
            Error::Db {
                context: "applying triggers/ failed",
                source,
            }
        })?;
    }
    tx.commit()
        .await
        .map_err(Error::db("cannot commit the trigger definitions"))?;
    Ok(MigrateReport {
        applied,
        version: latest_version().max(current),
    })
}

/// The applied schema version, or `None` when pgwake was never migrated here.
pub async fn current_version(client: &Client) -> Result<Option<i32>> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('pgwake.schema_migrations') IS NOT NULL",
            &[],
        )
        .await
        .map_err(Error::db("cannot read the schema version"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let v: Option<i32> = client
        .query_one("SELECT max(version) FROM pgwake.schema_migrations", &[])
        .await
        .map_err(Error::db("cannot read the schema version"))?
        .get(0);
    Ok(v)
}

fn newer_schema(found: i32) -> Error {
    Error::Schema(format!(
        "the pgwake schema is at version {found}, newer than this pgwake knows ({}); upgrade pgwake",
        latest_version()
    ))
}

/// Check the schema a worker is about to use: present, and exactly the
/// version this binary knows. The error is one line that says what to run.
pub async fn check(client: &Client) -> Result<()> {
    match current_version(client).await? {
        None => Err(Error::Schema(
            "the pgwake schema is missing from this database; run `pgwake migrate` first".into(),
        )),
        Some(v) if v > latest_version() => Err(newer_schema(v)),
        Some(v) if v < latest_version() => Err(Error::Schema(format!(
            "the pgwake schema is at version {v}, this pgwake needs {}; run `pgwake migrate`",
            latest_version()
        ))),
        Some(_) => Ok(()),
    }
}
