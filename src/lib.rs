//! pgwake: a PostgreSQL job-queue worker.
//!
//! Producers insert rows into `pgwake.jobs` (plain SQL, `pgwake.enqueue()`,
//! [`client::enqueue`] or `pgwake enqueue`); an insert trigger NOTIFYs; the
//! worker's listener wakes a pool of claim tasks that claim with
//! `DELETE … FOR UPDATE SKIP LOCKED … RETURNING`, run each job's
//! [`Handler`], and record the outcome. See `ARCHITECTURE.md`.
//!
//! ```no_run
//! use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker};
//! use tokio_util::sync::CancellationToken;
//!
//! struct SendEmail;
//!
//! #[async_trait]
//! impl Handler for SendEmail {
//!     async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
//!         let tx = ctx.transaction().await?.expect("tx mode");
//!         tx.execute("INSERT INTO sent (job_id) VALUES ($1)", &[&job.id]).await?;
//!         Ok(Outcome::Done)
//!     }
//! }
//!
//! # async fn f() -> pgwake::Result<()> {
//! let db = pgwake::connect::parse_url("postgres://localhost/app")?;
//! let worker = Worker::builder(db).handler("send_email", SendEmail).build()?;
//! worker.run(CancellationToken::new(), CancellationToken::new()).await
//! # }
//! ```
#![warn(missing_docs)]
//!
//! ## What this crate offers an embedder
//!
//! | need | where |
//! |---|---|
//! | run a worker | [`Worker`], [`WorkerBuilder`], [`WorkerConfig`] (defaults: the `*_DEFAULT` constants in [`config`]), [`JobEvent`], [`Health`] |
//! | write a handler | [`Handler`], [`JobContext`], [`Job`], [`Outcome`], [`Resolution`]; built-in `exec`/`sql` handlers in [`handlers`] |
//! | enqueue jobs | [`client`] |
//! | recurring jobs | [`schedules`] (define, list, remove), [`cron`] (expressions), [`scheduler`] (the service every worker runs) |
//! | administer | [`schema`] (migrate), [`dead`] (dead jobs), [`cancel`](mod@cancel) (cancel jobs), [`stats`] (queue depth), [`history`] (finished jobs and results, retention) |
//! | recurring jobs | [`schedules`] (add, list, remove), [`cron`] (expressions, DST rule), [`scheduler`] (the service every worker runs) |
//! | connect | [`connect`] (parsing, connections, pools), [`conninfo`] (libpq URLs, key=value strings, `PG*` environment), [`tls`] (`sslmode`) |
//! | serve metrics, stop on signals | [`endpoint`], [`metrics`], [`signals`] |
//! | errors | [`Error`], [`Result`] |
//!
//! The command line's own tools (`pgwake demo`, `pgwake bench`, the
//! throwaway clusters they start) are part of the `pgwake` binary, not of
//! this library.

// The public surface: what an embedder needs.
pub mod cancel;
pub mod client;
pub mod config;
pub mod connect;
pub mod conninfo;
pub mod cron;
pub mod dead;
pub mod endpoint;
pub mod error;
pub mod handler;
pub mod handlers;
pub mod history;
pub mod job;
pub mod metrics;
pub mod queues;
pub mod scheduler;
pub mod schedules;
pub mod schema;
pub mod signals;
pub mod stats;
pub mod tls;
pub mod worker;

// Services that the test suite drives directly (`run_once`, one sample).
// Reachable so that the tests can use them, hidden from the documentation:
// they are not part of the API and change without notice.
#[doc(hidden)]
pub mod rescuer;
#[doc(hidden)]
pub mod sampler;
#[doc(hidden)]
pub mod sql;

/// Not part of the API: what the `pgwake` binary's bench needs from inside
/// the worker.
#[doc(hidden)]
pub mod internal {
    /// How long a worker lingers after its last claim that found jobs before
    /// it registers as waiting (the bench sizes its idle gaps with it).
    pub use crate::waiting::LINGER;
}

// Internals: the claim path (claimer → txmode | leasemode → completer, with
// the claim context and plan), and the services around it.
mod claimed;
mod claimer;
mod completer;
mod context;
mod executor;
mod fair;
mod health;
mod leasemode;
mod leases;
mod listener;
mod plan;
mod poller;
mod rate;
mod txmode;
mod waiting;
mod wake;

pub use async_trait::async_trait;
pub use cancel::{cancel, CancelOutcome};
pub use config::WorkerConfig;
pub use context::JobEvent;
pub use error::{Error, Result};
pub use handler::{BoxError, Delivery, Handler, JobContext};
pub use health::Health;
pub use job::{Job, Outcome, Resolution};
pub use txmode::TX_BATCH_TARGET;
pub use worker::{Worker, WorkerBuilder};
