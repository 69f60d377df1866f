//! Persistent handlers: long-lived processes in other languages (real
//! `python3` and `node`) fed jobs over the line protocol — ordinary jobs,
//! results and failures, SQL in the claim transaction, crashes and the
//! innocent jobs beside them, cancel and timeouts, recycling, and
//! processes that break the protocol.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod cancel;
mod crashes;
mod jobs;
mod observability;
mod steps;
mod support;
