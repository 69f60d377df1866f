//! One job's way from claim to outcome, by role (ARCHITECTURE.md, "The
//! claim path"):
//!
//! - [`choose`]: what to take and when: the claim plan, each round's
//!   targets (fair queues, rate limits, limit keys, the claim cursor) and
//!   the wake-ups that start a round;
//! - [`lease`] and [`tx`]: the two delivery modes, each claiming and
//!   running what it claimed;
//! - [`outcome`]: what a finished run means and what it writes;
//! - [`run`]: what running a claimed job needs in either mode (the claimed
//!   rows, one handler run, cancels, progress, traces);
//! - [`claimer`]: the claim tasks, which take slots and call a mode;
//!   [`context`]: the state they all share;
//! - [`claims`]: the one entry point for the worker ([`Claims`]), which
//!   builds the context and starts and stops it all.
//!
//! Imports nothing from `services/` or `admin/`; the worker imports
//! nothing of it but what this file exports.

pub(crate) mod choose;
pub(crate) mod claimer;
pub(crate) mod claims;
pub(crate) mod context;
pub(crate) mod lease;
pub(crate) mod outcome;
pub(crate) mod run;
pub(crate) mod tx;

pub(crate) use claims::{claim_once, describe_modes, uses, Claims, Setup, Shared};
