//! Handlers configured on the command line: `--handler TASK=exec:COMMAND`,
//! `--handler TASK=persistent:COMMAND` and
//! `--handler TASK=sql:[SCHEMA.]FUNCTION`.

pub mod exec;
pub mod persistent;
pub mod sql;

use std::sync::Arc;

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::handler::{BoxError, Delivery, Handler, JobContext};
use crate::job::{Job, Outcome};

const USAGE: &str = "expected --handler TASK=exec:COMMAND [ARGS], --handler TASK=persistent:COMMAND [ARGS] or --handler TASK=sql:[SCHEMA.]FUNCTION";

/// Parse one `--handler TASK=KIND:SPEC` flag into a task name and a handler.
pub fn parse_flag(flag: &str) -> Result<(String, Arc<dyn Handler>)> {
    parse_flag_with(flag, exec::EXEC_STDOUT_MAX_DEFAULT)
}

/// [`parse_flag`], with exec handlers keeping at most `exec_stdout_max`
/// bytes of stdout as their result (`--exec-stdout-max`).
pub fn parse_flag_with(flag: &str, exec_stdout_max: usize) -> Result<(String, Arc<dyn Handler>)> {
    parse_flag_with_env(flag, exec_stdout_max, &[])
}

/// [`parse_flag_with`], with exec handlers also passing the `exec_env`
/// variables of the worker's environment through unchanged (`--exec-env`;
/// see [`exec::check_passed_env`] for the names refused).
pub fn parse_flag_with_env(
    flag: &str,
    exec_stdout_max: usize,
    exec_env: &[String],
) -> Result<(String, Arc<dyn Handler>)> {
    let mut parser = Parser {
        exec_stdout_max,
        exec_env: exec_env.to_vec(),
        persistent: persistent::Options {
            passed_env: exec_env.to_vec(),
            ..Default::default()
        },
        pools: Default::default(),
    };
    parser.parse(flag)
}

/// Parses `--handler` flags with the options of every kind; persistent
/// handlers of one command share its processes.
#[derive(Debug)]
pub struct Parser {
    /// `--exec-stdout-max`.
    pub exec_stdout_max: usize,
    /// `--exec-env` (exec and persistent commands).
    pub exec_env: Vec<String>,
    /// How persistent handlers' processes run.
    pub persistent: persistent::Options,
    pools: persistent::Pools,
}

impl Parser {
    /// A parser with these options.
    pub fn new(
        exec_stdout_max: usize,
        exec_env: &[String],
        persistent: persistent::Options,
    ) -> Parser {
        Parser {
            exec_stdout_max,
            exec_env: exec_env.to_vec(),
            persistent,
            pools: Default::default(),
        }
    }

    /// Parse one `--handler TASK=KIND:SPEC` flag.
    pub fn parse(&mut self, flag: &str) -> Result<(String, Arc<dyn Handler>)> {
        let (task, spec) = flag
            .split_once('=')
            .ok_or_else(|| Error::Config(format!("--handler {flag:?}: missing `=`; {USAGE}")))?;
        if task.is_empty() {
            return Err(Error::Config(format!(
                "--handler {flag:?}: empty task name; {USAGE} (use `*` for every task)"
            )));
        }
        let (kind, rest) = spec
            .split_once(':')
            .ok_or_else(|| Error::Config(format!("--handler {flag:?}: missing kind; {USAGE}")))?;
        let handler: Arc<dyn Handler> = match kind {
            "exec" => Arc::new(
                exec::ExecHandler::parse(rest)?
                    .with_stdout_max(self.exec_stdout_max)
                    .with_passed_env(&self.exec_env)?,
            ),
            "persistent" => Arc::new(
                self.pools
                    .handler(task, rest, &self.persistent)
                    .map_err(|e| e.at(format!("--handler {flag:?}")))?,
            ),
            "sql" => Arc::new(sql::SqlHandler::parse(rest)?),
            other => {
                return Err(Error::Config(format!(
                    "--handler {flag:?}: unknown kind {other:?}; {USAGE}"
                )))
            }
        };
        Ok((task.to_string(), handler))
    }
}

/// `handler`, its jobs delivered in `delivery` mode whatever it asks
/// (`pgwake run --tx-tasks`).
pub fn with_delivery(handler: Arc<dyn Handler>, delivery: Delivery) -> Arc<dyn Handler> {
    Arc::new(WithDelivery { handler, delivery })
}

struct WithDelivery {
    handler: Arc<dyn Handler>,
    delivery: Delivery,
}

#[async_trait]
impl Handler for WithDelivery {
    async fn handle(
        &self,
        job: &Job,
        ctx: JobContext<'_>,
    ) -> std::result::Result<Outcome, BoxError> {
        self.handler.handle(job, ctx).await
    }

    fn delivery(&self) -> Delivery {
        self.delivery
    }

    fn decodes_payload(&self) -> bool {
        self.handler.decodes_payload()
    }

    async fn handle_batch(
        &self,
        jobs: &[Job],
        tx: &tokio_postgres::Client,
    ) -> std::result::Result<Option<Vec<Outcome>>, BoxError> {
        self.handler.handle_batch(jobs, tx).await
    }

    fn batches(&self) -> bool {
        self.handler.batches()
    }

    async fn check(&self, db: &tokio_postgres::Client) -> std::result::Result<(), BoxError> {
        self.handler.check(db).await
    }

    async fn shutdown(&self) {
        self.handler.shutdown().await
    }

    fn processes(&self) -> Option<crate::handler::HandlerProcesses> {
        self.handler.processes()
    }
}

/// A report of an `exec` or persistent handler (`handler`: its kind, the
/// metric's label): taken, or refused with a warning in the log and
/// `pgwake_progress_refused_total`; the job goes on either way.
pub(crate) fn report_or_warn(
    ctx: &JobContext<'_>,
    job: &Job,
    handler: &'static str,
    value: &serde_json::Value,
    message: Option<&str>,
) {
    if let Err(e) = ctx.progress(value, message) {
        progress_refused(job, handler, &e.to_string());
    }
}

/// Count and log a refused report of an `exec` or persistent handler.
pub(crate) fn progress_refused(job: &Job, handler: &'static str, why: &str) {
    ::metrics::counter!(crate::metrics::PROGRESS_REFUSED, "handler" => handler).increment(1);
    tracing::warn!(
        job = job.id,
        attempt = job.attempt,
        "refused a progress report of its {handler} handler, the job goes on: {}",
        exec::escape_line(why.as_bytes())
    );
}
