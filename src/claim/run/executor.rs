//! Running one handler for one job: its deadline (which the handler may
//! extend), panics and interruption turned into an [`Outcome`]. Knows
//! nothing of transactions or of how the outcome is stored.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::handler::{Deadline, Handler, JobContext};
use crate::job::{Job, Outcome};

/// How a handler run ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Ended {
    /// The handler returned (an `Err` is already a retry), panicked, or ran
    /// past its deadline (both retries).
    Outcome(Outcome),
    /// `interrupt` fired first (shutdown past its grace period, lease lost,
    /// claim connection gone): no outcome, no attempt used.
    Interrupted,
}

/// Whether the run was stopped by its deadline (so its query, if any, must
/// be cancelled on the server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimedOut(pub bool);

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into())
}

/// Resolves when `deadline` has passed, following extensions.
async fn expired(deadline: &Deadline) {
    loop {
        let at = deadline.at();
        let extended = deadline.extended.notified();
        tokio::select! {
            _ = tokio::time::sleep_until(at.into()) => {
                if deadline.at() <= Instant::now() {
                    return;
                }
            }
            _ = extended => {}
        }
    }
}

/// Run `handler` on `job` until it returns, its deadline passes, or
/// `interrupt` fires. Returns how it ended and how long it ran.
pub(crate) async fn execute(
    handler: &dyn Handler,
    job: &Job,
    ctx: JobContext<'_>,
    interrupt: &CancellationToken,
    span: tracing::Span,
) -> (Ended, TimedOut, Duration) {
    let started = Instant::now();
    let cancel = ctx.cancel.clone();
    let deadline = ctx.deadline;
    // The run span (`Span::none()` unless the worker traces jobs): the
    // handler's own spans nest under it.
    let run = AssertUnwindSafe(handler.handle(job, ctx).instrument(span)).catch_unwind();
    let (ended, timed_out) = tokio::select! {
        biased;
        _ = interrupt.cancelled() => (Ended::Interrupted, false),
        _ = expired(deadline) => {
            // The timeout as set (and extended), not the time it took to
            // notice: "timed out after 200ms".
            // (Counted from the deadline's own start: from `started`, a
            // moment later under load, 300ms read as 299ms.)
            let ms = (deadline.limit().as_secs_f64() * 1000.0).round() as u64;
            (
                Ended::Outcome(Outcome::retry(format!(
                    "timed out after {}",
                    humantime::format_duration(Duration::from_millis(ms))
                ))),
                true,
            )
        }
        r = run => match r {
            Err(panic) => (Ended::Outcome(Outcome::retry(format!("handler panicked: {}", panic_message(&*panic)))), false),
            Ok(Err(e)) => (Ended::Outcome(Outcome::retry(e.to_string())), false),
            Ok(Ok(outcome)) => (Ended::Outcome(outcome), false),
        },
    };
    cancel.cancel();
    (ended, TimedOut(timed_out), started.elapsed())
}
