//! The services around the claim path and the schema: recurring jobs, history, the governor (pressure), the per-minute rollup, migrations, roles, clocks, the listener's half-open connections.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod clocks;
mod fleet;
mod halfopen;
mod history;
mod pressure;
mod roles;
mod rollup;
mod schedules;
mod schema;
