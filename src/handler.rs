//! Handlers: what runs a job. Rust code implements [`Handler`]; everyone else
//! configures an [`exec`](crate::handlers::exec) command or a
//! [`sql`](crate::handlers::sql) function per task name.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::job::{Job, Outcome};

/// The error type handlers return with `?`: any error counts as a failed
/// attempt (retried with backoff, dead at `max_attempts`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What a handler gets besides the job.
pub struct JobContext<'a> {
    pub(crate) transaction: Option<&'a Client>,
    pub(crate) pool: &'a deadpool_postgres::Pool,
    pub(crate) cancel: CancellationToken,
}

impl<'a> JobContext<'a> {
    /// In `tx` mode, the connection that holds the claim transaction: what a
    /// handler writes through it commits atomically with the job's removal,
    /// and is rolled back (to a savepoint) if the handler fails. Never send
    /// `COMMIT`/`ROLLBACK` on it. `None` in `lease` mode.
    pub fn transaction(&self) -> Option<&'a Client> {
        self.transaction
    }

    /// The worker's pool, for work that must not be part of the claim
    /// transaction.
    pub fn pool(&self) -> &'a deadpool_postgres::Pool {
        self.pool
    }

    /// Cancelled when the job must stop: its timeout passed or the worker is
    /// shutting down past its grace period. A handler that awaits is simply
    /// dropped at that point; this is for handlers that poll or spawn.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }
}

/// Runs jobs of one task name.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Run one job. `Ok(outcome)` says what happened; `Err` is a failed
    /// attempt. A panic is caught and also counts as a failed attempt.
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError>;

    /// Whether this handler may write through [`JobContext::transaction`].
    /// When true, each job runs inside its own savepoint so a failure undoes
    /// only its own writes; handlers that never touch the transaction return
    /// false and save that round trip.
    fn uses_transaction(&self) -> bool {
        true
    }

    /// Checked once when the worker starts, against the database: a handler
    /// that cannot work (a SQL function that does not exist) stops the
    /// worker with this error instead of failing every job.
    async fn check(&self, _db: &Client) -> Result<(), BoxError> {
        Ok(())
    }
}

/// Handlers by task name, with an optional catch-all (`*`).
#[derive(Clone, Default)]
pub struct Registry {
    by_task: HashMap<String, Arc<dyn Handler>>,
    catch_all: Option<Arc<dyn Handler>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut tasks: Vec<&String> = self.by_task.keys().collect();
        tasks.sort();
        f.debug_struct("Registry")
            .field("tasks", &tasks)
            .field("catch_all", &self.catch_all.is_some())
            .finish()
    }
}

impl Registry {
    /// Register `handler` for `task`; `*` registers the catch-all.
    pub fn insert(&mut self, task: &str, handler: Arc<dyn Handler>) {
        if task == "*" {
            self.catch_all = Some(handler);
        } else {
            self.by_task.insert(task.to_string(), handler);
        }
    }

    /// The handler for `task`, falling back to the catch-all.
    pub fn get(&self, task: &str) -> Option<&Arc<dyn Handler>> {
        self.by_task.get(task).or(self.catch_all.as_ref())
    }

    /// Task names with a handler (`*` for the catch-all).
    pub fn tasks(&self) -> Vec<String> {
        let mut tasks: Vec<String> = self.by_task.keys().cloned().collect();
        if self.catch_all.is_some() {
            tasks.push("*".into());
        }
        tasks
    }

    /// Whether no handler at all is registered.
    pub fn is_empty(&self) -> bool {
        self.by_task.is_empty() && self.catch_all.is_none()
    }
}
