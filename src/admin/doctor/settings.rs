//! The server's settings and counters: what this role can see, the
//! timeouts pgwake's roles and everyone else get, the connection budget and
//! the NOTIFY queue.

use std::time::Duration;

use super::{age, ident, Ctx, Finding, Severity, LIST_MAX};
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Whether this role sees other roles' sessions.
pub(super) const VISIBILITY: &str = "stats.visibility";
/// The idle-in-transaction limit of the database.
pub(super) const IDLE_IN_TRANSACTION: &str = "timeouts.idle_in_transaction";
/// pgwake roles' `statement_timeout`.
pub(super) const STATEMENT: &str = "timeouts.statement";
/// pgwake roles' `idle_session_timeout`.
pub(super) const IDLE_SESSION: &str = "timeouts.idle_session";
/// Sessions against `max_connections`.
pub(super) const CONNECTIONS: &str = "connections.budget";
/// The NOTIFY queue's use.
pub(super) const NOTIFY: &str = "notify.queue";

/// The server's row (`doctor_server.sql`).
pub(super) struct Server {
    pub autovacuum: bool,
    pub track_counts: bool,
    max_connections: i32,
    superuser_reserved: i32,
    reserved: i32,
    sessions: i64,
    notify_usage: f64,
    sees_all: bool,
    hidden_sessions: i64,
    pub role: String,
    pub database: String,
}

impl Server {
    pub(super) async fn read(client: &tokio_postgres::Client) -> Result<Server> {
        let r = Db::unnamed(client)
            .query_one(&sql::DOCTOR_SERVER, &[])
            .await
            .map_err(Error::db("reading the server's settings"))?;
        Ok(Server {
            autovacuum: r.get(0),
            track_counts: r.get(1),
            max_connections: r.get(2),
            superuser_reserved: r.get(3),
            reserved: r.get(4),
            sessions: r.get(5),
            notify_usage: r.get(6),
            sees_all: r.get(7),
            hidden_sessions: r.get(8),
            role: r.get(9),
            database: r.get(10),
        })
    }
}

pub(super) fn visibility(server: &Server) -> Finding {
    if server.sees_all {
        return Finding::ok(
            VISIBILITY,
            format!(
                "role {} sees every session (pg_read_all_stats)",
                server.role
            ),
        );
    }
    Finding::new(
        VISIBILITY,
        Severity::Warning,
        format!(
            "role {} cannot see other roles' sessions ({} hidden now): horizon.pinned, notify.queue and the connection details cover only its own",
            server.role, server.hidden_sessions
        ),
    )
    .details(vec![
        "without pg_read_all_stats, pg_stat_activity hides other roles' state, transaction start, snapshot and statement".into(),
        "connections.budget still counts every session; replication slots and prepared transactions are seen".into(),
    ])
    .fix(vec![format!(
        "GRANT pg_monitor TO {};  -- as a superuser: pg_monitor includes pg_read_all_stats",
        ident(&server.role)
    )])
}

/// One role's (or, with an empty role, everyone's) timeout setting.
struct Setting {
    role: String,
    name: String,
    value: String,
    level: String,
}

impl Setting {
    /// The value as a duration (`0`: off); `None` when it does not parse.
    fn duration(&self) -> Option<Duration> {
        parse_timeout(&self.value)
    }

    /// The statement that makes this role's value `to` in this database.
    fn set_for_role(&self, database: &str, to: &str) -> String {
        format!(
            "ALTER ROLE {} IN DATABASE {} SET {} = {to};",
            ident(&self.role),
            ident(database),
            self.name
        )
    }
}

/// A timeout setting's value (`5000`, `5s`, `1min`, `2 h`) as a duration;
/// a bare number is milliseconds, as for every timeout PostgreSQL has.
fn parse_timeout(value: &str) -> Option<Duration> {
    let v = value.trim().trim_matches('\'').trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(split);
    let n: f64 = number.parse().ok()?;
    let ms = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64((n * ms / 1000.0).max(0.0)))
}

/// The roles pgwake's workers connect as, this role first; the registry
/// and grants are read when this role may.
async fn pgwake_roles(ctx: &Ctx<'_>) -> Vec<String> {
    let mut roles = vec![ctx.role.clone()];
    if ctx.schema {
        if let Ok(rows) = Db::unnamed(ctx.client)
            .query(&sql::DOCTOR_WORKER_ROLES, &[])
            .await
        {
            for r in rows {
                let role: String = r.get(0);
                if !roles.contains(&role) {
                    roles.push(role);
                }
            }
        }
    }
    roles
}

/// The three timeout findings.
pub(super) async fn timeouts(ctx: &Ctx<'_>) -> Vec<Finding> {
    let ids = [IDLE_IN_TRANSACTION, STATEMENT, IDLE_SESSION];
    let roles = pgwake_roles(ctx).await;
    let rows = match Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_TIMEOUTS, &[&roles])
        .await
        .map_err(Error::db("reading the timeouts of the roles"))
    {
        Ok(rows) => rows,
        Err(e) => return ids.iter().map(|id| Finding::unchecked(id, &e)).collect(),
    };
    let settings: Vec<Setting> = rows
        .iter()
        .map(|r| Setting {
            role: r.get(0),
            name: r.get(1),
            value: r.get(2),
            level: r.get(3),
        })
        .collect();
    vec![
        idle_in_transaction(ctx, &settings),
        statement(ctx, &settings, &roles),
        idle_session(ctx, &settings, &roles),
    ]
}

fn idle_in_transaction(ctx: &Ctx<'_>, settings: &[Setting]) -> Finding {
    let Some(everyone) = settings
        .iter()
        .find(|s| s.role.is_empty() && s.name == "idle_in_transaction_session_timeout")
    else {
        return Finding::ok(IDLE_IN_TRANSACTION, "setting not found");
    };
    match everyone.duration() {
        Some(d) if d.is_zero() => Finding::new(
            IDLE_IN_TRANSACTION,
            Severity::Warning,
            format!(
                "idle_in_transaction_session_timeout is off for this database ({} level): a session that opens a transaction and forgets it holds the vacuum horizon until someone ends it",
                everyone.level
            ),
        )
        .details(vec![
            "pgwake's own tx-mode claims set their limit per transaction (--job-timeout + 5 s) and need no database setting".into(),
            "a limit ends the session after that long idle in a transaction (its work rolled back); choose one above your applications' longest pause inside a transaction".into(),
        ])
        .fix(vec![
            format!(
                "ALTER DATABASE {} SET idle_in_transaction_session_timeout = '10min';  -- new sessions",
                ident(&ctx.database)
            ),
            "-- or for every database: ALTER SYSTEM SET idle_in_transaction_session_timeout = '10min'; SELECT pg_reload_conf();".into(),
        ]),
        _ => Finding::ok(
            IDLE_IN_TRANSACTION,
            format!(
                "idle_in_transaction_session_timeout is {} ({} level)",
                everyone.value, everyone.level
            ),
        ),
    }
}

/// The pgwake roles' values of `name`.
fn of_roles<'s>(
    settings: &'s [Setting],
    roles: &'s [String],
    name: &'s str,
) -> impl Iterator<Item = &'s Setting> {
    settings
        .iter()
        .filter(move |s| s.name == name && !s.role.is_empty() && roles.contains(&s.role))
}

fn statement(ctx: &Ctx<'_>, settings: &[Setting], roles: &[String]) -> Finding {
    let short: Vec<&Setting> = of_roles(settings, roles, "statement_timeout")
        .filter(|s| {
            s.duration()
                .is_some_and(|d| !d.is_zero() && d < super::STATEMENT_TIMEOUT_MIN)
        })
        .collect();
    if short.is_empty() {
        return Finding::ok(
            STATEMENT,
            format!(
                "no pgwake role ({}) has a statement_timeout under {}",
                roles.join(", "),
                age(super::STATEMENT_TIMEOUT_MIN.as_secs_f64())
            ),
        );
    }
    Finding::new(
        STATEMENT,
        Severity::Warning,
        format!(
            "statement_timeout under {} for pgwake role(s) {}: jobs are not cut by it (each claim sets its own, --job-timeout + 5 s), but everything else pgwake runs as that role is",
            age(super::STATEMENT_TIMEOUT_MIN.as_secs_f64()),
            short.iter().map(|s| s.role.as_str()).collect::<Vec<_>>().join(", ")
        ),
    )
    .details(
        short
            .iter()
            .map(|s| format!("role {}: statement_timeout = {} ({} level)", s.role, s.value, s.level))
            .chain(std::iter::once(
                "cut by it: `pgwake migrate` (index builds on a large queue), rescues of expired leases, history maintenance, `pgwake stats` over a large backlog".to_string(),
            ))
            .collect(),
    )
    .fix(short.iter().map(|s| s.set_for_role(&ctx.database, "0")).collect())
}

fn idle_session(ctx: &Ctx<'_>, settings: &[Setting], roles: &[String]) -> Finding {
    let set: Vec<&Setting> = of_roles(settings, roles, "idle_session_timeout")
        .filter(|s| s.duration().is_some_and(|d| !d.is_zero()))
        .collect();
    if set.is_empty() {
        return Finding::ok(
            IDLE_SESSION,
            format!(
                "idle_session_timeout is off for the pgwake roles ({})",
                roles.join(", ")
            ),
        );
    }
    Finding::new(
        IDLE_SESSION,
        Severity::Warning,
        format!(
            "idle_session_timeout is on for pgwake role(s) {}: the server closes the worker's idle connections, its LISTEN connection first (idle between notifications), so workers reconnect over and over and miss wake-ups meanwhile",
            set.iter().map(|s| s.role.as_str()).collect::<Vec<_>>().join(", ")
        ),
    )
    .details(
        set.iter()
            .map(|s| format!("role {}: idle_session_timeout = {} ({} level)", s.role, s.value, s.level))
            .collect(),
    )
    .fix(set.iter().map(|s| s.set_for_role(&ctx.database, "0")).collect())
}

pub(super) async fn connections(ctx: &Ctx<'_>, server: &Server) -> Finding {
    let limit = (server.max_connections - server.superuser_reserved - server.reserved).max(1);
    let used = server.sessions as f64 / f64::from(limit);
    let mut details = vec![format!(
        "max_connections {} less {} reserved for superusers{}: {limit} for everyone else",
        server.max_connections,
        server.superuser_reserved,
        if server.reserved > 0 {
            format!(" and {} reserved (reserved_connections)", server.reserved)
        } else {
            String::new()
        }
    )];
    match Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_APPLICATIONS, &[&10i64])
        .await
    {
        Ok(rows) => details.extend(rows.iter().map(|r| {
            let app: String = r.get(0);
            let role: String = r.get(1);
            let n: i64 = r.get(2);
            format!("{n} session(s): {app} (role {role})")
        })),
        Err(e) => details.push(format!(
            "sessions per application not read: {}",
            crate::error::PgDisplay(&e)
        )),
    }
    details.push("a pgwake worker holds at most --max-connections claim connections plus its listener and ledger (--max-connections: --concurrency + 2, at most 66 with tx-mode handlers, 10 lease-only); the registry does not record it, so these are the sessions now".into());
    let summary = format!(
        "{} client session(s) of {limit} available ({:.0}%)",
        server.sessions,
        used * 100.0
    );
    let severity = if used >= super::CONNECTIONS_PROBLEM {
        Severity::Problem
    } else if used >= super::CONNECTIONS_WARNING {
        Severity::Warning
    } else {
        Severity::Ok
    };
    let finding = Finding::new(CONNECTIONS, severity, summary).details(details);
    if severity == Severity::Ok {
        return finding;
    }
    finding.fix(vec![
        "lower the workers' pools (pgwake run --max-connections; lease-mode jobs hold no connection) or their number".into(),
        "put PgBouncer in transaction mode in front of the other applications".into(),
        "or raise max_connections (ALTER SYSTEM SET max_connections = …; a restart)".into(),
    ])
}

pub(super) async fn notify(ctx: &Ctx<'_>, server: &Server) -> Finding {
    let usage = server.notify_usage;
    let severity = if usage >= super::NOTIFY_PROBLEM {
        Severity::Problem
    } else if usage >= super::NOTIFY_WARNING {
        Severity::Warning
    } else {
        Severity::Ok
    };
    let summary = format!("the NOTIFY queue is {:.2}% full", usage * 100.0);
    if severity == Severity::Ok {
        return Finding::ok(NOTIFY, summary);
    }
    let mut details = vec!["notifications stay queued until every listening session has read them; a session that LISTENs and then stays in a transaction (or never reads) holds them all; at 100% every NOTIFY fails, and with it every insert into pgwake.jobs".to_string()];
    let mut fix = Vec::new();
    match Db::unnamed(ctx.client)
        .query(&sql::DOCTOR_LISTENERS, &[&LIST_MAX])
        .await
    {
        Ok(rows) => {
            for r in &rows {
                let pid: i32 = r.get(0);
                let who: String = r.get(1);
                let state: String = r.get(2);
                let seconds: f64 = r.get(3);
                let query: Option<String> = r.get(4);
                details.push(format!(
                    "candidate: pid {pid} ({who}, {state} for {}); last statement: {}",
                    age(seconds),
                    query.unwrap_or_default()
                ));
                fix.push(format!(
                    "SELECT pg_terminate_backend({pid});  -- {who}, if it is the one"
                ));
            }
        }
        Err(e) => details.push(format!(
            "listening sessions not read: {}",
            crate::error::PgDisplay(&e)
        )),
    }
    Finding::new(NOTIFY, severity, summary)
        .details(details)
        .fix(fix)
}

#[cfg(test)]
mod tests {
    use super::parse_timeout;
    use std::time::Duration;

    #[test]
    fn timeouts_parse_as_postgresql_writes_them() {
        assert_eq!(parse_timeout("0"), Some(Duration::ZERO));
        assert_eq!(parse_timeout("5000"), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout("5s"), Some(Duration::from_secs(5)));
        assert_eq!(parse_timeout("'10min'"), Some(Duration::from_secs(600)));
        assert_eq!(parse_timeout("2 h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("soon"), None);
    }
}
