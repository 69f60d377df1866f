//! pgwake's tables: autovacuum turned off, dead tuples piling up (with
//! autovacuum's state on each table), and bloated indexes. From the
//! statistics views and sizes only: never a count of the queue.

use super::settings::Server;
use super::{age, ident, Ctx, Finding, Severity};
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Autovacuum off for the server or a pgwake table.
pub(super) const AUTOVACUUM: &str = "autovacuum.off";
/// Dead tuples of pgwake's tables.
pub(super) const DEAD_TUPLES: &str = "tables.dead_tuples";
/// Bloated indexes of pgwake's tables.
pub(super) const INDEX_BLOAT: &str = "tables.index_bloat";

/// Most tables or indexes read.
const TABLES_MAX: i64 = 100;

struct Table {
    name: String,
    live: i64,
    dead: i64,
    vacuum_age: Option<f64>,
    autovacuum_off: bool,
    vacuuming: bool,
}

/// The three table findings.
pub(super) async fn check(ctx: &Ctx<'_>, server: &Server) -> Vec<Finding> {
    if !ctx.schema {
        return [AUTOVACUUM, DEAD_TUPLES, INDEX_BLOAT]
            .iter()
            .map(|id| match *id {
                AUTOVACUUM => autovacuum(server, &[]),
                id => Finding::ok(id, "skipped: no pgwake schema in this database"),
            })
            .collect();
    }
    let tables = match read(ctx).await {
        Ok(t) => t,
        Err(e) => {
            return vec![
                autovacuum(server, &[]),
                Finding::unchecked(DEAD_TUPLES, &e),
                Finding::unchecked(INDEX_BLOAT, &e),
            ]
        }
    };
    vec![
        autovacuum(server, &tables),
        dead_tuples(ctx, server, &tables),
        index_bloat(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(INDEX_BLOAT, &e)),
    ]
}

async fn read(ctx: &Ctx<'_>) -> Result<Vec<Table>> {
    let rows = Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_TABLES, &[&TABLES_MAX])
        .await
        .map_err(Error::db("reading pgwake's table statistics"))?;
    Ok(rows
        .iter()
        .map(|r| Table {
            name: r.get(0),
            live: r.get(1),
            dead: r.get(2),
            vacuum_age: r.get(3),
            autovacuum_off: r.get(4),
            vacuuming: r.get(5),
        })
        .collect())
}

fn autovacuum(server: &Server, tables: &[Table]) -> Finding {
    let mut details = Vec::new();
    let mut fix = Vec::new();
    if !server.autovacuum {
        details.push("the server's autovacuum is off: no table is vacuumed unless someone runs VACUUM (only wraparound prevention still runs)".into());
        fix.push("ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();".to_string());
    }
    if !server.track_counts {
        details.push("track_counts is off: autovacuum cannot know which tables need it, and the dead-tuple counts here are not kept".into());
        fix.push("ALTER SYSTEM SET track_counts = on; SELECT pg_reload_conf();".to_string());
    }
    for t in tables.iter().filter(|t| t.autovacuum_off) {
        details.push(format!("pgwake.{}: autovacuum_enabled = off", t.name));
        fix.push(format!(
            "ALTER TABLE pgwake.{} RESET (autovacuum_enabled);",
            ident(&t.name)
        ));
    }
    if details.is_empty() {
        return Finding::ok(
            AUTOVACUUM,
            "autovacuum is on for the server and every pgwake table",
        );
    }
    Finding::new(
        AUTOVACUUM,
        Severity::Problem,
        "autovacuum is off where the queue needs it: every claimed job leaves a dead row that nothing removes, and claims slow down as they pile up",
    )
    .details(details)
    .fix(fix)
}

fn dead_tuples(ctx: &Ctx<'_>, server: &Server, tables: &[Table]) -> Finding {
    let warn = ctx.thresholds.dead_tuples_warning;
    let describe = |t: &Table| {
        format!(
            "pgwake.{}: {} dead, ~{} live; last vacuum {}{}{}",
            t.name,
            t.dead,
            t.live,
            t.vacuum_age
                .map_or("never".to_string(), |a| format!("{} ago", age(a))),
            if t.vacuuming {
                "; a vacuum runs on it now"
            } else {
                ""
            },
            if t.autovacuum_off || !server.autovacuum {
                "; autovacuum off"
            } else {
                ""
            }
        )
    };
    let over: Vec<&Table> = tables.iter().filter(|t| t.dead >= warn).collect();
    if over.is_empty() {
        let most = tables.iter().take(3).map(describe).collect();
        return Finding::ok(
            DEAD_TUPLES,
            format!("no pgwake table has {warn} dead tuples or more"),
        )
        .details(most);
    }
    let severity = if over.iter().any(|t| t.dead >= warn.saturating_mul(10)) {
        Severity::Problem
    } else {
        Severity::Warning
    };
    let mut fix: Vec<String> = vec!["-- first end what holds the vacuum horizon (horizon.* findings), or VACUUM removes nothing".into()];
    fix.extend(
        over.iter()
            .filter(|t| !t.vacuuming)
            .map(|t| format!("VACUUM (VERBOSE) pgwake.{};", ident(&t.name))),
    );
    Finding::new(
        DEAD_TUPLES,
        severity,
        format!(
            "{} pgwake table(s) hold {warn} dead tuples or more: claims step over them in the index",
            over.len()
        ),
    )
    .details(over.iter().map(|t| describe(t)).collect())
    .fix(fix)
}

async fn index_bloat(ctx: &Ctx<'_>) -> Result<Finding> {
    let rows = Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_INDEXES, &[&TABLES_MAX])
        .await
        .map_err(Error::db("reading the sizes of pgwake's indexes"))?;
    let mut details = Vec::new();
    let mut fix = Vec::new();
    for r in &rows {
        let index: String = r.get(0);
        let table: String = r.get(1);
        let bytes: i64 = r.get(2);
        let live: i64 = r.get(3);
        // What the live rows need, at least a few pages.
        let expected = (live.max(0) as f64 * super::INDEX_BYTES_PER_ROW).max(8.0 * 8192.0);
        if bytes < ctx.thresholds.index_bloat_min_bytes
            || (bytes as f64) < expected * super::INDEX_BLOAT_RATIO
        {
            continue;
        }
        details.push(format!(
            "pgwake.{index} on pgwake.{table}: {} for ~{live} live rows (~{} expected)",
            super::size(bytes),
            super::size(expected as i64)
        ));
        fix.push(format!("REINDEX INDEX CONCURRENTLY pgwake.{index};"));
    }
    Ok(if details.is_empty() {
        Finding::ok(
            INDEX_BLOAT,
            format!(
                "no index of pgwake's tables of {} or more is {}x larger than its live rows need",
                super::size(ctx.thresholds.index_bloat_min_bytes),
                super::INDEX_BLOAT_RATIO
            ),
        )
    } else {
        Finding::new(
            INDEX_BLOAT,
            Severity::Warning,
            format!(
                "{} index(es) of pgwake's tables are far larger than their live rows need (estimate): claims read the empty pages too",
                details.len()
            ),
        )
        .details(details)
        .fix(fix)
    })
}
