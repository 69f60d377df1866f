//! The bench's own database: a throwaway durable cluster (fsync on: commits
//! cost what they cost in production) or a fresh `pgwake_bench_<random>`
//! database on the server of `--database-url`; migrated with
//! [`pgwake::admin::schema::migrate`], reset before every measured run, and removed
//! at the end.

use std::time::Duration;

use pgwake::connect::DbConfig as Config;
use serde::Serialize;
use tokio_postgres::Client;

use crate::embedded::{Cluster, ClusterOptions};
use pgwake::connect;
use pgwake::error::{Error, Result};

/// Queue of every bench job but the producer phase's.
pub(crate) const QUEUE: &str = "bench";
/// Task name of every bench job.
pub(crate) const TASK: &str = "noop";
/// `application_name` of the bench's own connections.
pub(crate) const CONTROL_APP: &str = "pgwake-bench";

/// A producer's single-row insert (autocommit), as `pgwake.enqueue` does it.
pub(crate) const INSERT_ONE: &str =
    "INSERT INTO pgwake.jobs (queue, task) VALUES ($1, $2) RETURNING id";
const LOAD: &str = include_str!("sql/load.sql");
const TABLE_COUNTERS: &str = include_str!("sql/table_counters.sql");
/// Connections a server keeps for superusers by default.
const RESERVED_CONNECTIONS: usize = 3;

/// The server the bench ran on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServerInfo {
    /// A throwaway cluster started by the bench (else `--database-url`).
    pub embedded: bool,
    /// `server_version`.
    pub version: String,
    /// `fsync`.
    pub fsync: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `shared_buffers`.
    pub shared_buffers: String,
    /// Whether every reset could CHECKPOINT (needs superuser or
    /// `pg_checkpoint`); without it, runs start at different WAL positions
    /// relative to the last checkpoint and full-page writes vary.
    pub checkpoint_on_reset: bool,
}

/// A bulk load of no-op jobs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Load {
    /// How many.
    pub jobs: u64,
    /// On which queue.
    pub queue: &'static str,
    /// Every second job scheduled an hour ahead.
    pub half_future: bool,
    /// Let the trigger NOTIFY (one notification for the whole statement);
    /// `false` loads with `SET LOCAL pgwake.notify = off`.
    pub notify: bool,
    /// Their task ([`TASK`] but for a handler that serves only its own).
    pub task: &'static str,
}

impl Load {
    /// `jobs` ready jobs on the bench queue, announced by one NOTIFY.
    pub fn ready(jobs: u64) -> Load {
        Load {
            jobs,
            queue: QUEUE,
            half_future: false,
            notify: true,
            task: TASK,
        }
    }
}

/// Row versions made dead and dead tuples now, summed or per table.
#[derive(Debug, Clone, Default)]
pub(crate) struct TableCounters {
    /// `(table, dead made so far, dead now)`.
    pub tables: Vec<(String, f64, f64)>,
}

/// The bench's database and its control connection.
pub(crate) struct BenchDb {
    cluster: Option<Cluster>,
    admin: Config,
    name: String,
    /// Connection settings of the bench database.
    pub config: Config,
    control: Client,
    /// `pgwake` tables that hold jobs and their traces, for TRUNCATE and
    /// VACUUM; not the schema's bookkeeping nor the one-row settings
    /// (`history_settings`: a worker refuses to start without its row).
    tables: String,
    /// What the server is.
    pub server: ServerInfo,
}

impl BenchDb {
    /// Start a throwaway cluster (`url` = `None`) or use the server of
    /// `url`; create and migrate a fresh database there. `connections` is
    /// how many the bench will open at most.
    pub async fn create(url: Option<&str>, connections: usize) -> Result<BenchDb> {
        let (cluster, admin) = match url {
            Some(url) => (None, connect::parse_url(url)?),
            None => {
                let cluster = tokio::task::spawn_blocking(|| {
                    Cluster::start_with(ClusterOptions {
                        durable: true,
                        settings: vec![("max_connections".into(), "300".into())],
                        ..ClusterOptions::default()
                    })
                })
                .await
                .map_err(|_| Error::Panicked("starting the throwaway PostgreSQL"))??;
                let admin = connect::parse_url(&cluster.url("postgres"))?;
                (Some(cluster), admin)
            }
        };
        let name = format!("pgwake_bench_{:08x}", rand::random::<u32>());
        let admin_client =
            connect::connect(&connect::with_application_name(&admin, CONTROL_APP)).await?;
        admin_client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .map_err(Error::db(
                "bench: cannot create the bench database (the user needs CREATEDB)",
            ))?;
        drop(admin_client);
        let mut config = admin.clone();
        config.dbname(&name);
        match open(&config, cluster.is_some(), connections).await {
            Ok((control, tables, server)) => Ok(BenchDb {
                cluster,
                admin,
                name,
                config,
                control,
                tables,
                server,
            }),
            Err(e) => {
                let _ = drop_database(&admin, &name).await;
                Err(e)
            }
        }
    }

    /// Drop the database (or stop and delete the throwaway cluster).
    pub async fn remove(self) -> Result<()> {
        drop(self.control);
        match self.cluster {
            Some(mut cluster) => tokio::task::spawn_blocking(move || cluster.shutdown())
                .await
                .map_err(|_| Error::Panicked("stopping the throwaway PostgreSQL")),
            None => drop_database(&self.admin, &self.name).await,
        }
    }

    /// A new connection to the bench database.
    pub async fn connect(&self, application_name: &str) -> Result<Client> {
        connect::connect(&connect::with_application_name(
            &self.config,
            application_name,
        ))
        .await
    }

    /// Empty every pgwake table, re-enable the trigger, VACUUM ANALYZE and
    /// CHECKPOINT, so that no run inherits dead tuples, statistics or
    /// dirty buffers from the one before.
    pub async fn reset(&self) -> Result<()> {
        self.control
            .batch_execute(&format!(
                "ALTER TABLE pgwake.jobs ENABLE TRIGGER jobs_notify; TRUNCATE {}",
                self.tables
            ))
            .await
            .map_err(Error::db("bench: reset"))?;
        self.control
            .batch_execute(&format!("VACUUM ANALYZE {}", self.tables))
            .await
            .map_err(Error::db("bench: vacuum"))?;
        if self.server.checkpoint_on_reset {
            self.control
                .batch_execute("CHECKPOINT")
                .await
                .map_err(Error::db("bench: checkpoint"))?;
        }
        Ok(())
    }

    /// Bulk-load jobs in one statement.
    pub async fn load(&self, load: Load) -> Result<()> {
        let jobs = i64::try_from(load.jobs).map_err(|_| Error::Config("too many jobs".into()))?;
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
            [&jobs, &load.queue, &load.task, &load.half_future];
        if load.notify {
            self.control
                .execute(LOAD, &params)
                .await
                .map_err(Error::db("bench: load jobs"))?;
            return Ok(());
        }
        self.control
            .batch_execute("BEGIN; SET LOCAL pgwake.notify = off")
            .await
            .map_err(Error::db("bench: load jobs"))?;
        let inserted = self.control.execute(LOAD, &params).await;
        let end = if inserted.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        let ended = self.control.batch_execute(end).await;
        inserted.map_err(Error::db("bench: load jobs"))?;
        ended.map_err(Error::db("bench: load jobs: commit"))
    }

    /// Ready jobs on `queue`.
    pub async fn ready(&self, queue: &str) -> Result<i64> {
        let row = self
            .control
            .query_one(
                "SELECT count(*) FROM pgwake.jobs WHERE queue = $1 AND run_at <= now()",
                &[&queue],
            )
            .await
            .map_err(Error::db("bench: count ready jobs"))?;
        Ok(row.get(0))
    }

    /// The WAL insert position, in bytes.
    pub async fn wal_bytes(&self) -> Result<f64> {
        let row = self
            .control
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8",
                &[],
            )
            .await
            .map_err(Error::db("bench: read the WAL position"))?;
        Ok(row.get(0))
    }

    /// Cumulative dead-row counters of the pgwake tables.
    pub async fn table_counters(&self) -> Result<TableCounters> {
        let rows = self
            .control
            .query(TABLE_COUNTERS, &[])
            .await
            .map_err(Error::db("bench: read table statistics"))?;
        Ok(TableCounters {
            tables: rows
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2)))
                .collect(),
        })
    }

    /// Wait until no backend of `application_name` prefix `app` is left:
    /// an exiting backend flushes its table statistics, so counters read
    /// afterwards are complete.
    /// Runs counted by the per-minute rollup (`pgwake.minute_stats`).
    pub async fn rollup_jobs(&self) -> Result<i64> {
        Ok(self
            .control
            .query_one(
                "SELECT coalesce(sum(jobs), 0)::int8 FROM pgwake.minute_stats",
                &[],
            )
            .await
            .map_err(Error::db("bench: read the rollup"))?
            .get(0))
    }

    pub async fn wait_backends_gone(&self, app: &str) -> Result<()> {
        let pattern = format!("{app}%");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let n: i64 = self
                .control
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE $1",
                    &[&pattern],
                )
                .await
                .map_err(Error::db("bench: watch worker backends"))?
                .get(0);
            if n == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(super::aborted(format!(
                    "{n} worker backends still connected 10 s after the worker stopped"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Enable or disable the NOTIFY trigger.
    pub async fn set_trigger(&self, enabled: bool) -> Result<()> {
        let verb = if enabled { "ENABLE" } else { "DISABLE" };
        self.control
            .batch_execute(&format!(
                "ALTER TABLE pgwake.jobs {verb} TRIGGER jobs_notify"
            ))
            .await
            .map_err(Error::db("bench: switch the notify trigger"))
    }
}

/// Connect, migrate, check the server can take the bench's connections.
async fn open(
    config: &Config,
    embedded: bool,
    connections: usize,
) -> Result<(Client, String, ServerInfo)> {
    let mut control =
        connect::connect(&connect::with_application_name(config, CONTROL_APP)).await?;
    pgwake::admin::schema::migrate(&mut control).await?;
    let row = control
        .query_one(
            "SELECT current_setting('server_version'), current_setting('fsync'),
                    current_setting('synchronous_commit'), current_setting('shared_buffers'),
                    current_setting('max_connections')::int8,
                    (SELECT string_agg(format('%I.%I', schemaname, tablename), ', ')
                     FROM pg_tables WHERE schemaname = 'pgwake'
                       AND tablename NOT IN ('schema_migrations', 'schema_definitions', 'history_settings'))",
            &[],
        )
        .await
        .map_err(Error::db("bench: read server settings"))?;
    let max_connections = usize::try_from(row.get::<_, i64>(4)).unwrap_or(0);
    if connections + RESERVED_CONNECTIONS > max_connections {
        return Err(Error::Config(format!(
            "the server allows {max_connections} connections and the bench needs {connections}: lower --concurrency or raise max_connections"
        )));
    }
    let checkpoint_on_reset = match control.batch_execute("CHECKPOINT").await {
        Ok(()) => true,
        Err(e) if pgwake::error::pg_is_permission_denied(&e) => false,
        Err(e) => return Err(Error::db("bench: checkpoint")(e)),
    };
    let server = ServerInfo {
        embedded,
        version: row.get(0),
        fsync: row.get(1),
        synchronous_commit: row.get(2),
        shared_buffers: row.get(3),
        checkpoint_on_reset,
    };
    let tables: Option<String> = row.get(5);
    let tables = tables.ok_or_else(|| {
        Error::Schema("bench: the pgwake schema has no tables after migrating".into())
    })?;
    Ok((control, tables, server))
}

async fn drop_database(admin: &Config, name: &str) -> Result<()> {
    let client = connect::connect(&connect::with_application_name(admin, CONTROL_APP)).await?;
    client
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await
        .map_err(Error::db("bench: cannot drop the bench database"))
}
