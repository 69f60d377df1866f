//! `sql` handler: `SELECT FUNCTION($payload::jsonb)` inside the claim
//! transaction (in `tx` mode), so what the function writes commits together
//! with the job's removal. An exception raised by the function is a failed
//! attempt with the server's message as `last_error`.

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::handler::{BoxError, Handler, JobContext};
use crate::job::{Job, Outcome};

/// Calls a SQL function per job.
#[derive(Debug, Clone)]
pub struct SqlHandler {
    statement: String,
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
            statement: format!("SELECT {quoted}($1::jsonb)"),
        })
    }

    /// The statement this handler runs, for start-up checks.
    pub fn statement(&self) -> &str {
        &self.statement
    }
}

#[async_trait]
impl Handler for SqlHandler {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let result = match ctx.transaction() {
            Some(tx) => tx.execute(self.statement.as_str(), &[&job.payload]).await,
            None => {
                let conn = ctx.pool().get().await?;
                conn.execute(self.statement.as_str(), &[&job.payload]).await
            }
        };
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
