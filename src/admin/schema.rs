//! Schema migrations: numbered, forward-only SQL files embedded in the
//! binary, applied in order under an advisory lock, followed by the
//! idempotent trigger and function definitions of `functions/`.
//!
//! Three `pgwake migrate` processes started at once serialise on the lock:
//! the first applies everything, the others find nothing left to do.
//!
//! Migrate never stalls producers or claims:
//! - on an up-to-date schema it changes nothing and takes no lock on
//!   `pgwake.jobs`: each `functions/` file is applied only when its text
//!   differs from the one recorded in `pgwake.schema_definitions`, and the
//!   trigger itself is created only when it is missing;
//! - whatever must change runs with `lock_timeout` ([`LOCK_TIMEOUT_DEFAULT`]):
//!   behind a running claim it gives up the lock queue after that long (so
//!   inserts and claims queued behind it go on) and tries again, up to
//!   [`LOCK_RETRIES_DEFAULT`] times, logging each wait.

use std::time::Duration;

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
        sql: include_str!("../../migrations/0001_jobs.sql"),
    },
    Migration {
        version: 2,
        name: "0002_leases.sql",
        sql: include_str!("../../migrations/0002_leases.sql"),
    },
    Migration {
        version: 3,
        name: "0003_waiting_workers.sql",
        sql: include_str!("../../migrations/0003_waiting_workers.sql"),
    },
    Migration {
        version: 4,
        name: "0004_schedules.sql",
        sql: include_str!("../../migrations/0004_schedules.sql"),
    },
    Migration {
        version: 5,
        name: "0005_delivery_v2.sql",
        sql: include_str!("../../migrations/0005_delivery_v2.sql"),
    },
    Migration {
        version: 6,
        name: "0006_history.sql",
        sql: include_str!("../../migrations/0006_history.sql"),
    },
    Migration {
        version: 7,
        name: "0007_cancel.sql",
        sql: include_str!("../../migrations/0007_cancel.sql"),
    },
    Migration {
        version: 8,
        name: "0008_keys.sql",
        sql: include_str!("../../migrations/0008_keys.sql"),
    },
    Migration {
        version: 9,
        name: "0009_queues.sql",
        sql: include_str!("../../migrations/0009_queues.sql"),
    },
    Migration {
        version: 10,
        name: "0010_rate.sql",
        sql: include_str!("../../migrations/0010_rate.sql"),
    },
    Migration {
        version: 11,
        name: "0011_claim_costs.sql",
        sql: include_str!("../../migrations/0011_claim_costs.sql"),
    },
    Migration {
        version: 12,
        name: "0012_claim_functions.sql",
        sql: include_str!("../../migrations/0012_claim_functions.sql"),
    },
    Migration {
        version: 13,
        name: "0013_ready_queues_function.sql",
        sql: include_str!("../../migrations/0013_ready_queues_function.sql"),
    },
    Migration {
        version: 14,
        name: "0014_bounds.sql",
        sql: include_str!("../../migrations/0014_bounds.sql"),
    },
    Migration {
        version: 15,
        name: "0015_running_limits.sql",
        sql: include_str!("../../migrations/0015_running_limits.sql"),
    },
    Migration {
        version: 16,
        name: "0016_workers.sql",
        sql: include_str!("../../migrations/0016_workers.sql"),
    },
    Migration {
        version: 17,
        name: "0017_held_keys.sql",
        sql: include_str!("../../migrations/0017_held_keys.sql"),
    },
    Migration {
        version: 18,
        name: "0018_schedule_enabled.sql",
        sql: include_str!("../../migrations/0018_schedule_enabled.sql"),
    },
    Migration {
        version: 19,
        name: "0019_job_errors.sql",
        sql: include_str!("../../migrations/0019_job_errors.sql"),
    },
    Migration {
        version: 20,
        name: "0020_limit_keys.sql",
        sql: include_str!("../../migrations/0020_limit_keys.sql"),
    },
    Migration {
        version: 21,
        name: "0021_key_rates.sql",
        sql: include_str!("../../migrations/0021_key_rates.sql"),
    },
    Migration {
        version: 22,
        name: "0022_key_slot_gaps.sql",
        sql: include_str!("../../migrations/0022_key_slot_gaps.sql"),
    },
    Migration {
        version: 23,
        name: "0023_key_walk_bound.sql",
        sql: include_str!("../../migrations/0023_key_walk_bound.sql"),
    },
    Migration {
        version: 24,
        name: "0024_buffered_leases.sql",
        sql: include_str!("../../migrations/0024_buffered_leases.sql"),
    },
    Migration {
        version: 25,
        name: "0025_task_printable.sql",
        sql: include_str!("../../migrations/0025_task_printable.sql"),
    },
    Migration {
        version: 26,
        name: "0026_role_grants.sql",
        sql: include_str!("../../migrations/0026_role_grants.sql"),
    },
    Migration {
        version: 27,
        name: "0027_producer_bounds.sql",
        sql: include_str!("../../migrations/0027_producer_bounds.sql"),
    },
    // 28 is another branch's (numbers taken before this one).
    Migration {
        version: 29,
        name: "0029_worker_processes.sql",
        sql: include_str!("../../migrations/0029_worker_processes.sql"),
    },
    // 30 and 31 are other branches' (numbers taken before this one).
    Migration {
        version: 32,
        name: "0032_pressure.sql",
        sql: include_str!("../../migrations/0032_pressure.sql"),
    },
    Migration {
        version: 33,
        name: "0033_minute_stats.sql",
        sql: include_str!("../../migrations/0033_minute_stats.sql"),
    },
    Migration {
        version: 34,
        name: "0034_snoozes.sql",
        sql: include_str!("../../migrations/0034_snoozes.sql"),
    },
    Migration {
        version: 35,
        name: "0035_batch_job_index.sql",
        sql: include_str!("../../migrations/0035_batch_job_index.sql"),
    },
    Migration {
        version: 36,
        name: "0036_batch_marks_by_job.sql",
        sql: include_str!("../../migrations/0036_batch_marks_by_job.sql"),
    },
    Migration {
        version: 37,
        name: "0037_progress.sql",
        sql: include_str!("../../migrations/0037_progress.sql"),
    },
    Migration {
        version: 38,
        name: "0038_trace_context.sql",
        sql: include_str!("../../migrations/0038_trace_context.sql"),
    },
    Migration {
        version: 39,
        name: "0039_flows.sql",
        sql: include_str!("../../migrations/0039_flows.sql"),
    },
    Migration {
        version: 40,
        name: "0040_steps.sql",
        sql: include_str!("../../migrations/0040_steps.sql"),
    },
    Migration {
        version: 41,
        name: "0041_waits.sql",
        sql: include_str!("../../migrations/0041_waits.sql"),
    },
    Migration {
        version: 42,
        name: "0042_signals.sql",
        sql: include_str!("../../migrations/0042_signals.sql"),
    },
    Migration {
        version: 43,
        name: "0043_flow_results.sql",
        sql: include_str!("../../migrations/0043_flow_results.sql"),
    },
    Migration {
        version: 44,
        name: "0044_batches.sql",
        sql: include_str!("../../migrations/0044_batches.sql"),
    },
    Migration {
        version: 45,
        name: "0045_flow_release.sql",
        sql: include_str!("../../migrations/0045_flow_release.sql"),
    },
];

/// The functions and triggers of `functions/`, re-applied by every migrate
/// whose text changed, in this order.
pub const FUNCTIONS: &[(&str, &str)] = &[
    ("notify.sql", include_str!("../../functions/notify.sql")),
    ("traces.sql", include_str!("../../functions/traces.sql")),
    ("steps.sql", include_str!("../../functions/steps.sql")),
    ("signals.sql", include_str!("../../functions/signals.sql")),
    ("keys.sql", include_str!("../../functions/keys.sql")),
    ("flows.sql", include_str!("../../functions/flows.sql")),
    ("enqueue.sql", include_str!("../../functions/enqueue.sql")),
    (
        "schedules.sql",
        include_str!("../../functions/schedules.sql"),
    ),
    ("cancel.sql", include_str!("../../functions/cancel.sql")),
    ("queues.sql", include_str!("../../functions/queues.sql")),
    ("pressure.sql", include_str!("../../functions/pressure.sql")),
    ("claims.sql", include_str!("../../functions/claims.sql")),
    ("rescue.sql", include_str!("../../functions/rescue.sql")),
    ("workers.sql", include_str!("../../functions/workers.sql")),
    ("jobs.sql", include_str!("../../functions/jobs.sql")),
    (
        "queue_pressure.sql",
        include_str!("../../functions/queue_pressure.sql"),
    ),
    ("roles.sql", include_str!("../../functions/roles.sql")),
];

/// The schema version this binary was built for.
pub fn latest_version() -> i32 {
    MIGRATIONS.last().map(|m| m.version).unwrap_or(0)
}

/// Advisory lock key that serialises migrations, held by `pgwake migrate`
/// while it runs: a constant, so every version of pgwake uses the same key.
/// A starting worker waits while it is held (see [`pending`]).
pub const MIGRATE_LOCK_KEY: i64 = 0x7067_7761_6b65_6d67; // "pgwakemg"

/// How long one migration step may wait for a table lock before it steps
/// out of the lock queue (letting producers and claims through) to retry.
pub const LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(1);
/// How often a step that cannot get its lock is tried before migrate gives up.
pub const LOCK_RETRIES_DEFAULT: u32 = 60;
/// Pause between tries (doubling, capped at [`LOCK_RETRY_PAUSE_MAX`]).
pub const LOCK_RETRY_PAUSE_MIN: Duration = Duration::from_millis(200);
/// Longest pause between tries.
pub const LOCK_RETRY_PAUSE_MAX: Duration = Duration::from_secs(5);

/// How migrate waits for locks.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct MigrateOptions {
    /// `lock_timeout` of every step. Default [`LOCK_TIMEOUT_DEFAULT`].
    pub lock_timeout: Duration,
    /// Tries per step. Default [`LOCK_RETRIES_DEFAULT`].
    pub lock_retries: u32,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            lock_timeout: LOCK_TIMEOUT_DEFAULT,
            lock_retries: LOCK_RETRIES_DEFAULT,
        }
    }
}

/// What a migrate run did.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this run (empty when the schema was current).
    pub applied: Vec<i32>,
    /// `functions/` files (re)applied because their text changed (empty when
    /// nothing changed).
    pub definitions: Vec<&'static str>,
    /// Functions of the schema whose EXECUTE this run took from PUBLIC:
    /// the ones created by this run (a new function is executable by every
    /// role by default) or left so by an older pgwake.
    pub revoked_public: Vec<String>,
    /// The roles whose grants this run re-applied (every role recorded in
    /// `pgwake.role_grants` by `pgwake.grant_*`, after any change), so that
    /// tables and functions an upgrade added are theirs too.
    pub grants: Vec<RoleGrant>,
    /// The schema version afterwards.
    pub version: i32,
}

impl MigrateReport {
    /// Whether the run changed nothing.
    pub fn unchanged(&self) -> bool {
        self.applied.is_empty() && self.definitions.is_empty() && self.revoked_public.is_empty()
    }
}

/// A role given pgwake's grants, as recorded in `pgwake.role_grants`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleGrant {
    /// The role's name.
    pub role: String,
    /// `producer`, `worker` or `monitor`: which `pgwake.grant_*` it got.
    pub kind: String,
}

/// Take EXECUTE on every function of the schema from PUBLIC.
const REVOKE_PUBLIC: &str = "REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgwake FROM PUBLIC";

/// The schema's functions that PUBLIC (every role) may execute: the default
/// ACL of a function, which `CREATE FUNCTION` gives and `CREATE OR REPLACE`
/// keeps.
const PUBLIC_FUNCTIONS: &str = "SELECT p.oid::regprocedure::text
     FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
     WHERE p.pronamespace = 'pgwake'::regnamespace
       AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
     ORDER BY 1";

/// Apply every pending migration and every changed `functions/` file, under
/// the migrate advisory lock, with the default lock waits. Refuses a schema
/// newer than this binary.
pub async fn migrate(client: &mut Client) -> Result<MigrateReport> {
    migrate_with(client, &MigrateOptions::default()).await
}

/// [`migrate`] with explicit lock waits.
pub async fn migrate_with(client: &mut Client, opts: &MigrateOptions) -> Result<MigrateReport> {
    migrate_list(client, opts, MIGRATIONS).await
}

/// [`migrate_with`] with `migrations` in place of [`MIGRATIONS`] (sorted by
/// version): an upgrade to a version this binary does not ship, or only up
/// to an older one, for tests and benchmarks of the runner. The
/// `functions/` of this binary are applied all the same.
#[doc(hidden)]
pub async fn migrate_list(
    client: &mut Client,
    opts: &MigrateOptions,
    migrations: &[Migration],
) -> Result<MigrateReport> {
    take_migrate_lock(client).await?;
    let result = migrate_locked(client, opts, migrations).await;
    // Unlock even when a migration failed; a lost connection drops it anyway.
    let _ = client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATE_LOCK_KEY])
        .await;
    result
}

/// Take the migrate lock (session level), waiting for another migrate by
/// trying again every 20 ms to 1 s rather than in `pg_advisory_lock`: a
/// waiter blocked in that statement is a transaction holding a snapshot,
/// and the other migrate's `CREATE INDEX CONCURRENTLY` waits for every such
/// transaction to end, which would be a deadlock. Between tries a waiter
/// holds nothing.
async fn take_migrate_lock(client: &Client) -> Result<()> {
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        let taken: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&MIGRATE_LOCK_KEY])
            .await
            .map_err(Error::db("cannot take the migration lock"))?
            .get(0);
        if taken {
            return Ok(());
        }
        if pause == std::time::Duration::from_millis(20) {
            tracing::info!("another `pgwake migrate` holds the migration lock: waiting for it");
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(std::time::Duration::from_secs(1));
    }
}

async fn migrate_locked(
    client: &mut Client,
    opts: &MigrateOptions,
    migrations: &[Migration],
) -> Result<MigrateReport> {
    let latest = migrations.last().map(|m| m.version).unwrap_or(0);
    // Only when missing: CREATE … IF NOT EXISTS on an existing object still
    // needs the CREATE privilege on the database.
    let bootstrapped: bool = client
        .query_one(
            "SELECT to_regclass('pgwake.schema_definitions') IS NOT NULL",
            &[],
        )
        .await
        .map_err(Error::db("cannot read the schema version"))?
        .get(0);
    if !bootstrapped {
        let created = client
            .batch_execute(
                // client_min_messages: `IF NOT EXISTS` on an existing schema
                // is the normal case, not news (no "NOTICE: … skipping").
                "BEGIN;
                 SET LOCAL client_min_messages = warning;
                 CREATE SCHEMA IF NOT EXISTS pgwake;
                 CREATE TABLE IF NOT EXISTS pgwake.schema_migrations (
                     version    integer PRIMARY KEY,
                     name       text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 );
                 CREATE TABLE IF NOT EXISTS pgwake.schema_definitions (
                     name       text PRIMARY KEY,
                     sql        text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now()
                 );
                 COMMIT;",
            )
            .await;
        if let Err(source) = created {
            // Leave the caller's session usable: end the failed transaction.
            let _ = client.batch_execute("ROLLBACK").await;
            return Err(Error::Db {
                context: "cannot create the pgwake schema",
                source,
            });
        }
    }
    let current = current_version(client).await?.unwrap_or(0);
    if current > latest {
        return Err(newer_schema(current));
    }
    // A schema that already keeps its functions from PUBLIC (and records
    // its roles) stays so at every commit of this run: each step revokes
    // PUBLIC's EXECUTE from what it created, in its own transaction, so a
    // run that stops halfway leaves no function every role may call. On the
    // upgrade to this rule the revoke waits for the last step, which gives
    // the recorded roles their functions in the same transaction.
    let hardened: bool = client
        .query_one(
            &format!(
                "SELECT to_regclass('pgwake.role_grants') IS NOT NULL AND NOT EXISTS ({PUBLIC_FUNCTIONS})"
            ),
            &[],
        )
        .await
        .map_err(Error::db("cannot read the functions' privileges"))?
        .get(0);
    let mut applied = Vec::new();
    for &m in migrations.iter().filter(|m| m.version > current) {
        let steps = steps(m)?;
        if steps.len() <= 1 && steps.iter().all(|s| s.transaction) {
            with_lock_retries(client, opts, m.name, move |tx| {
                Box::pin(async move {
                    tx.batch_execute(m.sql).await?;
                    if hardened {
                        tx.batch_execute(REVOKE_PUBLIC).await?;
                    }
                    tx.execute(
                        "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, $2)",
                        &[&m.version, &m.name],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await?;
        } else {
            apply_steps(client, opts, m, &steps, hardened).await?;
        }
        // Debug: the caller reports the steps (`pgwake migrate` prints the
        // returned report), so an info line here would say each one twice.
        tracing::debug!(version = m.version, name = m.name, "applied migration");
        applied.push(m.version);
    }
    let recorded: std::collections::HashMap<String, String> = client
        .query("SELECT name, sql FROM pgwake.schema_definitions", &[])
        .await
        .map_err(Error::db("cannot read the applied definitions"))?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut definitions = Vec::new();
    for (name, sql) in FUNCTIONS {
        if recorded.get(*name).map(String::as_str) == Some(*sql) {
            continue;
        }
        with_lock_retries(client, opts, name, |tx| {
            Box::pin(async move {
                tx.batch_execute(sql).await?;
                if hardened {
                    tx.batch_execute(REVOKE_PUBLIC).await?;
                }
                tx.execute(
                    "INSERT INTO pgwake.schema_definitions (name, sql) VALUES ($1, $2)
                     ON CONFLICT (name) DO UPDATE SET sql = excluded.sql, applied_at = now()",
                    &[name, sql],
                )
                .await?;
                Ok(())
            })
        })
        .await?;
        tracing::debug!(file = name, "applied definition");
        definitions.push(*name);
    }
    // No function of the schema stays executable by PUBLIC: a function a
    // migration or a definition created has the default ACL (EXECUTE to
    // PUBLIC), and several run as their owner (SECURITY DEFINER). The roles
    // get what they need from `pgwake.grant_*` (`functions/roles.sql`),
    // re-applied here for every role recorded in `pgwake.role_grants`, so
    // an upgrade that added a table or a function leaves none without its
    // grants. Per-schema default privileges cannot do this: `ALTER DEFAULT
    // PRIVILEGES IN SCHEMA … REVOKE … FROM PUBLIC` only removes what was
    // granted per schema, never the global default. Reading the catalog
    // takes no lock; REVOKE and GRANT lock no table. One transaction, so a
    // recorded role never misses a function it had (the first upgrade to
    // this rule takes PUBLIC's EXECUTE and gives each role its own at once).
    let revoked_public: Vec<String> = client
        .query(PUBLIC_FUNCTIONS, &[])
        .await
        .map_err(Error::db("cannot read the functions' privileges"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut grants = Vec::new();
    if !revoked_public.is_empty() || !applied.is_empty() || !definitions.is_empty() {
        let granted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        with_lock_retries(client, opts, "privileges", |tx| {
            let granted = granted.clone();
            Box::pin(async move {
                tx.batch_execute(REVOKE_PUBLIC).await?;
                let rows = tx
                    .query(
                        "SELECT role_name::text, kind FROM pgwake.apply_grants()
                         WHERE to_regprocedure('pgwake.apply_grants()') IS NOT NULL",
                        &[],
                    )
                    .await?;
                *granted.lock().unwrap() = rows
                    .iter()
                    .map(|r| RoleGrant {
                        role: r.get(0),
                        kind: r.get(1),
                    })
                    .collect();
                Ok(())
            })
        })
        .await?;
        grants = std::mem::take(&mut *granted.lock().unwrap());
        tracing::debug!(
            revoked = revoked_public.len(),
            roles = grants.len(),
            "revoked EXECUTE from PUBLIC, re-applied the recorded roles' grants"
        );
    }
    Ok(MigrateReport {
        applied,
        definitions,
        revoked_public,
        grants,
        version: latest.max(current),
    })
}

/// The marker that starts a step of a migration: `-- pgwake:step` (a
/// step in a transaction of its own) or `-- pgwake:step no-transaction`
/// (one statement run outside any transaction, for `CREATE INDEX
/// CONCURRENTLY`). See "Writing migrations" in ARCHITECTURE.md.
pub const STEP_MARKER: &str = "-- pgwake:step";

/// One step of a migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The step's SQL.
    pub sql: &'static str,
    /// Whether it runs in a transaction (with `lock_timeout` and retry).
    pub transaction: bool,
}

/// A migration's steps: the text between [`STEP_MARKER`] lines (text
/// before the first marker is a transaction step; a chunk of only comments
/// is none). A file without markers is one transaction step.
pub fn steps(m: Migration) -> Result<Vec<Step>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut transaction = true;
    let mut offset = 0;
    let sql = m.sql;
    let push = |chunk: &'static str, transaction: bool, out: &mut Vec<Step>| {
        let has_sql = chunk
            .lines()
            .map(str::trim)
            .any(|l| !l.is_empty() && !l.starts_with("--"));
        if has_sql {
            out.push(Step {
                sql: chunk,
                transaction,
            });
        }
    };
    for line in sql.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(kind) = trimmed.strip_prefix(STEP_MARKER) {
            push(&sql[start..offset], transaction, &mut out);
            transaction = match kind.trim() {
                "" => true,
                "no-transaction" => false,
                other => {
                    return Err(Error::Schema(format!(
                        "migration {}: unknown step kind {other:?} (`{STEP_MARKER}` or `{STEP_MARKER} no-transaction`)",
                        m.name
                    )))
                }
            };
            start = offset + line.len();
        }
        offset += line.len();
    }
    push(&sql[start..], transaction, &mut out);
    for s in out.iter().filter(|s| !s.transaction) {
        let upper = s.sql.to_ascii_uppercase();
        if upper.contains("CONCURRENTLY")
            && upper.contains("CREATE")
            && !upper.contains("IF NOT EXISTS")
        {
            return Err(Error::Schema(format!(
                "migration {}: a CREATE INDEX CONCURRENTLY step must say IF NOT EXISTS (a step runs again after a crash)",
                m.name
            )));
        }
    }
    Ok(out)
}

/// The index a no-transaction step creates concurrently, if it does:
/// the name after `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS`.
fn concurrent_index(sql: &str) -> Option<String> {
    let words: Vec<String> = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .flat_map(str::split_whitespace)
        .map(str::to_string)
        .collect();
    let at = words.windows(3).position(|w| {
        w[0].eq_ignore_ascii_case("IF")
            && w[1].eq_ignore_ascii_case("NOT")
            && w[2].eq_ignore_ascii_case("EXISTS")
    })?;
    if !words[..at]
        .iter()
        .any(|w| w.eq_ignore_ascii_case("CONCURRENTLY"))
    {
        return None;
    }
    let name = words.get(at + 3)?;
    let name = name.rsplit('.').next().unwrap_or(name);
    Some(name.trim_matches('"').to_string())
}

/// Apply a migration of several steps, each recorded in
/// `pgwake.schema_migration_steps` as it ends, so that a run that stopped
/// between steps (a crash, a failed step) resumes after the last one done.
async fn apply_steps(
    client: &mut Client,
    opts: &MigrateOptions,
    m: Migration,
    steps: &[Step],
    hardened: bool,
) -> Result<()> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('pgwake.schema_migration_steps') IS NOT NULL",
            &[],
        )
        .await
        .map_err(Error::db("cannot read the migration steps"))?
        .get(0);
    if !exists {
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS pgwake.schema_migration_steps (
                     version    integer NOT NULL,
                     step       integer NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now(),
                     PRIMARY KEY (version, step)
                 )",
            )
            .await
            .map_err(Error::db("cannot create pgwake.schema_migration_steps"))?;
    }
    let done: Vec<i32> = client
        .query(
            "SELECT step FROM pgwake.schema_migration_steps WHERE version = $1",
            &[&m.version],
        )
        .await
        .map_err(Error::db("cannot read the migration steps"))?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (i, &step) in steps.iter().enumerate() {
        let i = i as i32;
        if done.contains(&i) {
            tracing::info!(
                name = m.name,
                step = i,
                "step done by an earlier run; resuming after it"
            );
            continue;
        }
        let label = format!("{} step {i}", m.name);
        if step.transaction {
            with_lock_retries(client, opts, &label, move |tx| {
                Box::pin(async move {
                    tx.batch_execute(step.sql).await?;
                    if hardened {
                        tx.batch_execute(REVOKE_PUBLIC).await?;
                    }
                    tx.execute(
                        "INSERT INTO pgwake.schema_migration_steps (version, step) VALUES ($1, $2)",
                        &[&m.version, &i],
                    )
                    .await?;
                    Ok(())
                })
            })
            .await?;
        } else {
            run_outside_transaction(client, &label, step.sql).await?;
            client
                .execute(
                    "INSERT INTO pgwake.schema_migration_steps (version, step) VALUES ($1, $2)",
                    &[&m.version, &i],
                )
                .await
                .map_err(Error::db("cannot record a migration step"))?;
        }
        tracing::debug!(
            name = m.name,
            step = i,
            transaction = step.transaction,
            "applied step"
        );
    }
    with_lock_retries(client, opts, m.name, move |tx| {
        Box::pin(async move {
            tx.execute(
                "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, $2)",
                &[&m.version, &m.name],
            )
            .await?;
            tx.execute(
                "DELETE FROM pgwake.schema_migration_steps WHERE version = $1",
                &[&m.version],
            )
            .await?;
            Ok(())
        })
    })
    .await
}

/// Run one statement outside any transaction. What such a step may do
/// takes no lock that stops inserts or claims (`CREATE INDEX CONCURRENTLY`,
/// `DROP INDEX CONCURRENTLY`, `VALIDATE CONSTRAINT`: SHARE UPDATE
/// EXCLUSIVE), so it waits for its lock and for older transactions as long
/// as they take (`lock_timeout = 0`): stepping aside would only leave an
/// invalid index to build again. An index that an earlier, interrupted
/// build left INVALID is dropped (concurrently) and built again; `IF NOT
/// EXISTS` alone would keep it, unused and updated by every insert.
async fn run_outside_transaction(client: &Client, label: &str, sql: &str) -> Result<()> {
    client
        .batch_execute("SET lock_timeout = 0; SET client_min_messages = warning")
        .await
        .map_err(Error::db("cannot set lock_timeout"))?;
    let result = async {
        if let Some(index) = concurrent_index(sql) {
            let invalid: bool = client
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                                    WHERE c.relnamespace = 'pgwake'::regnamespace
                                      AND c.relname = $1 AND NOT i.indisvalid)",
                    &[&index],
                )
                .await?
                .get(0);
            if invalid {
                tracing::warn!(
                    step = label,
                    index,
                    "an earlier build left the index invalid; dropping it to build it again"
                );
                client
                    .batch_execute(&format!(
                        "DROP INDEX CONCURRENTLY IF EXISTS pgwake.{}",
                        quote_ident(&index)
                    ))
                    .await?;
            }
        }
        client.batch_execute(sql).await
    }
    .await;
    let _ = client
        .batch_execute("RESET lock_timeout; RESET client_min_messages")
        .await;
    result.map_err(|source| {
        tracing::error!(step = label, "migration step failed");
        Error::Db {
            context: "migration failed",
            source,
        }
    })
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

type StepFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::result::Result<(), tokio_postgres::Error>>
            + Send
            + 'a,
    >,
>;

/// Run one migration step in its own transaction with `lock_timeout`; when
/// the lock is not available in time, roll back (leaving the lock queue, so
/// producers and claims waiting behind us go on) and try again later.
async fn with_lock_retries<F>(
    client: &mut Client,
    opts: &MigrateOptions,
    step: &str,
    f: F,
) -> Result<()>
where
    F: for<'a> Fn(&'a tokio_postgres::Transaction<'a>) -> StepFuture<'a>,
{
    let mut pause = LOCK_RETRY_PAUSE_MIN;
    let timeout_ms = opts.lock_timeout.as_millis().max(1) as u64;
    for attempt in 1..=opts.lock_retries.max(1) {
        let tx = client
            .transaction()
            .await
            .map_err(Error::db("cannot begin a migration step"))?;
        // client_min_messages: `IF NOT EXISTS` notices are not news.
        tx.batch_execute(&format!(
            "SET LOCAL lock_timeout = {timeout_ms}; SET LOCAL client_min_messages = warning"
        ))
        .await
        .map_err(Error::db("cannot set lock_timeout"))?;
        let r = match f(&tx).await {
            Ok(()) => tx.commit().await,
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => return Ok(()),
            Err(e) if e.code().map(|c| c.code()) == Some("55P03") => {
                tracing::warn!(
                    step,
                    attempt,
                    of = opts.lock_retries,
                    retry_in = ?pause,
                    "a table is busy (lock not granted within lock_timeout); stepped aside so producers and claims go on, retrying"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(LOCK_RETRY_PAUSE_MAX);
            }
            Err(source) => {
                tracing::error!(step, "migration step failed");
                return Err(Error::Db {
                    context: "migration failed",
                    source,
                });
            }
        }
    }
    Err(Error::Schema(format!(
        "migration step {step} could not get its table lock in {} tries of {:?} (a long transaction holds pgwake.jobs?); nothing was changed by this step; run `pgwake migrate` again when the long transaction has ended",
        opts.lock_retries, opts.lock_timeout
    )))
}

/// The applied schema version, or `None` when pgwake was never migrated here.
/// Unnamed statements (`query_typed`): the commands check the schema through
/// whatever pooler `DATABASE_URL` names.
pub async fn current_version(client: &Client) -> Result<Option<i32>> {
    let exists: bool = client
        .query_typed_one(
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
        .query_typed_one("SELECT max(version) FROM pgwake.schema_migrations", &[])
        .await
        .map_err(Error::db("cannot read the schema version"))?
        .get(0);
    Ok(v)
}

fn newer_schema(found: i32) -> Error {
    Error::SchemaNewer {
        found,
        known: latest_version(),
    }
}

/// A schema not ready for this binary yet, in a way `pgwake migrate` ends:
/// what a starting worker waits for (a schema newer than the binary is an
/// error instead, [`Error::SchemaNewer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// No pgwake schema in this database: never migrated.
    Missing,
    /// The schema is at this older version.
    Older(i32),
    /// A `pgwake migrate` holds the migration lock ([`MIGRATE_LOCK_KEY`]):
    /// the schema, at this version if any, is being changed.
    Migrating(Option<i32>),
}

impl std::fmt::Display for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let needs = latest_version();
        match self {
            Pending::Missing => write!(
                f,
                "the pgwake schema is missing from this database; run `pgwake migrate` first"
            ),
            Pending::Older(v) => write!(
                f,
                "the pgwake schema is at version {v}, this pgwake needs {needs}; run `pgwake migrate`"
            ),
            Pending::Migrating(None) => write!(
                f,
                "`pgwake migrate` is running (the pgwake schema is being created; this pgwake needs version {needs})"
            ),
            Pending::Migrating(Some(v)) => write!(
                f,
                "`pgwake migrate` is running (the pgwake schema is at version {v}, this pgwake needs {needs})"
            ),
        }
    }
}

/// Where the schema stands for a worker about to start: `None` when it is
/// this binary's version and no migrate is running, the [`Pending`] state
/// when a migrate will (or does) bring it there, [`Error::SchemaNewer`]
/// when it is newer than this binary. Inside a transaction, a migrate that
/// starts after this call waits for its end (the migration lock is taken
/// shared for the transaction), so the answer holds until then.
pub async fn pending(client: &Client) -> Result<Option<Pending>> {
    let free: bool = client
        .query_typed_one(
            "SELECT pg_try_advisory_xact_lock_shared($1)",
            &[(&MIGRATE_LOCK_KEY, tokio_postgres::types::Type::INT8)],
        )
        .await
        .map_err(Error::db("cannot check for a running migrate"))?
        .get(0);
    let version = current_version(client).await?;
    Ok(match version {
        Some(v) if v > latest_version() => return Err(newer_schema(v)),
        _ if !free => Some(Pending::Migrating(version)),
        None => Some(Pending::Missing),
        Some(v) if v < latest_version() => Some(Pending::Older(v)),
        Some(_) => None,
    })
}

/// Check the schema a command is about to use: present, and exactly the
/// version this binary knows. The error is one line that says what to run.
pub async fn check(client: &Client) -> Result<()> {
    match current_version(client).await? {
        None => Err(Error::Schema(Pending::Missing.to_string())),
        Some(v) if v > latest_version() => Err(newer_schema(v)),
        Some(v) if v < latest_version() => Err(Error::Schema(Pending::Older(v).to_string())),
        Some(_) => Ok(()),
    }
}
