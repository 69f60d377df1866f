//! Queues and keys: ordered and unique keys, pause, shedding under pressure, limits, rates, fairness, the claims' plans, and vacuum pressure.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod batch_marks;
mod bounds;
mod cursor;
mod fair_keys;
mod key_backlog;
mod key_limits;
mod key_rate;
mod key_walk;
mod limit_keys;
mod many_queues;
mod ordering;
mod payload_bounds;
mod plans;
mod queue_pressure;
mod queues;
mod rate;
mod running_limits;
mod shedding;
mod slot_contention;
mod unique;
mod vacuum;
