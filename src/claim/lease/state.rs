//! What the claim context holds for lease mode alone.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::claim::lease::book::{CompleterHandle, LeaseBook};
use crate::claim::lease::prefetch::Prefetch;
use crate::claim::lease::starts::StartMarks;
use crate::claim::lease::turn::LeaseTurn;

/// Lease mode's part of the claim context.
pub(crate) struct LeaseState {
    /// Running lease-mode jobs (their tokens, for the heartbeat).
    pub book: Arc<LeaseBook>,
    /// Where lease-mode runs send their resolutions.
    pub completer: CompleterHandle,
    /// Lease-mode jobs claimed ahead of the free slots (`prefetch.rs`).
    pub prefetch: Prefetch,
    /// Where a buffered job's start is reported (`starts.rs`).
    pub start_marks: StartMarks,
    /// Lease-mode job tasks, joined at shutdown.
    pub jobs: TaskTracker,
    /// At most `concurrency / batch` lease claims in flight (`claimer.rs`).
    pub turn: LeaseTurn,
}
