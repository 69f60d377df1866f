//! `persistent` handler: long-lived processes in any language, fed jobs
//! over a line protocol (docs/src/protocol.md).
//!
//! `--handler 'TASK=persistent:COMMAND [ARGS]'` starts `--processes N`
//! copies of COMMAND (one pool per distinct command, shared by every task
//! routed to it). Each says hello on its fd 4 (protocol version, tasks,
//! how many jobs it takes at once), then receives jobs on its fd 3 and
//! answers each with `done` or `fail`; a tx-mode job may also send SQL,
//! run inside its claim transaction. Its stdout and stderr go to the
//! worker's log, tagged with the process and the job.
//!
//! The queue keeps every hard part: the worker claims, leases, heartbeats,
//! limits and records outcomes exactly as for `exec`. This module only
//! carries a job to a process and its answer back, and answers for the
//! processes: pinged when silent, killed when unresponsive or when they
//! break the protocol, restarted with backoff, recycled after
//! `--max-jobs-per-process` jobs or above `--max-process-memory`. A job
//! whose process died while it ran alone there is charged an attempt; jobs
//! that were merely in flight beside others on a process that died are
//! not: each runs again alone ("isolated") until the culprit is known.

pub mod check;
mod pool;
mod process;
pub mod protocol;
mod sql;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::error::{Error, Result};
use crate::handler::{BoxError, Delivery, Handler, HandlerProcesses, JobContext};
use crate::job::{Job, Outcome};
use pool::Pool;
use process::Reply;

pub use process::LOG_TARGET;
pub use protocol::{LINE_MAX_DEFAULT, PROTOCOL_VERSION};
pub use sql::{PARAMS_MAX, ROWS_MAX};

/// How a command's processes are run.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many processes (`--processes`).
    pub processes: usize,
    /// Recycle a process after this many jobs (`--max-jobs-per-process`).
    pub max_jobs_per_process: Option<u64>,
    /// Recycle a process whose resident memory passes this many bytes
    /// (`--max-process-memory`).
    pub max_memory: Option<u64>,
    /// Ping a process silent this long.
    pub ping_interval: Duration,
    /// Kill a process silent this long (`--process-timeout`).
    pub process_timeout: Duration,
    /// A process must say hello within this (`--process-start-timeout`).
    pub start_timeout: Duration,
    /// After a cancel, a process must answer for the job within this, or
    /// is killed (`--cancel-grace`); also how long a drained process may
    /// take to exit.
    pub cancel_grace: Duration,
    /// Longest line a process may write (`--protocol-line-max`).
    pub line_max: usize,
    /// Variables of the worker's environment passed through (`--exec-env`).
    pub passed_env: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            processes: 1,
            max_jobs_per_process: None,
            max_memory: None,
            ping_interval: Duration::from_secs(5),
            process_timeout: Duration::from_secs(30),
            start_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(10),
            line_max: LINE_MAX_DEFAULT,
            passed_env: Vec::new(),
        }
    }
}

impl Options {
    /// Refuse settings that cannot work, naming the flag.
    pub fn validate(&self) -> Result<()> {
        if self.processes == 0 || self.processes > 1024 {
            return Err(Error::Config("--processes must be 1 to 1024".into()));
        }
        if self.max_jobs_per_process == Some(0) {
            return Err(Error::Config(
                "--max-jobs-per-process must be at least 1 (leave it out for no limit)".into(),
            ));
        }
        if self.process_timeout <= self.ping_interval {
            return Err(Error::Config(format!(
                "--process-timeout must be longer than the ping interval ({})",
                humantime::format_duration(self.ping_interval)
            )));
        }
        if self.line_max < 1024 {
            return Err(Error::Config(
                "--protocol-line-max must be at least 1024 bytes".into(),
            ));
        }
        crate::handlers::exec::check_names(&self.passed_env)
    }
}

/// Pools by command, so that several tasks routed to one command share its
/// processes.
#[derive(Debug, Default)]
pub struct Pools {
    by_command: std::collections::HashMap<String, Arc<Pool>>,
}

impl Pools {
    /// The handler of `task` for `COMMAND [ARGS]`: a new pool for a command
    /// not seen yet, else the command's pool.
    pub fn handler(&mut self, task: &str, spec: &str, opts: &Options) -> Result<PersistentHandler> {
        opts.validate()?;
        let words = shell_words::split(spec)
            .map_err(|e| Error::Config(format!("persistent handler {spec:?}: {e}")))?;
        let (program, args) = words
            .split_first()
            .ok_or_else(|| Error::Config("persistent handler: empty command".into()))?;
        let key = words.join("\u{0}");
        let pool = match self.by_command.get(&key) {
            Some(p) => p.clone(),
            None => {
                let resolved = crate::handlers::exec::resolve(program).ok_or_else(|| {
                    Error::Config(format!(
                        "persistent handler: command {program:?} not found or not executable (checked PATH); fix the path or install it"
                    ))
                })?;
                let label: Arc<str> = label(spec).into();
                let pool = Pool::new(
                    process::Spec {
                        program: resolved,
                        args: args.to_vec(),
                        passed_env: opts.passed_env.clone(),
                        label,
                        line_max: opts.line_max,
                    },
                    opts.clone(),
                );
                self.by_command.insert(key, pool.clone());
                pool
            }
        };
        Ok(PersistentHandler {
            pool,
            task: task.to_owned(),
        })
    }
}

/// The command as logs and metrics name it: escaped, at most 80 characters.
fn label(spec: &str) -> String {
    let text = crate::handlers::exec::escape_line(spec.trim().as_bytes());
    if text.chars().count() <= 80 {
        return text;
    }
    let mut cut: String = text.chars().take(79).collect();
    cut.push('…');
    cut
}

/// Runs the jobs of one task on a command's processes.
#[derive(Debug, Clone)]
pub struct PersistentHandler {
    pool: Arc<Pool>,
    task: String,
}

impl PersistentHandler {
    /// A handler of `task` for `COMMAND [ARGS]` with its own pool.
    pub fn new(task: &str, command: &str, opts: &Options) -> Result<PersistentHandler> {
        Pools::default().handler(task, command, opts)
    }

    /// Live processes and the jobs in flight on them.
    pub fn load(&self) -> (usize, usize) {
        self.pool.load()
    }
}

/// What became of a job's SQL so far.
#[derive(Default)]
struct SqlState {
    /// The first `step` message refused this run: the run fails whatever
    /// the process answers.
    step_refused: Option<String>,
    /// `SAVEPOINT pgwake_run` was taken (before this delivery's first
    /// statement): a delivery that must run again rolls back to it.
    savepoint: bool,
    /// A statement failed: the transaction is aborted for the job, which
    /// cannot then be done.
    failed: Option<String>,
}

/// Asks the process to stop a job whose handler future is dropped
/// (cancel, timeout, lost lease, shutdown) before its answer came.
struct Armed {
    pool: Arc<Pool>,
    proc: Arc<process::Proc>,
    id: i64,
    token: String,
    deadline: Instant,
    armed: bool,
}

impl Drop for Armed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let reason = if Instant::now() >= self.deadline {
            "timeout"
        } else {
            "cancelled"
        };
        self.pool.cancel(&self.proc, self.id, &self.token, reason);
    }
}

/// Counts a job waiting to run alone: while one waits, no process takes
/// new jobs, so that one soon has nothing in flight.
struct Isolating<'a>(&'a Pool);

impl Drop for Isolating<'_> {
    fn drop(&mut self) {
        self.0.isolating(-1);
    }
}

impl PersistentHandler {
    /// Run a statement the process sent for `job` (delivery `token`) and
    /// return the `sql_result` line.
    async fn run_sql(
        &self,
        ctx: &JobContext<'_>,
        (job, token): (&Job, &str),
        (seq, statement, params): (u64, &str, &[serde_json::Value]),
        state: &mut SqlState,
    ) -> String {
        let client = match ctx.transaction().await {
            Ok(Some(c)) => c,
            Ok(None) => {
                return protocol::sql_error(
                    job.id,
                    token,
                    seq,
                    "this job runs in lease mode, outside any transaction; SQL over the protocol is for tx-mode jobs (--tx-tasks or --tx-queues)",
                    None,
                )
            }
            Err(e) => {
                let msg = format!("the claim transaction cannot be reached: {e}");
                state.failed = Some(msg.clone());
                return protocol::sql_error(job.id, token, seq, &msg, None);
            }
        };
        if let Some(why) = &state.failed {
            return protocol::sql_error(
                job.id,
                token,
                seq,
                &format!("an earlier statement of this job failed ({why}); the job's work is rolled back when it answers"),
                Some("25P02"),
            );
        }
        let result = if state.savepoint {
            sql::run(client, statement, params).await
        } else {
            // Taken ahead of the first statement, in the same round trip.
            let (sp, r) = tokio::join!(
                client.batch_execute("SAVEPOINT pgwake_run"),
                sql::run(client, statement, params)
            );
            if let Err(e) = sp {
                let msg = format!("cannot take the job's savepoint: {e}");
                state.failed = Some(msg.clone());
                return protocol::sql_error(job.id, token, seq, &msg, None);
            }
            state.savepoint = true;
            r
        };
        match result {
            sql::SqlResult::Rows(rows, n) => protocol::sql_rows(job.id, token, seq, &rows, n),
            sql::SqlResult::Error(message, code) => {
                state.failed = Some(message.clone());
                protocol::sql_error(job.id, token, seq, &message, code.as_deref())
            }
        }
    }
}

#[async_trait]
impl Handler for PersistentHandler {
    async fn handle(
        &self,
        job: &Job,
        ctx: JobContext<'_>,
    ) -> std::result::Result<Outcome, BoxError> {
        self.pool.ensure_started().await?;
        let tx = ctx.transaction.is_some();
        let keys = [ctx.ordering_key(), ctx.unique_key(), ctx.limit_key()];
        let deadline_at = ctx.deadline.at();
        let wall_deadline = chrono::Utc::now()
            + chrono::Duration::from_std(deadline_at.saturating_duration_since(Instant::now()))
                .unwrap_or_default();
        let mut isolate = false;
        let mut state = SqlState::default();
        loop {
            let _waiting = if isolate {
                self.pool.isolating(1);
                Some(Isolating(&self.pool))
            } else {
                None
            };
            // The job's recorded steps and parents' results, for processes
            // that asked in their hello: one statement (through the claim
            // transaction in tx mode, which holds this run's steps).
            let wants = self.pool.wants();
            let inputs = if wants == 0 {
                crate::steps::Inputs::default()
            } else {
                let read = async {
                    match ctx.transaction().await.map_err(|e| e.to_string())? {
                        Some(tx) => crate::steps::inputs(tx, &[job.id]).await,
                        None => {
                            let conn = ctx.pool.get().await.map_err(|e| e.to_string())?;
                            crate::steps::inputs(&conn, &[job.id]).await
                        }
                    }
                    .map_err(|e| e.to_string())
                };
                let mut got = read.await.map_err(|e| {
                    format!("cannot read the job's recorded steps and parents' results: {e}")
                })?;
                got.remove(&job.id).unwrap_or_default()
            };
            ctx.steps.prime(inputs.steps.as_deref());
            let steps = inputs
                .steps
                .as_deref()
                .filter(|_| wants & protocol::WANTS_STEPS != 0);
            let parent_results = inputs
                .parents
                .as_deref()
                .filter(|_| wants & protocol::WANTS_PARENT_RESULTS != 0);
            let (proc, token, mut replies) = self
                .pool
                .dispatch(job.id, &job.task, isolate, |token| {
                    protocol::job(&protocol::JobLine {
                        id: job.id,
                        token,
                        task: &job.task,
                        queue: &job.queue,
                        payload: &job.payload_text,
                        attempt: job.attempt,
                        max_attempts: job.max_attempts,
                        deadline: wall_deadline,
                        tx,
                        keys,
                        trace: ctx.trace(),
                        steps,
                        parent_results,
                    })
                })
                .await;
            drop(_waiting);
            let mut armed = Armed {
                pool: self.pool.clone(),
                proc: proc.clone(),
                id: job.id,
                token: token.clone(),
                deadline: deadline_at,
                armed: true,
            };
            let gone = loop {
                let Some(reply) = replies.recv().await else {
                    break process::Gone {
                        cause: "went away".into(),
                        culprit: false,
                    };
                };
                match reply {
                    Reply::Done(_) | Reply::Snooze(_) if state.step_refused.is_some() => {
                        armed.armed = false;
                        let why = state.step_refused.unwrap_or_default();
                        return Ok(Outcome::retry(format!(
                            "the handler answered, but a step it sent was refused, so the attempt fails (steps recorded before it are kept): {why}"
                        )));
                    }
                    Reply::Done(result) => {
                        armed.armed = false;
                        if let Some(why) = state.failed {
                            return Ok(Outcome::retry(format!(
                                "the handler answered done, but a statement it sent failed ({why}); the job's work is rolled back"
                            )));
                        }
                        return Ok(match result {
                            None | Some(serde_json::Value::Null) => Outcome::Done,
                            Some(v) => Outcome::DoneWith(v),
                        });
                    }
                    Reply::Fail {
                        error,
                        for_good,
                        retry_after,
                    } => {
                        armed.armed = false;
                        return Ok(if for_good {
                            Outcome::fail(error)
                        } else if let Some(secs) = retry_after {
                            Outcome::retry_after(error, Duration::from_secs_f64(secs))
                        } else {
                            Outcome::retry(error)
                        });
                    }
                    Reply::Snooze(after) => {
                        armed.armed = false;
                        // In tx mode the job's statements roll back, as on
                        // any outcome but done.
                        return Ok(Outcome::snooze(Duration::from_secs_f64(after)));
                    }
                    Reply::Progress { value, message } => {
                        crate::handlers::report_or_warn(
                            &ctx,
                            job,
                            "persistent",
                            &value,
                            message.as_deref(),
                        );
                    }
                    Reply::Step { name, output } => {
                        let recorded = ctx.record_step(&name, &output).await;
                        if recorded.is_ok() && state.savepoint {
                            // Tx mode: recording moved the job's savepoint
                            // past this run's (released with it); the next
                            // statement takes it again.
                            state.savepoint = false;
                        }
                        let error = recorded
                            .err()
                            .map(|e| crate::handlers::exec::escape_line(e.to_string().as_bytes()));
                        if let Some(why) = &error {
                            tracing::warn!(
                                target: LOG_TARGET,
                                job = job.id,
                                attempt = job.attempt,
                                "refused a step of its persistent process, the attempt will fail: {why}"
                            );
                            state.step_refused.get_or_insert(why.clone());
                        }
                        proc.send(protocol::step_recorded(
                            job.id,
                            &token,
                            &name,
                            error.as_deref(),
                        ));
                    }
                    Reply::Sql { seq, sql, params } => {
                        let line = self
                            .run_sql(&ctx, (job, &token), (seq, &sql, &params), &mut state)
                            .await;
                        proc.send(line);
                    }
                    Reply::Gone(g) => {
                        armed.armed = false;
                        break g;
                    }
                }
            };
            if gone.culprit || isolate {
                return Ok(Outcome::retry(format!(
                    "handler process {} {} while running this job",
                    proc.index, gone.cause
                )));
            }
            // Only in flight beside others when its process died: not
            // charged; it runs again, alone, undoing what it wrote.
            if state.savepoint {
                if let Ok(Some(client)) = ctx.transaction().await {
                    client
                        .batch_execute("ROLLBACK TO SAVEPOINT pgwake_run")
                        .await?;
                }
                state = SqlState::default();
            }
            tracing::info!(
                target: LOG_TARGET,
                job = job.id,
                "job {} runs again alone: its process {} with other jobs in flight",
                job.id,
                gone.cause
            );
            isolate = true;
        }
    }

    fn delivery(&self) -> Delivery {
        Delivery::Lease
    }

    fn decodes_payload(&self) -> bool {
        false
    }

    async fn check(&self, _db: &tokio_postgres::Client) -> std::result::Result<(), BoxError> {
        let tasks = self.pool.ensure_started().await?;
        if self.task == "*" {
            if !tasks.iter().any(|t| t == "*") {
                return Err(format!(
                    "persistent handler {:?} is the catch-all (*), but its processes serve only {tasks:?}; their hello must list \"*\"",
                    self.pool.spec.label
                )
                .into());
            }
        } else if !tasks.iter().any(|t| t == &self.task || t == "*") {
            return Err(format!(
                "persistent handler {:?}: its processes serve {tasks:?}, not task {:?}; add it to their hello, or route the task to another handler",
                self.pool.spec.label, self.task
            )
            .into());
        }
        Ok(())
    }

    async fn shutdown(&self) {
        self.pool.shutdown(self.pool.opts.cancel_grace).await;
    }

    fn processes(&self) -> Option<HandlerProcesses> {
        let s = self.pool.snapshot();
        Some(HandlerProcesses {
            pool: Arc::as_ptr(&self.pool) as usize,
            command: self.pool.spec.label.to_string(),
            live: s.live,
            configured: self.pool.opts.processes,
            in_flight: s.in_flight,
            capacity: s.capacity,
            restarts: s.restarts,
            waiting: s.waiting,
        })
    }
}
