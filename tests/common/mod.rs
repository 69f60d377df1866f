//! Test support, one module per concern; `use common::*;` brings in all of
//! it.
//!
//! - [`db`]: the test server (a throwaway cluster, or `DATABASE_URL`), a
//!   fresh database per test, rows in and out;
//! - [`wait`]: waiting for a condition with a timeout, never for a fixed time;
//! - [`worker`]: an in-process worker and its events;
//! - [`ledger`]: the in-process run ledger and recording handlers;
//! - [`notify`]: LISTEN from outside the worker;
//! - [`process`]: the `pgwake` binary as a child process;
//! - [`chaos`]: the `chaos_worker` example as a child process, and its
//!   database run ledger;
//! - [`embedded`]: the throwaway clusters, shared with the binary.
#![allow(dead_code)]

pub mod chaos;
pub mod db;
/// The throwaway clusters of the `pgwake` binary (`cli/embedded.rs`), shared
/// by path: they are a tool of the command line and the tests, not library API.
#[path = "../../cli/embedded.rs"]
pub mod embedded;
pub mod ledger;
pub mod notify;
pub mod pgbouncer;
pub mod process;
pub mod wait;
pub mod worker;

#[allow(unused_imports)]
pub use chaos::*;
#[allow(unused_imports)]
pub use db::*;
#[allow(unused_imports)]
pub use ledger::*;
#[allow(unused_imports)]
pub use notify::*;
#[allow(unused_imports)]
pub use process::*;
#[allow(unused_imports)]
pub use wait::*;
#[allow(unused_imports)]
pub use worker::*;
