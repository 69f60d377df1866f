//! The command line and producers from outside: every command, its usage errors, clients in other languages, the demo and the bench.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod bench_smoke;
mod cli;
mod cli_usage;
mod clients;
mod demo;
mod doctor;
mod protocol_check;
