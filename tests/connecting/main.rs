//! Connecting and surviving the database: outages, failover, connection strings, TLS, PgBouncer, and the chaos soak.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod connecting;
mod failover;
mod outage;
mod pgbouncer;
mod soak;
mod tls;
