//! Jobs from claim to outcome in both delivery modes: delivery and wake-ups, batches and outcomes, leases and fencing, timeouts, payloads, handlers, cancellation, crashes and shutdown.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod batches;
mod batches_flow;
mod cancel;
mod cancellation;
mod crash;
mod delivery;
mod exec_protocol;
mod exec_steps;
mod explain;
mod fencing;
mod flow_results;
mod flows;
mod flows_outage;
mod flows_scale;
mod handlers;
mod hostile;
mod lease;
mod outcomes;
mod payloads;
mod prefetch;
mod process_trees;
mod progress;
mod put_back;
mod shutdown;
mod signals;
mod snooze;
mod steps;
mod suite;
mod timeouts;
mod trace_context;
mod trigger;
mod waits;
mod waits_compose;
