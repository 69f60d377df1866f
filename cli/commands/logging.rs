//! Log set-up: `tracing` to stderr, text or JSON, level from `RUST_LOG`.

use std::io::IsTerminal;

/// Install the global subscriber. `default_level` applies when `RUST_LOG`
/// is unset. Colour codes only when stderr is a terminal: a file or a pipe
/// (journald, `kubectl logs`, `2>worker.log`) gets plain text.
///
/// A log line that cannot be written (the reader of a piped stderr has
/// gone) is dropped: tracing's default reports it with `eprintln!`, which
/// panics on that same broken stderr, in whichever thread logged — the
/// signal thread among them, which then never stopped the worker.
pub fn init(format: &str, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    if format == "json" {
        builder.json().init();
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).init();
    }
}
