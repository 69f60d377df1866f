//! `sql` handler: `SELECT FUNCTION($payload::jsonb)` inside the claim
//! transaction (`tx` mode), so what the function writes commits together
//! with the job's removal. The payload is bound exactly as stored. A batch
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

use crate::error::{Error, Result};
use crate::handler::{BoxError, Handler, JobContext};
use crate::job::{Job, Outcome};
use crate::sql::{self, Db};

/// Calls a SQL function per job.
#[derive(Debug, Clone)]
pub struct SqlHandler {
    statement: String,
    batch_statement: String,
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
            statement: format!("SELECT {quoted}($1::text::jsonb)"),
            batch_statement: format!("SELECT {quoted}(p::jsonb) FROM unnest($1::text[]) AS p"),
        })
    }

    /// The statement this handler runs, for start-up checks.
    pub fn statement(&self) -> &str {
        &self.statement
    }
}

fn outcome_of(
    result: std::result::Result<u64, tokio_postgres::Error>,
) -> Result<Outcome, BoxError> {
    match result {
        Ok(_) => Ok(Outcome::Done),
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
            return outcome_of(
                Db::unnamed(tx)
                    .execute_text(&self.statement, &[Type::TEXT], &[&job.payload_text])
                    .await,
            );
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
        let result = Db::unnamed(c)
            .execute_text(&self.statement, &[Type::TEXT], &[&job.payload_text])
            .await;
        let end = c
            .batch_execute(if result.is_ok() { "COMMIT" } else { "ROLLBACK" })
            .await;
        drop(running.finished());
        // A failed COMMIT undid the function's writes: a failed attempt.
        outcome_of(result.and_then(|n| end.map(|()| n)))
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
        match Db::unnamed(tx)
            .execute_text(&self.batch_statement, &[Type::TEXT_ARRAY], &[&payloads])
            .await
        {
            Ok(_) => Ok(Some(vec![Outcome::Done; jobs.len()])),
            // One of them failed: run them one by one.
            Err(e) if e.as_db_error().is_some() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn check(&self, db: &tokio_postgres::Client) -> Result<(), BoxError> {
        db.prepare(&self.statement).await.map_err(|e| {
            format!(
                "sql handler `{}`: {}; create the function or fix the name",
                self.statement,
                crate::error::PgDisplay(&e)
            )
        })?;
        Ok(())
    }
}
