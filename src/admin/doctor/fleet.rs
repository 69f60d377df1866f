//! How pgwake itself is deployed: the pooler between the doctor and the
//! server, the schema's version, the workers' versions, and jobs no live
//! worker can run.

use super::{age, Ctx, Finding, Severity, LIST_MAX};
use crate::admin::schema;
use crate::admin::workers;
use crate::error::{Error, Result};

/// A transaction-mode pooler in front of the server.
pub(super) const POOLER: &str = "pooler.mode";
/// The schema's version against this pgwake's.
pub(super) const SCHEMA: &str = "schema.version";
/// Live workers of another pgwake version.
pub(super) const VERSIONS: &str = "workers.versions";
/// Jobs no live worker can run.
pub(super) const UNSERVED: &str = "tasks.unserved";

/// Whether the doctor's connections go through a transaction-mode pooler
/// (the worker's own start-up check, `connect::shares_server_connections`).
pub(super) async fn pooler(pool: &deadpool_postgres::Pool) -> Finding {
    match crate::db::connect::shares_server_connections(pool).await {
        Ok(true) => Finding::ok(
            POOLER,
            "this connection goes through a transaction-mode pooler (PgBouncer pool_mode=transaction): two client connections were served by one server process in turn",
        )
        .details(vec![
            "workers adapt by themselves: statements unnamed, and polling unless --listen-database-url names the server (LISTEN through the pooler hears nothing)".into(),
            "run `pgwake migrate` against the server directly (it holds a session advisory lock)".into(),
            "the checks of sessions below see the pooler's server connections, not its clients".into(),
        ]),
        Ok(false) => Finding::ok(
            POOLER,
            "no transaction-mode pooler seen (direct or session pooling; a busy pooler can hide, see docs/src/connecting.md)",
        ),
        Err(e) => Finding::unchecked(POOLER, &e),
    }
}

/// The schema's version against [`schema::latest_version`].
pub(super) fn schema(version: &Result<Option<i32>>) -> Finding {
    let known = schema::latest_version();
    match version {
        Err(e) => Finding::unchecked(SCHEMA, e),
        Ok(None) => Finding::new(
            SCHEMA,
            Severity::Problem,
            "no pgwake schema in this database: workers wait for it, producers' inserts fail",
        )
        .fix(vec![format!("pgwake migrate  # creates it at version {known}")]),
        Ok(Some(v)) if *v < known => Finding::new(
            SCHEMA,
            Severity::Problem,
            format!(
                "the schema is at version {v}, this pgwake needs {known}: migrations {} to {known} are pending; workers of this version wait for them",
                v + 1
            ),
        )
        .fix(vec![
            "pgwake migrate  # with this binary; safe beside running workers".into(),
        ]),
        Ok(Some(v)) if *v > known => Finding::new(
            SCHEMA,
            Severity::Problem,
            format!(
                "the schema is at version {v}, newer than this pgwake knows ({known}): a newer pgwake migrated it; workers of this version refuse to start"
            ),
        )
        .fix(vec![format!(
            "upgrade pgwake (this is {}) to the version that migrated the schema",
            env!("CARGO_PKG_VERSION")
        )]),
        Ok(Some(v)) => Finding::ok(SCHEMA, format!("the schema is at version {v}, current")),
    }
}

/// The registry's findings: versions of live workers, unserved jobs.
pub(super) async fn workers(ctx: &Ctx<'_>) -> Vec<Finding> {
    if !ctx.schema {
        return [VERSIONS, UNSERVED]
            .iter()
            .map(|id| Finding::ok(id, "skipped: no pgwake schema in this database"))
            .collect();
    }
    vec![
        versions(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(VERSIONS, &e)),
        unserved(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(UNSERVED, &e)),
    ]
}

async fn versions(ctx: &Ctx<'_>) -> Result<Finding> {
    let mine = env!("CARGO_PKG_VERSION");
    let live: Vec<workers::WorkerInfo> = workers::list(ctx.client)
        .await?
        .into_iter()
        .filter(|w| w.live)
        .collect();
    let other: Vec<&workers::WorkerInfo> = live.iter().filter(|w| w.version != mine).collect();
    if other.is_empty() {
        return Ok(Finding::ok(
            VERSIONS,
            format!("{} live worker(s), all pgwake {mine}", live.len()),
        ));
    }
    let mut versions: Vec<&str> = other.iter().map(|w| w.version.as_str()).collect();
    versions.sort_unstable();
    versions.dedup();
    Ok(Finding::new(
        VERSIONS,
        Severity::Warning,
        format!(
            "{} of {} live worker(s) run another pgwake version ({}) than this one ({mine})",
            other.len(),
            live.len(),
            versions.join(", ")
        ),
    )
    .details(
        other
            .iter()
            .take(LIST_MAX as usize)
            .map(|w| {
                format!(
                    "{} pid {} ({}): pgwake {}, started {}",
                    w.host, w.pid, w.application_name, w.version, w.started_at.format("%Y-%m-%d %H:%M:%S UTC")
                )
            })
            .collect(),
    )
    .fix(vec![
        "restart those workers with this pgwake, one by one (SIGTERM drains each; see Operations → Upgrading); if this doctor is the older one, upgrade it instead".into(),
    ]))
}

async fn unserved(ctx: &Ctx<'_>) -> Result<Finding> {
    let found = workers::unserved(
        ctx.client,
        workers::UNSERVED_HEAD,
        workers::UNSERVED_PAIRS_MAX,
    )
    .await
    .map_err(Error::db("reading unserved jobs"))?;
    if found.is_empty() {
        return Ok(Finding::ok(
            UNSERVED,
            "every ready job has a live worker that can run it",
        ));
    }
    let jobs: i64 = found.iter().map(|u| u.jobs).sum();
    Ok(Finding::new(
        UNSERVED,
        Severity::Warning,
        format!(
            "{jobs} ready job(s) of {} (queue, task) pair(s) wait for a worker: no live worker works their queue with a handler for their task",
            found.len()
        ),
    )
    .details(
        found
            .iter()
            .take(LIST_MAX as usize)
            .map(|u| {
                format!(
                    "queue {} task {}: {} job(s), oldest ready {}",
                    u.queue,
                    u.task,
                    u.jobs,
                    age(u.oldest_age_seconds)
                )
            })
            .collect(),
    )
    .fix(vec![
        "start a worker that works the queue with a handler for the task (pgwake run --queues Q --handler TASK=KIND:SPEC)".into(),
        "or cancel the jobs: pgwake jobs list --queue Q --task T, then pgwake cancel ID…".into(),
    ]))
}
