//! What holds back the vacuum horizon of the queue's tables: sessions with
//! an old snapshot or transaction, replication slots, prepared
//! transactions. While one holds it, every row a claim deletes stays in the
//! table and its indexes, and every later claim steps over it (issue 35:
//! producers fell from 1,500 to 240 inserts a second within 20 s of a pin).

use super::{age, literal, Ctx, Finding, Severity, LIST_MAX};
use crate::db::sql::{self, Db};
use crate::error::Error;

/// Sessions holding the horizon.
pub(super) const PINNED: &str = "horizon.pinned";
/// Replication slots holding an xmin or WAL.
pub(super) const SLOTS: &str = "horizon.replication_slot";
/// Prepared transactions.
pub(super) const PREPARED: &str = "horizon.prepared_transaction";

/// The three horizon findings.
pub(super) async fn check(ctx: &Ctx<'_>) -> Vec<Finding> {
    vec![
        sessions(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(PINNED, &e)),
        slots(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(SLOTS, &e)),
        prepared(ctx)
            .await
            .unwrap_or_else(|e| Finding::unchecked(PREPARED, &e)),
    ]
}

async fn sessions(ctx: &Ctx<'_>) -> crate::error::Result<Finding> {
    let rows = Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_SESSIONS, &[&LIST_MAX])
        .await
        .map_err(Error::db(
            "reading the sessions that hold the vacuum horizon",
        ))?;
    let mut details = Vec::new();
    let mut fix = Vec::new();
    let mut worst = Severity::Ok;
    let mut oldest: Option<String> = None;
    for r in &rows {
        let pid: i32 = r.get(0);
        let who: String = r.get(1);
        let role: String = r.get(2);
        let state: String = r.get(3);
        let seconds: f64 = r.get(4);
        let xmin_age: Option<i64> = r.get(5);
        let query: Option<String> = r.get(6);
        let severity = ctx.thresholds.horizon_severity(seconds);
        if severity == Severity::Ok {
            continue;
        }
        worst = worst.max(severity);
        let line = format!(
            "pid {pid} ({who}, role {role}, {state}) for {}, {} transactions behind",
            age(seconds),
            xmin_age.unwrap_or(0)
        );
        oldest.get_or_insert_with(|| line.clone());
        details.push(match query {
            Some(q) if !q.is_empty() => format!("{line}; last statement: {q}"),
            _ => line,
        });
        if state == "active" {
            fix.push(format!(
                "SELECT pg_cancel_backend({pid});  -- {who}: cancels its running statement; if its transaction goes on:"
            ));
        }
        fix.push(format!("SELECT pg_terminate_backend({pid});  -- {who}"));
        if state.starts_with("idle in transaction") {
            fix.push(format!(
                "-- pid {pid} is idle in a transaction: its application forgot to commit; a database limit ends such sessions (see timeouts.idle_in_transaction)"
            ));
        }
    }
    Ok(match oldest {
        None => Finding::ok(
            PINNED,
            format!(
                "no session of this database has held the vacuum horizon for {} or more",
                age(ctx.thresholds.horizon_warning.as_secs_f64())
            ),
        ),
        Some(oldest) => Finding::new(
            PINNED,
            worst,
            format!(
                "{} session(s) hold the vacuum horizon: dead queue rows cannot be removed; oldest: {oldest}",
                details.len()
            ),
        )
        .details(details)
        .fix(fix),
    })
}

async fn slots(ctx: &Ctx<'_>) -> crate::error::Result<Finding> {
    let rows = Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_SLOTS, &[&LIST_MAX])
        .await
        .map_err(Error::db("reading the replication slots"))?;
    let mut details = Vec::new();
    let mut fix = Vec::new();
    let mut inactive = 0;
    for r in &rows {
        let name: String = r.get(0);
        let kind: String = r.get(1);
        let active: bool = r.get(2);
        let xmin_age: Option<i64> = r.get(3);
        let catalog_xmin_age: Option<i64> = r.get(4);
        let wal: Option<i64> = r.get(5);
        let database: String = r.get(6);
        let mut holds = Vec::new();
        if let Some(a) = xmin_age {
            holds.push(format!(
                "xmin {a} transactions behind (the horizon of every table)"
            ));
        }
        if let Some(a) = catalog_xmin_age {
            holds.push(format!(
                "catalog_xmin {a} transactions behind (the catalogs' horizon)"
            ));
        }
        if let Some(w) = wal {
            holds.push(format!("{} of WAL", super::size(w)));
        }
        let on = if database.is_empty() {
            String::new()
        } else {
            format!(" on database {database}")
        };
        details.push(format!(
            "{kind} slot {name}{on}, {}: holds {}",
            if active { "active" } else { "inactive" },
            if holds.is_empty() {
                "nothing yet".to_string()
            } else {
                holds.join(", ")
            }
        ));
        if !active {
            inactive += 1;
            fix.push(format!(
                "SELECT pg_drop_replication_slot({});  -- if no standby or subscriber will use it again",
                literal(&name)
            ));
        }
    }
    Ok(if inactive > 0 {
        Finding::new(
            SLOTS,
            Severity::Problem,
            format!(
                "{inactive} inactive replication slot(s): nothing consumes them, so they hold their xmin and WAL until dropped (the disk fills, vacuum stalls)"
            ),
        )
        .details(details)
        .fix(fix)
    } else if rows.is_empty() {
        Finding::ok(SLOTS, "no replication slot")
    } else {
        Finding::ok(
            SLOTS,
            format!(
                "{} replication slot(s), all active (a standby with hot_standby_feedback holds the horizon for its queries: see its xmin here)",
                rows.len()
            ),
        )
        .details(details)
    })
}

async fn prepared(ctx: &Ctx<'_>) -> crate::error::Result<Finding> {
    let rows = Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_PREPARED, &[&LIST_MAX])
        .await
        .map_err(Error::db("reading the prepared transactions"))?;
    let mut details = Vec::new();
    let mut fix = Vec::new();
    let mut worst = Severity::Ok;
    for r in &rows {
        let gid: String = r.get(0);
        let owner: String = r.get(1);
        let seconds: f64 = r.get(2);
        let xmin_age: Option<i64> = r.get(3);
        let severity = ctx.thresholds.horizon_severity(seconds);
        details.push(format!(
            "{} (owner {owner}) prepared {} ago, {} transactions behind",
            literal(&gid),
            age(seconds),
            xmin_age.unwrap_or(0)
        ));
        if severity > Severity::Ok {
            worst = worst.max(severity);
            fix.push(format!(
                "ROLLBACK PREPARED {};  -- or COMMIT PREPARED, if its coordinator meant to commit it",
                literal(&gid)
            ));
        }
    }
    Ok(if worst > Severity::Ok {
        Finding::new(
            PREPARED,
            worst,
            format!(
                "{} prepared transaction(s) of this database older than {}: each holds the vacuum horizon and its locks until someone ends it",
                fix.len(),
                age(ctx.thresholds.horizon_warning.as_secs_f64())
            ),
        )
        .details(details)
        .fix(fix)
    } else if rows.is_empty() {
        Finding::ok(PREPARED, "no prepared transaction in this database")
    } else {
        Finding::ok(
            PREPARED,
            format!(
                "{} recent prepared transaction(s) in this database",
                rows.len()
            ),
        )
        .details(details)
    })
}
