//! The repository keeps its shape: the module graph and the docs.
//!
//! One test binary per area (a cold build links 8 binaries, not 43); each
//! file is one scenario module, named after what it defends.

#[path = "../common/mod.rs"]
mod common;

mod deploy;
mod docs;
mod layout;
mod reasons;
