//! Handlers: what runs a job. Rust code implements [`Handler`]; everyone else
//! configures an `exec` command or a `sql` function per task name
//! (`pgwake run --handler`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use crate::job::{Job, Outcome};

/// The error type handlers return with `?`: any error counts as a failed
/// attempt (retried with backoff, dead at `max_attempts`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How the jobs of a task are delivered (see docs/src/delivery.md, "Delivery
/// modes").
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Delivery {
    /// The claim transaction stays open while the handler runs; the handler
    /// may write through it ([`JobContext::transaction`]) and its writes
    /// commit atomically with the job's removal. For short jobs and for work
    /// in the same database.
    Tx,
    /// The claim commits at once and the job is leased to this worker; the
    /// handler runs outside any transaction while a heartbeat renews the
    /// lease. For work outside the database and for long jobs: no connection
    /// is held and no vacuum horizon pinned while it runs.
    Lease,
}

impl Delivery {
    /// `tx` or `lease`.
    pub fn as_str(self) -> &'static str {
        match self {
            Delivery::Tx => "tx",
            Delivery::Lease => "lease",
        }
    }
}

/// The claim transaction's connection, as [`JobContext::transaction`]
/// hands it to a `tx`-mode handler: use it as the
/// [`tokio_postgres::Client`] it dereferences to (`tx.execute(…)`, or
/// `&tx` where a `&Client` is wanted; `&**tx` for a generic
/// `impl GenericClient`).
///
/// The job's `SAVEPOINT` is taken when the handler first reaches the
/// client through it (any method call), and sent ahead of that call's
/// statement on the same connection: it costs no round trip of its own,
/// and a handler that asks for the transaction but sends nothing costs the
/// server nothing. A handler that fails is rolled back to it alone, so its
/// batch's other jobs keep their work. A failure to take it shows as the
/// first statement's error.
pub struct ClaimClient<'a> {
    pub(crate) client: &'a Client,
    /// The savepoint was taken (the handler reached the client).
    pub(crate) savepoint: AtomicBool,
    /// Sends the savepoint ahead (`claim::tx::ahead`).
    pub(crate) take_savepoint: &'a dyn TakeSavepoint,
    /// The batch's asynchronous mark: made durable before the handler gets
    /// the connection (`claim::tx::mark::Mark`).
    pub(crate) mark: Option<&'a dyn DurableMark>,
}

/// What a handler's first [`JobContext::transaction`] call does: send its
/// job's savepoint ahead (a trait object, so that the handler's context
/// need not carry the claim connection's lifetime). Implemented in
/// `claim::tx::ahead`; defined here so that this public file does not name
/// the claim path.
pub(crate) trait TakeSavepoint: Send + Sync {
    /// Send the job's `SAVEPOINT` ahead, the first time only. Returns once
    /// it is queued, so that no statement the handler sends after this call
    /// (from any thread) can pass it.
    fn take(&self);
}

/// A tx batch's asynchronous mark (`claim::tx::mark::Mark`), made durable
/// before a handler of the batch first gets the claim connection.
pub(crate) trait DurableMark: Send + Sync {
    /// Wait until the mark is durable (at once when it already is).
    fn make_durable(
        &self,
    ) -> futures::future::BoxFuture<'_, std::result::Result<(), tokio_postgres::Error>>;
}

/// A job's ordering key, unique key, ordering position (its run_at as
/// enqueued, migration 0008) and limit key, which a retry keeps. Read by
/// [`JobContext`]; filled from the claimed row (`claim::run::claimed`).
#[derive(Clone, Default)]
pub(crate) struct Keys {
    pub ordering_key: Option<String>,
    pub unique_key: Option<String>,
    pub ordering_at: Option<std::time::SystemTime>,
    /// Its limit key (migration 0020), which a retry keeps.
    pub limit_key: Option<String>,
}

impl std::ops::Deref for ClaimClient<'_> {
    type Target = Client;

    /// The client, with the job's savepoint queued ahead of anything sent
    /// through it from now on (from any thread: a racing caller returns
    /// only once it is queued).
    fn deref(&self) -> &Client {
        if !self.savepoint.load(Ordering::Acquire) {
            self.take_savepoint.take();
            self.savepoint.store(true, Ordering::Release);
        }
        self.client
    }
}

impl std::fmt::Debug for ClaimClient<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimClient")
            .field("savepoint", &self.savepoint.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The job's deadline, which the handler may push back
/// ([`JobContext::extend_timeout`]).
#[derive(Debug)]
pub(crate) struct Deadline {
    /// When the timeout started counting.
    since: Instant,
    at: Mutex<Instant>,
    pub(crate) extended: tokio::sync::Notify,
}

impl Deadline {
    pub(crate) fn new(timeout: Duration) -> Deadline {
        let since = Instant::now();
        Deadline {
            since,
            at: Mutex::new(since + timeout),
            extended: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn at(&self) -> Instant {
        *self.at.lock().expect("deadline lock")
    }

    /// The timeout as set (and extended): from when it started counting.
    pub(crate) fn limit(&self) -> Duration {
        self.at().saturating_duration_since(self.since)
    }

    fn extend_to(&self, at: Instant) {
        let mut cur = self.at.lock().expect("deadline lock");
        if at > *cur {
            *cur = at;
        }
        drop(cur);
        self.extended.notify_waiters();
    }
}

/// What a handler gets besides the job.
pub struct JobContext<'a> {
    pub(crate) transaction: Option<&'a ClaimClient<'a>>,
    pub(crate) pool: &'a deadpool_postgres::Pool,
    pub(crate) cancel: CancellationToken,
    pub(crate) deadline: &'a Deadline,
    pub(crate) admitted_at: Option<SystemTime>,
    pub(crate) keys: &'a Keys,
    pub(crate) progress: &'a crate::progress::Reporter,
    pub(crate) steps: crate::steps::Steps,
    pub(crate) trace: Option<crate::trace::TraceContext>,
    /// The job's recorded steps and parents' results, read with its lease
    /// claim when its handler [reads them up front](Handler::reads_inputs).
    pub(crate) inputs: Option<crate::steps::Inputs>,
}

impl<'a> JobContext<'a> {
    /// In `tx` mode, the connection that holds the claim transaction: what a
    /// handler writes through it commits atomically with the job's removal,
    /// and is rolled back (to a savepoint taken on the handler's first
    /// statement, see [`ClaimClient`]) if the handler fails. Never send
    /// `COMMIT`/`ROLLBACK` on it. `Ok(None)` in `lease` mode.
    pub async fn transaction(&self) -> Result<Option<&'a ClaimClient<'a>>, tokio_postgres::Error> {
        let Some(tx) = self.transaction else {
            return Ok(None);
        };
        // The handler gets the connection once the batch's mark is durable
        // (at once when it already is): a statement of a job that crashes
        // the server must find its batch marked.
        if let Some(mark) = tx.mark {
            mark.make_durable().await?;
        }
        Ok(Some(tx))
    }

    /// What this job's parents left it (a flow's child, see the book's
    /// "Flows" page, "Results"): one entry per parent that ended, by the
    /// parent's id. A parent that ended done gives
    /// [`ParentResult::Result`] (its [`Outcome::DoneWith`](crate::Outcome::DoneWith)
    /// value, `Null` when it returned none); one that ended dead or
    /// cancelled, when this job runs anyway (`on_parent_failure 'run'`),
    /// gives [`ParentResult::Error`]. A child receives at most
    /// [`PARENT_RESULTS_MAX`] bytes of results, summed in parent id order;
    /// a result past that is [`ParentResult::Omitted`] with its size.
    /// Results are kept for the child whatever the history setting. One
    /// query on the worker's pool per call (a job without parents gets an
    /// empty map); it does not use the claim transaction.
    ///
    /// ```no_run
    /// # async fn f(ctx: pgwake::JobContext<'_>) -> pgwake::Result<()> {
    /// for (parent, got) in ctx.parent_results().await? {
    ///     if let pgwake::ParentResult::Result(value) = got {
    ///         println!("parent {parent} returned {value}");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn parent_results(
        &self,
    ) -> crate::Result<std::collections::BTreeMap<i64, ParentResult>> {
        let conn = self
            .pool
            .get()
            .await
            .map_err(crate::Error::pool("parent results: no connection"))?;
        let row = crate::db::sql::Db::unnamed(&conn)
            .query_one(&crate::db::sql::PARENT_RESULTS, &[&self.steps.job])
            .await
            .map_err(crate::Error::db("parent results"))?;
        let text: String = row.get(0);
        parse_parent_results(&text)
    }

    /// The summary of the batch whose callback this job is (docs/src/
    /// flows.md → "Batches"): counts by outcome and the failed ids, as they
    /// were when the batch's last job ended. A job that is no batch's
    /// callback gets a usage error ([`crate::Error::Config`]).
    pub async fn batch_status(&self) -> crate::Result<crate::client::BatchStatus> {
        let conn = self
            .pool
            .get()
            .await
            .map_err(crate::Error::pool("batch status: no connection"))?;
        crate::client::batch_status(&**conn, self.steps.job).await
    }

    /// When this run was admitted by its queue's rate limit (`pgwake queue
    /// set Q --rate N/s`) or, for a job with a limit key, by its key's rate
    /// (`--rate-per-key N/s`, which takes precedence when both are set), by
    /// the database's clock; `None` when no rate applies. The limit holds
    /// on these times: no window of its length holds more admissions than
    /// its count. The handler starts right after (the claim statement is
    /// between them).
    pub fn admitted_at(&self) -> Option<SystemTime> {
        self.admitted_at
    }

    /// The W3C trace context of this run, when the worker traces jobs
    /// ([`WorkerConfig::trace_jobs`](crate::WorkerConfig::trace_jobs), on
    /// with an OTLP endpoint or `pgwake run --trace-jobs`): with spans
    /// exported, the context of this run's `pgwake.run` span (a child of
    /// the producer's span), so what the handler calls with it nests under
    /// the run; without, the producer's context as stored. `None` when the
    /// worker does not trace jobs, or the job came without a context and no
    /// span was exported. A Rust handler's own `tracing` spans nest under
    /// the run span without it.
    pub fn trace(&self) -> Option<&crate::trace::TraceContext> {
        self.trace.as_ref()
    }

    /// This run's `traceparent` (see [`JobContext::trace`]).
    pub fn traceparent(&self) -> Option<&str> {
        self.trace.as_ref().map(|t| t.traceparent.as_str())
    }

    /// The job's ordering key (`ordering_key`), if it has one.
    pub fn ordering_key(&self) -> Option<&'a str> {
        self.keys.ordering_key.as_deref()
    }

    /// The job's unique key (`unique_key`), if it has one.
    pub fn unique_key(&self) -> Option<&'a str> {
        self.keys.unique_key.as_deref()
    }

    /// The job's limit key (`limit_key`: who it is for, for per-key limits,
    /// rates and fair keys), if it has one.
    pub fn limit_key(&self) -> Option<&'a str> {
        self.keys.limit_key.as_deref()
    }

    /// Report how far this run has got: a small JSON value (at most
    /// [`PROGRESS_VALUE_MAX`](crate::PROGRESS_VALUE_MAX) bytes of JSON,
    /// [`PROGRESS_DEPTH_MAX`](crate::PROGRESS_DEPTH_MAX) deep) and an
    /// optional message (at most
    /// [`PROGRESS_MESSAGE_MAX`](crate::PROGRESS_MESSAGE_MAX) characters),
    /// shown by `pgwake job show`, `pgwake explain` and the console while
    /// the job runs. No I/O: the worker keeps the latest report and writes
    /// it within `--progress-interval` (one statement for every running job
    /// that reported), so calling it in a tight loop is fine. A report over
    /// a bound is refused with an `Err` and changes nothing; the run goes
    /// on. In both modes it is visible at once to other sessions (it is not
    /// part of the claim transaction), and it goes when the run ends.
    ///
    /// ```no_run
    /// # async fn f(ctx: pgwake::JobContext<'_>) -> Result<(), pgwake::ProgressError> {
    /// ctx.progress(&serde_json::json!({"done": 40, "of": 100}), Some("importing rows"))?;
    /// # Ok(()) }
    /// ```
    pub fn progress(
        &self,
        value: &serde_json::Value,
        message: Option<&str>,
    ) -> Result<(), crate::progress::ProgressError> {
        self.progress.report(value, message)
    }

    /// How this job's last wait for a signal ([`Outcome::WaitFor`](crate::Outcome::WaitFor)) ended:
    /// `None` when its last wait (if any) was not for a signal — the first
    /// run, or a sleep since; [`Signal::Received`](crate::Signal::Received)
    /// with the payload when a signal for its key came;
    /// [`Signal::TimedOut`](crate::Signal::TimedOut) when the run began
    /// without one (the timeout passed). It keeps saying so on later runs
    /// (a retry after a failure) until the job waits again, so a handler
    /// reads straight through: its recorded steps, then the wait, then
    /// what the signal brought. One read of `pgwake.job_waits` on the
    /// worker's pool per call.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn f(ctx: pgwake::JobContext<'_>) -> Result<pgwake::Outcome, pgwake::BoxError> {
    /// let order: i64 = ctx.step("order", async { Ok::<_, pgwake::BoxError>(42) }).await?;
    /// match ctx.signal().await? {
    ///     None => Ok(pgwake::Outcome::wait_for(
    ///         format!("payment:{order}"),
    ///         Duration::from_secs(3 * 86400),
    ///     )),
    ///     Some(pgwake::Signal::Received(payment)) => {
    ///         println!("paid: {payment}");
    ///         Ok(pgwake::Outcome::Done)
    ///     }
    ///     Some(_timed_out) => Ok(pgwake::Outcome::fail("no payment within 3 days")),
    /// }
    /// # }
    /// ```
    pub async fn signal(&self) -> crate::Result<Option<crate::job::Signal>> {
        use crate::db::sql::{Db, SIGNAL_OF_JOB};
        let conn = self
            .pool
            .get()
            .await
            .map_err(crate::Error::pool("signal: no connection"))?;
        let rows = Db::unnamed(&conn)
            .query(&SIGNAL_OF_JOB, &[&self.steps.job])
            .await
            .map_err(crate::Error::db("signal: read the job's wait"))?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let state: Option<String> = row.get(0);
        Ok(match state.as_deref() {
            Some("received") => {
                let payload: Option<String> = row.get(1);
                let value = match payload {
                    Some(text) => serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
                    None => serde_json::Value::Null,
                };
                Some(crate::job::Signal::Received(value))
            }
            _ => Some(crate::job::Signal::TimedOut),
        })
    }

    /// Run one durable step of this job: if the job has a recorded step of
    /// this `name` (from an earlier run: a retry, a crash, a lost lease, a
    /// deploy), return its stored output without polling `step`; otherwise
    /// run `step` and, when it returns `Ok`, record its output (as JSON)
    /// before returning it. An `Err` records nothing: the step runs again
    /// on the job's next run. See the book's "Durable steps" page.
    ///
    /// - **Lease mode:** the output is written on the worker's pool before
    ///   this returns, fenced by the run's lease token: a run that lost its
    ///   lease records nothing ([`StepError::LostLease`](crate::StepError::LostLease); stop the run).
    /// - **tx mode:** the output is written through the claim transaction,
    ///   so it commits with what the step wrote through it, and a crash
    ///   loses both. A failed attempt (an `Err`, a panic, a timeout, a
    ///   cancel) is rolled back only to its last finished step: its
    ///   finished steps and their writes commit with the retry. Run the
    ///   steps of a tx-mode job one after another, not concurrently.
    ///
    /// Bounds: a name of 1 to [`STEP_NAME_MAX`](crate::STEP_NAME_MAX)
    /// characters of `A-Z a-z 0-9 _ . : -`, unique within the run; an
    /// output of at most [`STEP_OUTPUT_MAX`](crate::STEP_OUTPUT_MAX) bytes
    /// of JSON; at most [`STEPS_PER_JOB_MAX`](crate::STEPS_PER_JOB_MAX)
    /// steps a job. Recorded steps go with the job (kept in its history
    /// when history is on).
    ///
    /// ```no_run
    /// # async fn f(ctx: pgwake::JobContext<'_>) -> Result<(), pgwake::BoxError> {
    /// let charge: String = ctx
    ///     .step("charge", async { Ok::<_, pgwake::BoxError>("ch_123".to_string()) })
    ///     .await?;
    /// ctx.step("email", async move {
    ///     println!("receipt for {charge}");
    ///     Ok::<_, pgwake::BoxError>(())
    /// })
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub async fn step<T, E, F>(&self, name: &str, step: F) -> Result<T, crate::steps::StepError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
        E: Into<BoxError>,
        F: std::future::Future<Output = Result<T, E>>,
    {
        use crate::steps::StepError;
        if let Some(output) = self.step_begin(name).await? {
            return serde_json::from_str(&output).map_err(|e| StepError::Json {
                name: name.to_string(),
                error: format!("its recorded output {output:.200} is not the type asked for: {e}"),
            });
        }
        let output = step.await.map_err(|e| StepError::Failed {
            name: name.to_string(),
            error: e.into(),
        })?;
        let text = crate::steps::output_text(name, &output)?;
        self.step_record(name, text).await?;
        Ok(output)
    }

    /// Record the output of step `name` that an `exec` command or a
    /// persistent process ran (a `pgwake-step:` line, a `step` message),
    /// with [`JobContext::step`]'s checks and bounds, in the same place
    /// (lease mode: on the pool, fenced; tx mode: through the claim
    /// transaction). A step the job has recorded already is refused
    /// ([`StepError::AlreadyRecorded`](crate::StepError::AlreadyRecorded)),
    /// its recorded output kept.
    pub(crate) async fn record_step(
        &self,
        name: &str,
        output: &serde_json::Value,
    ) -> Result<(), crate::steps::StepError> {
        if self.step_begin(name).await?.is_some() {
            return Err(crate::steps::StepError::AlreadyRecorded(name.to_string()));
        }
        let text = crate::steps::output_text(name, output)?;
        self.step_record(name, text).await
    }

    /// A connection of the pool for a lease-mode step (none is held while
    /// the step runs: a step may take minutes, and the pool is the
    /// worker's).
    async fn step_connection(
        &self,
        name: &str,
    ) -> Result<deadpool_postgres::Object, crate::steps::StepError> {
        use crate::steps::StepError;
        self.pool.get().await.map_err(|e| match e {
            deadpool_postgres::PoolError::Backend(error) => StepError::Database {
                name: name.to_string(),
                error,
            },
            other => StepError::Failed {
                name: name.to_string(),
                error: format!("no connection to read or record it: {other}").into(),
            },
        })
    }

    /// Begin step `name` ([`Steps::begin`](crate::steps::Steps)): through
    /// the claim transaction in tx mode (its savepoint taken), on the pool
    /// in lease mode.
    async fn step_begin(&self, name: &str) -> Result<Option<String>, crate::steps::StepError> {
        let tx = self
            .transaction()
            .await
            .map_err(|error| crate::steps::StepError::Database {
                name: name.to_string(),
                error,
            })?;
        match tx {
            Some(tx) => self.steps.begin(tx, name).await,
            None => {
                self.steps
                    .begin(&**self.step_connection(name).await?, name)
                    .await
            }
        }
    }

    /// Record step `name`'s output (JSON text within the bound) where
    /// [`JobContext::step_begin`] read.
    async fn step_record(&self, name: &str, text: String) -> Result<(), crate::steps::StepError> {
        let tx = self
            .transaction()
            .await
            .map_err(|error| crate::steps::StepError::Database {
                name: name.to_string(),
                error,
            })?;
        match tx {
            Some(tx) => self.steps.record(tx, name, text).await,
            None => {
                self.steps
                    .record(&**self.step_connection(name).await?, name, text)
                    .await
            }
        }
    }

    /// The worker's pool, for work that must not be part of the claim
    /// transaction.
    pub fn pool(&self) -> &'a deadpool_postgres::Pool {
        self.pool
    }

    /// Cancelled when the job must stop: its timeout passed, its lease was
    /// lost, or the worker is shutting down past its grace period. A handler
    /// that awaits is simply dropped at that point; this is for handlers
    /// that poll or spawn.
    pub fn cancelled(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Push this run's deadline back to `by` from now (never earlier than it
    /// already is). In `lease` mode the heartbeat keeps the lease for as long
    /// as the job runs; in `tx` mode the server's idle and statement limits
    /// of the claim transaction follow the new deadline.
    pub async fn extend_timeout(&self, by: Duration) -> Result<(), tokio_postgres::Error> {
        let at = Instant::now() + by;
        if let Some(tx) = self.transaction {
            let ms = (by + crate::config::IDLE_TIMEOUT_MARGIN)
                .as_millis()
                .to_string();
            crate::db::sql::Db::unnamed(tx.client)
                .execute(&crate::db::sql::SET_LIMITS, &[&ms])
                .await?;
        }
        self.deadline.extend_to(at);
        Ok(())
    }
}

/// Runs jobs of one task name.
#[async_trait]
pub trait Handler: Send + Sync + 'static {
    /// Run one job. `Ok(outcome)` says what happened; `Err` is a failed
    /// attempt. A panic is caught and also counts as a failed attempt.
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError>;

    /// How this task's jobs are delivered. Default [`Delivery::Tx`]: for a
    /// short job it is the cheapest mode (one claim statement and one commit
    /// per batch, no per-job writes; see docs/src/performance.md) and it lets the
    /// handler write exactly once through the claim transaction. Return
    /// [`Delivery::Lease`] for work outside the database that may take long
    /// (HTTP calls, commands): no connection is held while it runs.
    fn delivery(&self) -> Delivery {
        Delivery::Tx
    }

    /// Whether this handler reads [`Job::payload`] (the decoded value).
    /// Handlers that only read [`Job::payload_text`] return false and also
    /// get payloads too deeply nested to decode; for the others such a job
    /// goes to `dead_jobs` with the reason, payload intact. Default true.
    fn decodes_payload(&self) -> bool {
        true
    }

    /// Whether a lease-mode claim should read each job's recorded steps
    /// and parents' results with the claim (one statement per claim, on
    /// the claim's connection) for this handler: the built-in `exec`
    /// handler gives them to every command up front. Default false: a
    /// handler that reads them asks when it needs them
    /// ([`JobContext::step`], [`JobContext::parent_results`]).
    #[doc(hidden)]
    fn reads_inputs(&self) -> bool {
        false
    }

    /// Run a whole `tx`-mode batch of this task's jobs at once, inside the
    /// claim transaction (e.g. one statement over every payload). Return
    /// `Some(outcomes)` (one per job, in order) when it worked; `None` to have
    /// the jobs run one by one with [`Handler::handle`] (each in its own
    /// savepoint). An error is handled like `None`: everything the batch
    /// attempt wrote is rolled back first. Default: `None` without any I/O.
    async fn handle_batch(
        &self,
        _jobs: &[Job],
        _tx: &Client,
    ) -> Result<Option<Vec<Outcome>>, BoxError> {
        Ok(None)
    }

    /// Whether [`Handler::handle_batch`] may return `Some`: lets the worker
    /// skip the batch savepoint for handlers that never batch. Default false.
    fn batches(&self) -> bool {
        false
    }

    /// Checked once when the worker starts, against the database: a handler
    /// that cannot work (a SQL function that does not exist) stops the
    /// worker with this error instead of failing every job. The worker calls
    /// it inside a transaction (rolled back if a check fails): a check that
    /// tries something that may fail uses a savepoint.
    async fn check(&self, _db: &Client) -> Result<(), BoxError> {
        Ok(())
    }

    /// Called once when the worker stops, after its jobs have ended (or
    /// been interrupted): release what the handler keeps running (the
    /// processes of a `persistent` handler). Default: nothing.
    async fn shutdown(&self) {}

    /// The processes this handler keeps, as they are now (a `persistent`
    /// handler's pool), for the worker registry, the console and
    /// `pgwake explain`. Default `None`: it keeps none.
    fn processes(&self) -> Option<HandlerProcesses> {
        None
    }
}

/// What a handler that keeps processes reports about them
/// ([`Handler::processes`]): one pool of processes, which several tasks'
/// handlers may share.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HandlerProcesses {
    /// The same for every handler sharing the pool (the worker lists a
    /// pool once, with all its tasks).
    pub(crate) pool: usize,
    /// The command, as logs and metrics name it (escaped, at most 80
    /// characters).
    pub command: String,
    /// Processes running and past their hello.
    pub live: usize,
    /// Processes configured (`--processes`).
    pub configured: usize,
    /// Jobs in flight on the live processes.
    pub in_flight: usize,
    /// Jobs the live processes take at once (the sum of their hellos'
    /// `inflight`).
    pub capacity: usize,
    /// Processes restarted so far, of every cause (crashes, kills,
    /// recycling, failed starts).
    pub restarts: u64,
    /// Jobs this worker started whose handler waits for a process with
    /// room: the pool is the bottleneck while this is above 0.
    pub waiting: usize,
}

/// Handlers by task name, with an optional catch-all (`*`).
#[derive(Clone, Default)]
pub(crate) struct Registry {
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
    /// Register `handler` for `task`; `*` registers the catch-all. Returns
    /// false (and changes nothing) if `task` already has a handler.
    pub(crate) fn insert(&mut self, task: &str, handler: Arc<dyn Handler>) -> bool {
        if task == "*" {
            if self.catch_all.is_some() {
                return false;
            }
            self.catch_all = Some(handler);
        } else {
            if self.by_task.contains_key(task) {
                return false;
            }
            self.by_task.insert(task.to_string(), handler);
        }
        true
    }

    /// The handler for `task`, falling back to the catch-all.
    pub(crate) fn get(&self, task: &str) -> Option<&Arc<dyn Handler>> {
        self.by_task.get(task).or(self.catch_all.as_ref())
    }

    /// Task names with a handler (`*` for the catch-all), sorted.
    pub(crate) fn tasks(&self) -> Vec<String> {
        let mut tasks: Vec<String> = self.by_task.keys().cloned().collect();
        tasks.sort();
        if self.catch_all.is_some() {
            tasks.push("*".into());
        }
        tasks
    }

    /// The catch-all handler, if any.
    pub(crate) fn catch_all(&self) -> Option<&Arc<dyn Handler>> {
        self.catch_all.as_ref()
    }

    /// Named tasks and their handlers.
    pub(crate) fn named(&self) -> impl Iterator<Item = (&String, &Arc<dyn Handler>)> {
        self.by_task.iter()
    }

    /// Whether no handler at all is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_task.is_empty() && self.catch_all.is_none()
    }
}

/// The most bytes of JSON a job receives from its parents' results
/// ([`JobContext::parent_results`]), summed over its parents in id order
/// (the database's `pgwake.max_parent_results_bytes()`).
pub const PARENT_RESULTS_MAX: usize = 1 << 20;

/// What one parent left a child ([`JobContext::parent_results`]).
#[derive(Debug, Clone, PartialEq)]
pub enum ParentResult {
    /// The parent ended done with this result (`Null` when it returned none).
    Result(serde_json::Value),
    /// The parent ended dead or cancelled with this error, and the child
    /// runs anyway (`on_parent_failure 'run'`).
    Error(String),
    /// The result would have taken the child past [`PARENT_RESULTS_MAX`]:
    /// left out. Its size in bytes of JSON; it stays readable in
    /// `pgwake.job_parents.result` until the child ends.
    Omitted {
        /// The result's size, in bytes of JSON text.
        bytes: u64,
    },
}

/// Parse `pgwake.parent_results`'s object.
pub(crate) fn parse_parent_results(
    text: &str,
) -> crate::Result<std::collections::BTreeMap<i64, ParentResult>> {
    let bad = |_| crate::Error::Unexpected("parent results: not an object of parent ids");
    let value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e: serde_json::Error| bad(e.to_string()))?;
    let mut out = std::collections::BTreeMap::new();
    for (id, entry) in value {
        let id: i64 = id.parse().map_err(|_| bad(String::new()))?;
        let got = if let Some(e) = entry.get("error").and_then(|e| e.as_str()) {
            ParentResult::Error(e.to_string())
        } else if let Some(bytes) = entry.get("omitted").and_then(|b| b.as_u64()) {
            ParentResult::Omitted { bytes }
        } else {
            ParentResult::Result(entry.get("result").cloned().unwrap_or_default())
        };
        out.insert(id, got);
    }
    Ok(out)
}
