//! What running a claimed job needs in either delivery mode: the claimed
//! rows as jobs ([`claimed`], read by [`row`]), one handler run ([`executor`]), cancel
//! requests ([`cancels`]), progress reports ([`progress`]) and the jobs'
//! traces ([`trace`]).
//!
//! Imports nothing else of the claim path: every other part builds on it.

pub(crate) mod cancels;
pub(crate) mod claimed;
pub(crate) mod executor;
pub(crate) mod progress;
pub(crate) mod row;
pub(crate) mod trace;
