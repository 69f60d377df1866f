//! `sql` handler: `SELECT FUNCTION($payload::jsonb)` inside the claim
//! transaction (`tx` mode), so what the function writes commits together
//! with the job's removal. The payload is bound exactly as stored.
//!
//! The function may also take the job's id and attempt; which form it has
//! is found at start-up ([`Handler::check`]) by asking the server to
//! prepare each call, in this order (the first that resolves is used, with
//! PostgreSQL's own overload and default-argument rules):
//!
//! | form | call |
//! |---|---|
//! | positional | `f(payload jsonb, job_id bigint, attempt integer)` |
//! | named | `f(payload => …, job_id => …, attempt => …)`: parameters with these names, in any order |
//! | payload only | `f(payload jsonb)` |
//!
//! The function's return value (any type, through `to_jsonb`; `void` and
//! NULL mean none) is the job's result, recorded when history is on. One
//! value is a convention instead: `{"pgwake_snooze": 600}` ([`SNOOZE_KEY`])
//! snoozes the job for 600 s with no attempt used, its writes rolled back. A batch
//! of jobs of one task runs as one statement over all payloads; if that
//! fails, it is rolled back and each job runs alone in its own savepoint, so
//! one failing job fails alone. An exception raised by the function is a
//! failed attempt with the server's message as `last_error`.
//!
//! On a queue forced into `lease` mode the function runs on a pooled
//! connection, in a transaction of its own; if the job times out (or stops)
//! while the function runs, the statement is cancelled on the server and
//! that connection is closed, not returned to the pool. The transaction is
//! what makes the cancel safe through a transaction-mode pooler: the server
//! process whose pid is read first stays this connection's until COMMIT,
//! where outside a transaction the next statement may run on another one
//! and the cancel would hit another client's statement.
//!
//! Both statements are sent unnamed (one round trip, no prepared statement
//! left on the connection), so they work through any pooler.

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};

use tokio_postgres::types::Type;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::handler::{BoxError, Handler, JobContext};
use crate::job::{Job, Outcome};

/// Which arguments the function takes (found by [`Handler::check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signature {
    /// `f(payload jsonb)`.
    Payload,
    /// `f(payload jsonb, job_id bigint, attempt integer)`.
    PayloadIdAttempt,
    /// `f(payload => …, job_id => …, attempt => …)`.
    Named,
}

impl Signature {
    /// In the order [`Handler::check`] tries them.
    const ALL: [Signature; 3] = [
        Signature::PayloadIdAttempt,
        Signature::Named,
        Signature::Payload,
    ];

    fn statement(self, f: &str) -> String {
        match self {
            Signature::Payload => format!("SELECT to_jsonb({f}($1::text::jsonb))::text"),
            Signature::PayloadIdAttempt => {
                format!("SELECT to_jsonb({f}($1::text::jsonb, $2::bigint, $3::int))::text")
            }
            Signature::Named => format!(
                "SELECT to_jsonb({f}(payload => $1::text::jsonb, job_id => $2::bigint, attempt => $3::int))::text"
            ),
        }
    }

    fn batch_statement(self, f: &str) -> String {
        let call = match self {
            Signature::Payload => format!("{f}(u.p::jsonb)"),
            Signature::PayloadIdAttempt => format!("{f}(u.p::jsonb, u.id, u.att)"),
            Signature::Named => {
                format!("{f}(payload => u.p::jsonb, job_id => u.id, attempt => u.att)")
            }
        };
        format!(
            "SELECT u.n, to_jsonb({call})::text \
             FROM unnest($1::text[], $2::bigint[], $3::int[]) WITH ORDINALITY AS u(p, id, att, n)"
        )
    }

    fn takes_job(self) -> bool {
        self != Signature::Payload
    }
}

/// Calls a SQL function per job.
#[derive(Debug)]
pub struct SqlHandler {
    function: String,
    /// Set by [`Handler::check`]; [`Signature::Payload`] until then.
    signature: std::sync::OnceLock<(Signature, String, String)>,
}

impl Clone for SqlHandler {
    fn clone(&self) -> Self {
        SqlHandler {
            function: self.function.clone(),
            signature: self.signature.clone(),
        }
    }
}

/// Quote one identifier part after checking it is a plain name.
fn quote_part(part: &str, spec: &str) -> Result<String> {
    let mut chars = part.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_alphabetic() || c == '_')
        && chars.all(|c| c.is_alphanumeric() || c == '_' || c == '$')
        && part.len() <= 63;
    if !ok {
        return Err(Error::Config(format!(
            "sql handler {spec:?}: expected FUNCTION or SCHEMA.FUNCTION made of letters, digits and _ (at most 63 bytes each)"
        )));
    }
    Ok(format!("\"{part}\""))
}

impl SqlHandler {
    /// Parse `FUNCTION` or `SCHEMA.FUNCTION`. Names are matched exactly as
    /// written (they are quoted), so `Audit.Log` is not `audit.log`.
    pub fn parse(spec: &str) -> Result<SqlHandler> {
        let parts: Vec<&str> = spec.split('.').collect();
        if parts.is_empty() || parts.len() > 2 {
            return Err(Error::Config(format!(
                "sql handler {spec:?}: expected FUNCTION or SCHEMA.FUNCTION"
            )));
        }
        let quoted = parts
            .iter()
            .map(|p| quote_part(p, spec))
            .collect::<Result<Vec<_>>>()?
            .join(".");
        Ok(SqlHandler {
            function: quoted,
            signature: std::sync::OnceLock::new(),
        })
    }

    /// The function's signature as found at start-up
    /// ([`Signature::Payload`] before [`Handler::check`] ran).
    pub fn signature(&self) -> Signature {
        self.signature
            .get()
            .map(|s| s.0)
            .unwrap_or(Signature::Payload)
    }

    /// The statement this handler runs (per job).
    pub fn statement(&self) -> String {
        match self.signature.get() {
            Some((_, one, _)) => one.clone(),
            None => Signature::Payload.statement(&self.function),
        }
    }

    fn batch_statement(&self) -> String {
        match self.signature.get() {
            Some((_, _, batch)) => batch.clone(),
            None => Signature::Payload.batch_statement(&self.function),
        }
    }

    /// Run the per-job statement on `client`.
    async fn call(
        &self,
        client: &tokio_postgres::Client,
        job: &Job,
        trace: Option<&crate::trace::TraceContext>,
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let db = Db::unnamed(client);
        let Some(t) = trace else {
            return self.call_function(db, job).await;
        };
        // The run's context as the settings a producer sets: the function
        // reads it, and jobs it enqueues get it. Local to the transaction;
        // in tx mode the claim transaction goes on to other jobs, so the
        // settings are emptied after the call.
        db.query(
            &sql::TRACE_SETTINGS,
            &[&t.traceparent, &t.tracestate.as_deref().unwrap_or("")],
        )
        .await?;
        let rows = self.call_function(db, job).await;
        if rows.is_ok() {
            db.query(&sql::TRACE_SETTINGS, &[&"", &""]).await?;
        }
        rows
    }

    async fn call_function(
        &self,
        db: Db<'_>,
        job: &Job,
    ) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        // Unnamed: the statement is built per handler, and the call must
        // go through a transaction-mode pooler too (`crate::db::sql`).
        let statement = self.statement();
        if self.signature().takes_job() {
            db.query_text(
                &statement,
                &[Type::TEXT, Type::INT8, Type::INT4],
                &[&job.payload_text, &job.id, &job.attempt],
            )
            .await
        } else {
            db.query_text(&statement, &[Type::TEXT], &[&job.payload_text])
                .await
        }
    }
}

/// The key of the one-key object a function returns to snooze its job:
/// `{"pgwake_snooze": 600}` (seconds) or `{"pgwake_snooze": "10m"}` (a
/// delay as exec's `pgwake-snooze:` line takes). The job comes back after
/// it with no attempt used, and whatever the function wrote is rolled back
/// ([`Outcome::Snooze`]).
pub const SNOOZE_KEY: &str = "pgwake_snooze";

/// The outcome of a function's returned value (JSON text; NULL for void).
fn done_with(value: Option<String>) -> Outcome {
    match value {
        None => Outcome::Done,
        Some(text) => {
            let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
            match snooze_of(&value) {
                Some(Ok(after)) => Outcome::Snooze(after),
                Some(Err(why)) => Outcome::retry(why),
                None => Outcome::DoneWith(value),
            }
        }
    }
}

/// A returned `{"pgwake_snooze": …}`: its delay, or why it is none.
fn snooze_of(
    value: &serde_json::Value,
) -> Option<std::result::Result<std::time::Duration, String>> {
    let map = value.as_object().filter(|m| m.len() == 1)?;
    let after = map.get(SNOOZE_KEY)?;
    let bad = || {
        format!(
            "the function returned {{\"{SNOOZE_KEY}\": {}}}, which is not a delay: give seconds (a number from 0) or a duration such as \"10m\"",
            crate::handlers::exec::escape_line(&after.to_string().as_bytes()[..after.to_string().len().min(100)])
        )
    };
    Some(match after {
        serde_json::Value::Number(n) => n
            .as_f64()
            .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
            .ok_or_else(bad),
        serde_json::Value::String(s) => {
            crate::handlers::exec::parse_retry_after(s).map_err(|_| bad())
        }
        _ => Err(bad()),
    })
}

fn outcome_of(
    result: std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error>,
) -> Result<Outcome, BoxError> {
    match result {
        Ok(rows) => Ok(done_with(
            rows.first().and_then(|r| r.get::<_, Option<String>>(0)),
        )),
        Err(e) => match e.as_db_error() {
            Some(db) => Ok(Outcome::retry(format!(
                "{} (SQLSTATE {})",
                db.message(),
                db.code().code()
            ))),
            // The connection itself failed: let the claim notice.
            None => Err(e.into()),
        },
    }
}

/// A pooled connection running a statement. Dropped before
/// [`Running::finished`] (the job timed out or was stopped), it cancels the
/// statement on the server and closes the connection instead of returning a
/// busy one to the pool.
struct Running {
    conn: Option<Object>,
    pid: i32,
    pool: Pool,
}

impl Running {
    fn finished(mut self) -> Object {
        self.conn.take().expect("present until finished or dropped")
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        drop(Object::take(conn));
        let (pool, pid) = (self.pool.clone(), self.pid);
        tokio::spawn(async move {
            if let Ok(c) = pool.get().await {
                let _ = Db::unnamed(&c).execute(&sql::CANCEL_BACKEND, &[&pid]).await;
            }
        });
    }
}

#[async_trait]
impl Handler for SqlHandler {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if let Some(tx) = ctx.transaction().await? {
            return outcome_of(self.call(tx, job, ctx.trace()).await);
        }
        let conn = ctx.pool().get().await?;
        let (begun, pid) = tokio::join!(
            conn.batch_execute("BEGIN"),
            Db::unnamed(&conn).query_one(&sql::BACKEND_PID, &[])
        );
        let pid: i32 = match (begun, pid) {
            (Ok(()), Ok(row)) => row.get(0),
            (Err(e), _) | (_, Err(e)) => {
                // Possibly inside a transaction: never back to the pool.
                drop(Object::take(conn));
                return Err(e.into());
            }
        };
        let running = Running {
            conn: Some(conn),
            pid,
            pool: ctx.pool().clone(),
        };
        let c = running.conn.as_ref().expect("present");
        let result = self.call(c, job, ctx.trace()).await;
        // What the function wrote commits only if the job is done (a
        // snooze keeps nothing, as in tx mode).
        let done = match &result {
            Ok(rows) => matches!(
                done_with(rows.first().and_then(|r| r.get::<_, Option<String>>(0))),
                Outcome::Done | Outcome::DoneWith(_)
            ),
            Err(_) => false,
        };
        let end = c
            .batch_execute(if done { "COMMIT" } else { "ROLLBACK" })
            .await;
        drop(running.finished());
        // A failed COMMIT undid the function's writes: a failed attempt.
        outcome_of(result.and_then(|rows| end.map(|()| rows)))
    }

    fn decodes_payload(&self) -> bool {
        false
    }

    fn batches(&self) -> bool {
        true
    }

    async fn handle_batch(
        &self,
        jobs: &[Job],
        tx: &tokio_postgres::Client,
    ) -> Result<Option<Vec<Outcome>>, BoxError> {
        let payloads: Vec<&str> = jobs.iter().map(|j| j.payload_text.as_str()).collect();
        let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
        let attempts: Vec<i32> = jobs.iter().map(|j| j.attempt).collect();
        match Db::unnamed(tx)
            .query_text(
                self.batch_statement().as_str(),
                &[Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::INT4_ARRAY],
                &[&payloads, &ids, &attempts],
            )
            .await
        {
            Ok(rows) => {
                // One value per job (the first row of a set-returning
                // function), in the jobs' order.
                let mut values: Vec<Option<Option<String>>> = vec![None; jobs.len()];
                for row in rows {
                    let n = row.get::<_, i64>(0) as usize;
                    if let Some(slot) = values.get_mut(n.wrapping_sub(1)) {
                        slot.get_or_insert(row.get(1));
                    }
                }
                let outcomes: Vec<Outcome> =
                    values.into_iter().map(|v| done_with(v.flatten())).collect();
                // A job that snoozes (or says so badly) must not keep what
                // the batch statement wrote for it: run them one by one,
                // each in its own savepoint.
                if outcomes
                    .iter()
                    .any(|o| !matches!(o, Outcome::Done | Outcome::DoneWith(_)))
                {
                    return Ok(None);
                }
                Ok(Some(outcomes))
            }
            // One of them failed: run them one by one.
            Err(e) if e.as_db_error().is_some() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn check(&self, db: &tokio_postgres::Client) -> Result<(), BoxError> {
        // The worker runs the checks in one transaction (through a
        // transaction-mode pooler, a named statement and its Close must
        // reach the same server connection): a signature that does not fit
        // fails only its savepoint.
        let mut last = None;
        for signature in Signature::ALL {
            let statement = signature.statement(&self.function);
            db.batch_execute("SAVEPOINT pgwake_signature").await?;
            let prepared = db.prepare(&statement).await.map(drop);
            db.batch_execute(if prepared.is_ok() {
                "RELEASE SAVEPOINT pgwake_signature"
            } else {
                "ROLLBACK TO SAVEPOINT pgwake_signature"
            })
            .await?;
            match prepared {
                Ok(()) => {
                    let batch = signature.batch_statement(&self.function);
                    let _ = self.signature.set((signature, statement, batch));
                    return Ok(());
                }
                Err(e) => last = Some(e),
            }
        }
        let e = last.expect("three signatures tried");
        Err(format!(
            "sql handler `{}`: {}; create the function as {f}(payload jsonb), {f}(payload jsonb, job_id bigint, attempt integer) or with parameters named payload, job_id, attempt, or fix the name",
            Signature::Payload.statement(&self.function),
            crate::error::PgDisplay(&e),
            f = self.function,
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_one_key_pgwake_snooze_object_snoozes_and_anything_else_is_a_result() {
        assert_eq!(
            done_with(Some(r#"{"pgwake_snooze": 600}"#.into())),
            Outcome::Snooze(Duration::from_secs(600))
        );
        assert_eq!(
            done_with(Some(r#"{"pgwake_snooze": "10m"}"#.into())),
            Outcome::Snooze(Duration::from_secs(600))
        );
        for bad in [
            r#"{"pgwake_snooze": -1}"#,
            r#"{"pgwake_snooze": "soon"}"#,
            r#"{"pgwake_snooze": null}"#,
        ] {
            match done_with(Some(bad.into())) {
                Outcome::Retry { reason, .. } => {
                    assert!(reason.contains("not a delay"), "{reason}")
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(
            done_with(Some(r#"{"pgwake_snooze": 1, "other": 2}"#.into())),
            Outcome::DoneWith(_)
        ));
    }
}
