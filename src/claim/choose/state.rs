//! What the claim context holds for choosing what to claim.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use crate::claim::choose::cursor::ClaimCursors;
use crate::claim::choose::fair::ReadyQueues;
use crate::claim::choose::idle::WaitState;
use crate::claim::choose::key_repair::KeyRepairs;
use crate::claim::choose::key_rotation::KeyCursors;
use crate::claim::choose::overlap::Overlap;
use crate::claim::choose::plan::ClaimSpec;

/// The choice's part of the claim context: the plan and where each of its
/// rotations and cursors stands.
pub(crate) struct ChoiceState {
    /// What to claim, in which mode.
    pub plan: Vec<ClaimSpec>,
    /// Rotates the order in which specs and queues are tried.
    pub cursor: AtomicUsize,
    /// The queues with ready jobs, for fair all-queues claims (`fair.rs`).
    pub ready_queues: ReadyQueues,
    /// Where each fair-keys queue's rotation between limit keys stands
    /// for this worker (`key_rotation.rs`).
    pub key_cursors: KeyCursors,
    /// Where the all-queues claims resume under pressure (`cursor.rs`).
    pub claim_cursors: ClaimCursors,
    /// Repairs of limit keys' slot rows that claims reported
    /// (`key_repair.rs`).
    pub key_repairs: KeyRepairs,
    /// Idle/draining state for the waiting registration.
    pub wait_state: Arc<WaitState>,
    /// The claims in flight, so that none loses a wake-up to another that
    /// locked a slot it skipped (`overlap.rs`).
    pub overlap: Overlap,
}
