//! SIGTERM/SIGINT handling on a dedicated OS thread, so that a handler
//! that blocks runtime threads cannot keep the process from noticing a
//! signal or from exiting.
//!
//! ```text
//!  1st signal → stop (no new claims; grace period for running jobs)
//!  2nd signal → abort (skip the grace period; hand running jobs back)
//!  watchdog   → if the process is still alive HARD_DEADLINE + EXIT_MARGIN
//!               after the grace period (or after the 2nd signal), exit(1):
//!               some handler ignored cancellation. The server rolls its
//!               claim back (tx mode) or its lease expires (lease mode).
//! ```

use std::time::{Duration, Instant};

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::worker::HARD_DEADLINE;

/// Slack on top of the hard deadline for the supervisor's own exit path
/// (flushing outcomes, closing pools) before the watchdog steps in.
pub const EXIT_MARGIN: Duration = Duration::from_secs(5);

/// How often the signal thread looks for signals and at the watchdog.
const TICK: Duration = Duration::from_millis(50);

/// Start the signal thread for a worker whose grace period is `grace`.
pub fn spawn(stop: CancellationToken, abort: CancellationToken, grace: Duration) -> Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT]).map_err(|source| Error::Io {
        context: "cannot install signal handlers".into(),
        source,
    })?;
    std::thread::Builder::new()
        .name("pgwake-signals".into())
        .spawn(move || {
            let mut seen = 0;
            let mut deadline: Option<Instant> = None;
            loop {
                for _ in signals.pending() {
                    seen += 1;
                    let now = Instant::now();
                    if seen == 1 {
                        tracing::info!("signal received: finishing running jobs (send again to stop at once)");
                        stop.cancel();
                        deadline = Some(now + grace + HARD_DEADLINE + EXIT_MARGIN);
                    } else if seen == 2 {
                        tracing::warn!("second signal: handing running jobs back now");
                        abort.cancel();
                        let sooner = now + HARD_DEADLINE + EXIT_MARGIN;
                        deadline = Some(deadline.map_or(sooner, |d| d.min(sooner)));
                    }
                }
                if deadline.is_some_and(|d| Instant::now() > d) {
                    eprintln!("pgwake: error: forced exit: a handler ignored cancellation past the hard deadline; its job returns to the queue (tx: rolled back; lease: when the lease expires)");
                    std::process::exit(1);
                }
                std::thread::sleep(TICK);
            }
        })
        .map_err(|source| Error::Io {
            context: "cannot start the signal thread".into(),
            source,
        })?;
    Ok(())
}
