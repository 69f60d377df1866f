//! Wake-ups for claim tasks: coalesced and sized.
//!
//! A notification, a poll tick or a full batch wakes **one** idle claim task
//! (`Notify::notify_one` keeps at most one permit, so a burst of wake-ups
//! while every task is busy costs one extra claim, not one per wake-up). A
//! task that claims a full batch wakes one more before it starts running its
//! jobs, so a backlog fans out over the pool one task at a time and a single
//! job never wakes N tasks (no thundering herd). A listener (re)connect wakes
//! every task, because notifications sent while it was away are lost.

use std::sync::atomic::{AtomicU8, Ordering};

use tokio::sync::Notify;

/// Why a claim task woke up; the `trigger` label of `pgwake_claims_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Trigger {
    /// A NOTIFY from the insert trigger.
    Notify = 0,
    /// The fallback poll (or a scheduled job falling due).
    Poll = 1,
    /// Another task claimed a full batch: there is more.
    Drain = 2,
    /// The listener (re)connected; notifications may have been missed.
    Reconnect = 3,
}

impl Trigger {
    /// The label value.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Trigger::Notify => "notify",
            Trigger::Poll => "poll",
            Trigger::Drain => "drain",
            Trigger::Reconnect => "reconnect",
        }
    }

    fn from_u8(v: u8) -> Trigger {
        match v {
            0 => Trigger::Notify,
            1 => Trigger::Poll,
            2 => Trigger::Drain,
            _ => Trigger::Reconnect,
        }
    }
}

/// Shared wake-up signal of a worker's claim tasks.
#[derive(Debug, Default)]
pub(crate) struct Wakeup {
    notify: Notify,
    last: AtomicU8,
}

impl Wakeup {
    /// Wake one idle claim task (or leave one permit if all are busy).
    pub(crate) fn wake_one(&self, trigger: Trigger) {
        self.last.store(trigger as u8, Ordering::Relaxed);
        self.notify.notify_one();
    }

    /// Wake every idle claim task, and leave a permit for a busy one.
    pub(crate) fn wake_all(&self, trigger: Trigger) {
        self.last.store(trigger as u8, Ordering::Relaxed);
        self.notify.notify_waiters();
        self.notify.notify_one();
    }

    /// Wait for a wake-up; returns its trigger.
    pub(crate) async fn wait(&self) -> Trigger {
        self.notify.notified().await;
        Trigger::from_u8(self.last.load(Ordering::Relaxed))
    }
}
