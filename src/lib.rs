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
//!         let tx = ctx.transaction().expect("tx mode");
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

pub mod bench;
pub mod claimer;
pub mod client;
mod completion;
pub mod config;
pub mod connect;
pub mod dead;
pub mod demo;
pub mod embedded;
pub mod endpoint;
pub mod error;
pub mod executor;
pub mod handler;
pub mod handlers;
pub mod health;
pub mod job;
mod leasemode;
pub mod listener;
pub mod metrics;
pub mod poller;
pub mod rescuer;
pub mod sampler;
pub mod schema;
pub mod signals;
pub mod stats;
mod txmode;
pub mod waiting;
pub mod wake;
pub mod worker;

pub use async_trait::async_trait;
pub use claimer::JobEvent;
pub use config::WorkerConfig;
pub use error::{Error, Result};
pub use handler::{BoxError, Handler, JobContext, Registry};
pub use job::{Job, Outcome, Resolution};
pub use worker::{Worker, WorkerBuilder};
