//! Running one handler for one job: the timeout, panics and cancellation
//! turned into a typed [`Execution`]. Knows nothing of transactions or of
//! how the outcome is stored.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;

use crate::handler::{Handler, JobContext};
use crate::job::{Job, Outcome};

/// How a handler run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Execution {
    /// The handler returned an outcome (an `Err` is already a retry).
    Finished(Outcome),
    /// The handler panicked or ran past its timeout: a failed attempt.
    Failed(String),
    /// The worker aborted it (shutdown past its grace period): hand the job
    /// back without using an attempt.
    Interrupted,
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Run `handler` on `job` within `timeout`, stopping early if `abort` fires.
/// Returns the execution and how long the handler ran.
pub async fn execute(
    handler: &dyn Handler,
    job: &Job,
    ctx: JobContext<'_>,
    timeout: Duration,
    abort: &CancellationToken,
) -> (Execution, Duration) {
    let started = Instant::now();
    let cancel = ctx.cancel.clone();
    let run = AssertUnwindSafe(handler.handle(job, ctx)).catch_unwind();
    let execution = tokio::select! {
        biased;
        _ = abort.cancelled() => {
            cancel.cancel();
            Execution::Interrupted
        }
        r = tokio::time::timeout(timeout, run) => match r {
            Err(_) => {
                cancel.cancel();
                Execution::Failed(format!("timed out after {}", humantime::format_duration(timeout)))
            }
            Ok(Err(panic)) => Execution::Failed(format!("handler panicked: {}", panic_message(&*panic))),
            Ok(Ok(Err(e))) => Execution::Finished(Outcome::retry(e.to_string())),
            Ok(Ok(Ok(outcome))) => Execution::Finished(outcome),
        },
    };
    (execution, started.elapsed())
}
