//! Log set-up: `tracing` to stderr, text or JSON, level from `RUST_LOG`.

use std::fmt;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing_subscriber::field::{MakeVisitor, VisitFmt, VisitOutput};
use tracing_subscriber::fmt::format::Writer;

/// Install the global subscriber. `default_level` applies when `RUST_LOG`
/// is unset. Colour codes only when stderr is a terminal: a file or a pipe
/// (journald, `kubectl logs`, `2>worker.log`) gets plain text.
///
/// A log line that cannot be written (the reader of a piped stderr has
/// gone) is dropped: tracing's default reports it with `eprintln!`, which
/// panics on that same broken stderr, in whichever thread logged — the
/// signal thread among them, which then never stopped the worker.
///
/// Text lines escape every control character of every field and message
/// ([`EscapedFields`]): a value that came from a producer (a task name, a
/// handler's error quoting a payload) can neither forge a log line with a
/// newline nor drive the operator's terminal with escape codes. JSON lines
/// escape them by JSON's own rules.
///
/// With an OTLP `exporter` (`pgwake run` with an endpoint), the job spans
/// (target `pgwake`, level info, whatever `RUST_LOG` says of the log) also
/// go to it as OpenTelemetry spans.
pub fn init(format: &str, default_level: &str, exporter: Option<&pgwake::otel::Exporter>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let fmt = if format == "json" {
        fmt.json().boxed()
    } else {
        fmt.fmt_fields(EscapedFields)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed()
    };
    // Only pgwake's own spans: the exporter's HTTP and gRPC clients trace
    // too, and exporting their spans would make spans of every export.
    let spans = exporter.map(|e| {
        tracing_opentelemetry::layer()
            .with_tracer(e.tracer())
            .with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("pgwake", tracing::Level::INFO),
            )
    });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(spans)
        .init();
}

/// The text format's fields: `name=value` separated by spaces, strings
/// quoted, the message first and bare, as tracing's default, with control
/// characters (and the
/// Unicode controls that reorder text) written as escapes.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapedFields;

impl<'a> MakeVisitor<Writer<'a>> for EscapedFields {
    type Visitor = EscapedVisitor<'a>;

    fn make_visitor(&self, target: Writer<'a>) -> EscapedVisitor<'a> {
        EscapedVisitor {
            writer: target,
            first: true,
            result: Ok(()),
        }
    }
}

/// Writes one event's or span's fields, escaped.
pub struct EscapedVisitor<'a> {
    writer: Writer<'a>,
    first: bool,
    result: fmt::Result,
}

impl EscapedVisitor<'_> {
    fn write(&mut self, field: &Field, text: &str) {
        if self.result.is_err() {
            return;
        }
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = if name == "message" {
            write!(self.writer, "{sep}{}", Escaped(text))
        } else {
            write!(
                self.writer,
                "{sep}{}={}",
                name.strip_prefix("r#").unwrap_or(name),
                Escaped(text)
            )
        };
    }
}

impl Visit for EscapedVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // Quoted, as tracing's default writes strings.
        self.write(field, &format!("{value:?}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

impl VisitOutput<fmt::Result> for EscapedVisitor<'_> {
    fn finish(self) -> fmt::Result {
        self.result
    }
}

impl VisitFmt for EscapedVisitor<'_> {
    fn writer(&mut self) -> &mut dyn fmt::Write {
        &mut self.writer
    }
}

/// Text with its control characters escaped (`\n`, `\u{1b}`, …).
struct Escaped<'a>(&'a str);

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            // Bidi overrides and isolates reorder what a terminal shows.
            if c.is_control() || pgwake::admin::stats::is_bidi_control(c) {
                for e in c.escape_default() {
                    fmt::Write::write_char(f, e)?;
                }
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::EscapedFields;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// A producer's task name with a newline and terminal escape codes
    /// (issue 33, item 11) is one line with them escaped, in the field and
    /// in the message. Fails with tracing's default fields, which write
    /// the message raw.
    #[test]
    fn control_characters_from_producers_are_escaped_in_text_logs() {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(EscapedFields)
            .with_ansi(false)
            .with_writer(move || out.clone())
            .finish();
        let task = "mail\n2026-01-01T00:00:00Z  INFO forged line \u{1b}[2J\u{202e}";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(job = 7, task, error = "x\ry", "job dead: {task}");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "one line: {text:?}");
        assert!(!text.contains('\u{1b}') && !text.contains('\r'), "{text:?}");
        assert!(!text.contains('\u{202e}'), "{text:?}");
        assert!(text.contains("task=\"mail\\n2026"), "{text:?}");
        assert!(text.contains("job dead: mail\\n2026"), "{text:?}");
        assert!(text.contains("\\u{1b}[2J"), "{text:?}");
        assert!(text.contains("job=7 "), "{text:?}");
    }
}
