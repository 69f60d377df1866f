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
#![warn(unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]
//!
//! ## What this crate offers an embedder
//!
//! | need | where |
//! |---|---|
//! | run a worker | [`Worker`], [`WorkerBuilder`], [`WorkerConfig`] (defaults: the `*_DEFAULT` constants in [`config`]), [`JobEvent`], [`Health`] |
//! | write a handler | [`Handler`], [`JobContext`], [`Job`], [`Outcome`], [`Resolution`]; built-in `exec`/`sql` handlers in [`handlers`] |
//! | enqueue jobs | [`client`] |
//! | administer | [`admin::schema`] (migrate), [`admin::queues`] (pause, limits, rates), [`admin::dead`] (dead jobs), [`cancel()`] (cancel jobs), [`admin::stats`] (queue depth), [`admin::history`] (finished jobs and results, retention) |
//! | recurring jobs | [`admin::schedules`] (add, list, remove), [`admin::cron`] (expressions, DST rule); every worker runs the scheduler |
//! | connect | [`connect`] (parsing, libpq URLs and `PG*` environment, TLS, connections, pools) |
//! | the operator console (web pages) | [`console`] |
//! | serve metrics, stop on signals | [`endpoint`], [`metrics`], [`signals`] |
//! | errors | [`Error`], [`Result`] |
//!
//! The command line's own tools (`pgwake demo`, `pgwake bench`, the
//! throwaway clusters they start) are part of the `pgwake` binary, not of
//! this library.

// The public API: what an embedder uses. Everything else is private; the
// roles are the folders (see ARCHITECTURE.md, "The tree shows the roles").
pub mod admin;
pub mod client;
pub mod config;
#[cfg(feature = "console")]
#[cfg_attr(docsrs, doc(cfg(feature = "console")))]
pub mod console;
#[cfg(feature = "endpoint")]
#[cfg_attr(docsrs, doc(cfg(feature = "endpoint")))]
pub mod endpoint;
pub mod error;
pub mod handlers;
pub mod metrics;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;
pub mod signals;
pub mod trace;

mod handler;
mod health;
mod job;
mod progress;
mod steps;
mod worker;

/// One job's way from claim to outcome (private).
mod claim;
/// The database: connecting, TLS, and the statement catalogue (private,
/// but for [`connect`]).
mod db;
/// What runs beside the claim path in every worker (private).
mod services;

pub use db::connect;

/// Not part of the API: what the `pgwake` binary's bench and the test suite
/// reach inside the worker for. Changes without notice.
#[doc(hidden)]
pub mod internal {
    pub use crate::claim::choose::idle::LINGER;
    pub use crate::config::SchedulerConfig;
    pub use crate::db::sql;
    pub use crate::services::history::{Maintenance, MaintenanceReport};
    pub use crate::services::scheduler::{RoundReport, Scheduler};
    pub use crate::services::{rescuer, sampler};
}

pub use admin::cancel::{cancel, CancelOutcome};
pub use async_trait::async_trait;
pub use claim::context::JobEvent;
pub use claim::tx::{TX_BATCH_TARGET, TX_BATCH_UNDER_PRESSURE};
pub use config::WorkerConfig;
pub use error::{Error, Result};
pub use handler::{
    BoxError, ClaimClient, Delivery, Handler, HandlerProcesses, JobContext, ParentResult,
    PARENT_RESULTS_MAX,
};
pub use health::Health;
pub use job::{
    Job, Outcome, Resolution, Signal, PAYLOAD_DEPTH_LIMIT, SIGNAL_PAYLOAD_MAX, SLEEP_MAX,
    SNOOZES_WARN, SNOOZE_MAX,
};
pub use progress::{ProgressError, PROGRESS_DEPTH_MAX, PROGRESS_MESSAGE_MAX, PROGRESS_VALUE_MAX};
pub use steps::{StepError, STEPS_PER_JOB_MAX, STEP_NAME_MAX, STEP_OUTPUT_MAX};
pub use trace::TraceContext;
pub use worker::{Worker, WorkerBuilder};

// The crates whose types the API takes and returns, so an embedder names
// them at the versions this crate was built with instead of adding them at
// versions that must match.
pub use deadpool_postgres;
pub use tokio_postgres;
pub use tokio_util::sync::CancellationToken;

// The Rust examples of the README and the book compile (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/producing.md")]
struct ProducingExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/handlers.md")]
struct HandlersExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/steps.md")]
struct StepsExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/cancelling.md")]
struct CancellingExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/queues.md")]
struct QueuesExamples;
#[cfg(doctest)]
#[doc = include_str!("../docs/src/schedules.md")]
struct SchedulesExamples;
