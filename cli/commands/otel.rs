//! `pgwake run`'s span export (docs/src/tracing.md): the OTLP settings from
//! `--otlp-endpoint`, `--otlp-protocol` and the standard `OTEL_*`
//! variables, and the exporter they start.

use pgwake::otel::{Exporter, Protocol, Settings};
use pgwake::Error;

use super::args::Command;

/// Longest `--otlp-endpoint`.
const ENDPOINT_MAX: usize = 2048;

/// The exporter `command` asks for, started (inside the runtime), with job
/// tracing turned on; `None` for every other command and for a `run`
/// without an endpoint.
pub fn exporter(command: &mut Command) -> Result<Option<Exporter>, Error> {
    let Command::Run(args) = command else {
        return Ok(None);
    };
    let protocol = args
        .otlp_protocol
        .as_deref()
        .map(|p| {
            Protocol::parse(p).map_err(|_| {
                Error::Config(format!("--otlp-protocol {p:?}: give grpc or http/protobuf"))
            })
        })
        .transpose()?;
    let settings = match &args.otlp_endpoint {
        Some(endpoint) => {
            check_endpoint(endpoint)?;
            Some(Settings {
                endpoint: Some(endpoint.clone()),
                protocol: match protocol {
                    Some(p) => p,
                    None => Settings::env_protocol()?,
                },
            })
        }
        None => Settings::from_env()?.map(|s| Settings {
            protocol: protocol.unwrap_or(s.protocol),
            ..s
        }),
    };
    let Some(settings) = settings else {
        if args.otlp_protocol.is_some() {
            return Err(Error::Config(
                "--otlp-protocol without a collector: give --otlp-endpoint URL (or set OTEL_EXPORTER_OTLP_ENDPOINT)".into(),
            ));
        }
        return Ok(None);
    };
    let exporter = pgwake::otel::install(&settings)?;
    args.trace_jobs = true;
    Ok(Some(exporter))
}

fn check_endpoint(endpoint: &str) -> Result<(), Error> {
    let ok = endpoint.len() <= ENDPOINT_MAX
        && (endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        && !endpoint
            .chars()
            .any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(Error::Config(format!(
            "--otlp-endpoint: give the collector's base address as an http:// or https:// URL of at most {ENDPOINT_MAX} bytes, e.g. --otlp-endpoint http://localhost:4318"
        )))
    }
}
