//! The operator console (`pgwake ui`): its access rules over plain HTTP
//! (read-only refuses every POST, actions need the credential, the CSRF
//! token and the console's own origin), escaping of every producer value,
//! the library functions it added (bulk actions by filter, run a schedule
//! now), the governor's banner and time line, and an operator's work in a real headless Chromium against a real
//! worker in both delivery modes.

#[path = "../common/mod.rs"]
mod common;

mod access;
mod bounded;
mod browser;
mod charts;
mod fuzz;
mod http;
mod jobs_page;
mod limits;
mod paged;
mod pressure;
mod progress;
mod support;
