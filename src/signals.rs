//! SIGTERM/SIGINT/SIGHUP handling on a dedicated OS thread, so that a
//! handler that blocks runtime threads cannot keep the process from
//! noticing a signal or from exiting. SIGHUP (the worker's terminal closed,
//! its ssh session dropped) stops it as gracefully as SIGTERM: left to its
//! default action it killed the worker at once, its running jobs cut short
//! and left to their leases' expiry, its buffered ones charged.
//!
//! ```text
//!  1st signal → stop (no new claims; grace period for running jobs)
//!  2nd signal → abort (skip the grace period; hand running jobs back)
//!  watchdog   → if the process is still alive HARD_DEADLINE + EXIT_MARGIN
//!               after the grace period (or after the 2nd signal), exit(1):
//!               some handler ignored cancellation. The server rolls its
//!               claim back (tx mode) or its lease expires (lease mode).
//! ```

use std::time::Duration;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::worker::HARD_DEADLINE;

/// Slack on top of the hard deadline for the supervisor's own exit path
/// (flushing outcomes, closing pools) before the watchdog steps in.
pub const EXIT_MARGIN: Duration = Duration::from_secs(5);

/// What stops when the signal thread says so: the wording of its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stopping {
    /// A worker: running jobs finish within the grace period, a second
    /// signal hands them back.
    Worker,
    /// The console alone (`pgwake ui`): requests in flight finish, there
    /// are no jobs to hand back.
    Console,
}

impl Stopping {
    /// Logged at the first signal.
    fn first(self) -> &'static str {
        match self {
            Stopping::Worker => {
                "signal received: finishing running jobs (send again to stop at once)"
            }
            Stopping::Console => {
                "signal received: the console stops serving once the requests in flight \
                 finish (send again to stop at once)"
            }
        }
    }

    /// Logged at the second signal.
    fn second(self) -> &'static str {
        match self {
            Stopping::Worker => "second signal: handing running jobs back now",
            Stopping::Console => "second signal: the console stops now",
        }
    }

    /// Written when the watchdog forces the exit.
    fn forced(self) -> &'static [u8] {
        match self {
            Stopping::Worker => b"pgwake: error: forced exit: a handler ignored cancellation past the hard deadline; its job returns to the queue (tx: rolled back; lease: when the lease expires)\n",
            Stopping::Console => b"pgwake: error: forced exit: the console did not stop within its deadline\n",
        }
    }
}

/// Exit the process `after` from now unless it has exited by then.
fn watchdog(after: Duration, what: Stopping) {
    let spawned = std::thread::Builder::new()
        .name("pgwake-watchdog".into())
        .spawn(move || {
            std::thread::sleep(after);
            // Not eprintln!: it panics when stderr is a broken pipe, and the
            // exit below must happen whatever stderr is.
            let _ = std::io::Write::write_all(&mut std::io::stderr(), what.forced());
            std::process::exit(1);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the shutdown watchdog");
    }
}

/// Start the signal thread for a worker whose grace period is `grace`.
pub fn spawn(stop: CancellationToken, abort: CancellationToken, grace: Duration) -> Result<()> {
    spawn_for(Stopping::Worker, stop, abort, grace)
}

/// [`spawn`], saying what stops in `what`'s words.
pub fn spawn_for(
    what: Stopping,
    stop: CancellationToken,
    abort: CancellationToken,
    grace: Duration,
) -> Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|source| Error::Io {
        context: "cannot install signal handlers".into(),
        source,
    })?;
    std::thread::Builder::new()
        .name("pgwake-signals".into())
        .spawn(move || {
            // Blocks until a signal arrives: no polling delay between the
            // signal and the stop.
            for (seen, _) in signals.forever().enumerate() {
                match seen {
                    0 => {
                        tracing::info!("{}", what.first());
                        stop.cancel();
                        watchdog(grace + HARD_DEADLINE + EXIT_MARGIN, what);
                    }
                    1 => {
                        tracing::warn!("{}", what.second());
                        abort.cancel();
                        watchdog(HARD_DEADLINE + EXIT_MARGIN, what);
                    }
                    _ => {}
                }
            }
        })
        .map_err(|source| Error::Io {
            context: "cannot start the signal thread".into(),
            source,
        })?;
    Ok(())
}
