//! What a claim takes, and when: the claim plan (which statements, in
//! which delivery mode: [`plan`]), each round's walk over its targets
//! ([`targets`]) under fair queues ([`fair`]), rate limits ([`rate`],
//! [`key_rate`]), limit keys ([`key_rotation`], [`key_repair`]) and the
//! claim cursor ([`cursor`]), and the wake-ups that start a round
//! ([`wake`], [`idle`], [`next_due`]), claims that overlap ([`overlap`]);
//! the choice's part of the claim
//! context ([`state`]).
//!
//! May import [`run`](super::run) only: never the claim context (what
//! its parts need is passed in, e.g. [`rate::Ledger`]), a delivery mode
//! ([`lease`](super::lease), [`tx`](super::tx)) or the outcome.

pub(crate) mod cursor;
pub(crate) mod fair;
pub(crate) mod idle;
pub(crate) mod key_rate;
pub(crate) mod key_repair;
pub(crate) mod key_rotation;
pub(crate) mod next_due;
pub(crate) mod overlap;
pub(crate) mod plan;
pub(crate) mod rate;
pub(crate) mod state;
pub(crate) mod targets;
pub(crate) mod wake;
