//! Jobs' spans as OpenTelemetry spans, exported over OTLP (feature `otel`;
//! docs/src/tracing.md).
//!
//! The `pgwake` binary calls [`install`] when an OTLP endpoint is set
//! (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
//! `--otlp-endpoint`) and adds a `tracing-opentelemetry` layer over [`Exporter::tracer`] to its subscriber. An
//! embedder may do the same, or install its own `tracing-opentelemetry`
//! layer: with [`WorkerConfig::trace_jobs`](crate::WorkerConfig::trace_jobs)
//! on, the worker's job spans are parented on their producers' contexts
//! through whichever layer is installed.
//!
//! Spans leave through a bounded queue ([`EXPORT_QUEUE_MAX`] spans) to one
//! export task: a collector that is slow or away costs the worker a failed
//! `try_send` per span, counted in `pgwake_trace_spans_dropped_total`, and
//! never a wait.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter as _, SpanProcessor};
use tokio::sync::{mpsc, oneshot};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::error::{Error, Result};
use crate::metrics;
use crate::trace::TraceContext;

/// Most spans waiting for export; more are dropped and counted.
pub const EXPORT_QUEUE_MAX: usize = 4096;
/// Most spans in one export request.
pub const EXPORT_BATCH_MAX: usize = 512;
/// How long spans wait for more before an export request is sent.
pub const EXPORT_DELAY: Duration = Duration::from_secs(1);
/// How long one export request may take before its spans are dropped
/// (`OTEL_EXPORTER_OTLP_TIMEOUT` or `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, in
/// milliseconds, overrides it).
pub const EXPORT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// OTLP's two protocols that collectors take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP with protobuf bodies (port 4318, path `/v1/traces`).
    HttpProtobuf,
}

impl Protocol {
    /// `grpc` or `http/protobuf`, as `OTEL_EXPORTER_OTLP_PROTOCOL` writes
    /// them; anything else (`http/json` among them) is refused with the
    /// values this build takes.
    pub fn parse(value: &str) -> Result<Protocol> {
        match value.trim() {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" => Ok(Protocol::HttpProtobuf),
            other => Err(Error::Config(format!(
                "OTLP protocol {other:?} is not supported: use grpc or http/protobuf (OTEL_EXPORTER_OTLP_PROTOCOL, --otlp-protocol)"
            ))),
        }
    }
}

/// Where and how spans go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The collector's base address (`http://collector:4318`): for
    /// http/protobuf, `/v1/traces` is added, as for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`. `None`: the exporter reads the
    /// standard variables itself.
    pub endpoint: Option<String>,
    /// The protocol.
    pub protocol: Protocol,
}

impl Settings {
    /// The settings the standard variables give, or `None` when they turn
    /// export off: no endpoint set, `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`. The protocol is
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`, else http/protobuf (the
    /// specification's default).
    pub fn from_env() -> Result<Option<Settings>> {
        if env_var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            || env_var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none")
        {
            return Ok(None);
        }
        if env_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && env_var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        Ok(Some(Settings {
            endpoint: None,
            protocol: Self::env_protocol()?,
        }))
    }

    /// The protocol the standard variables name (http/protobuf if none).
    pub fn env_protocol() -> Result<Protocol> {
        match env_var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| env_var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        {
            Some(p) => Protocol::parse(&p),
            None => Ok(Protocol::HttpProtobuf),
        }
    }
}

/// An environment variable's value, unless unset or blank.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The installed exporter: its tracer (for the `tracing` layer) and the
/// export task. Keep it until the end, then [`Exporter::shutdown`].
pub struct Exporter {
    provider: SdkTracerProvider,
    flush: mpsc::Sender<oneshot::Sender<()>>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

/// Build the OTLP exporter and the tracer provider, make them the global
/// ones (with the W3C propagator), and start the export task. Must run
/// inside a Tokio runtime.
pub fn install(settings: &Settings) -> Result<Exporter> {
    let timeout = export_timeout();
    let exporter = match settings.protocol {
        Protocol::Grpc => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(timeout);
            if let Some(e) = &settings.endpoint {
                b = b.with_endpoint(e.clone());
            }
            b.build()
        }
        Protocol::HttpProtobuf => {
            let mut b = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_timeout(timeout)
                .with_headers(HashMap::new());
            if let Some(e) = &settings.endpoint {
                b = b.with_endpoint(format!("{}/v1/traces", e.trim_end_matches('/')));
            }
            b.build()
        }
    }
    .map_err(|e| Error::Config(format!("cannot set up the OTLP exporter: {e}")))?;

    let mut resource = opentelemetry_sdk::Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    if !named {
        resource = resource.with_service_name("pgwake");
    }
    let resource = resource.build();
    // The exporter sends the resource with every request (the processor
    // would hand it over; this one keeps the exporter in its task).
    let mut exporter = exporter;
    exporter.set_resource(&resource);
    let (spans_tx, spans_rx) = mpsc::channel(EXPORT_QUEUE_MAX);
    let (flush_tx, flush_rx) = mpsc::channel(4);
    tokio::spawn(export_task(exporter, spans_rx, flush_rx, timeout));
    let processor = QueueProcessor {
        spans: spans_tx,
        flush: flush_tx.clone(),
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok(Exporter {
        provider,
        flush: flush_tx,
    })
}

impl Exporter {
    /// The tracer for `tracing_opentelemetry::layer().with_tracer(…)`.
    pub fn tracer(&self) -> opentelemetry_sdk::trace::SdkTracer {
        self.provider.tracer("pgwake")
    }

    /// Export what is queued (at most one export timeout).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.flush.send(done).await.is_ok() {
            let _ = tokio::time::timeout(export_timeout(), wait).await;
        }
    }

    /// Export what is queued, then stop.
    pub async fn shutdown(self) {
        self.flush().await;
    }
}

fn export_timeout() -> Duration {
    [
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse::<u64>().ok())
    .map(Duration::from_millis)
    .unwrap_or(EXPORT_TIMEOUT_DEFAULT)
}

/// The span processor: ended spans into the bounded queue, never waiting.
#[derive(Debug)]
struct QueueProcessor {
    spans: mpsc::Sender<SpanData>,
    flush: mpsc::Sender<oneshot::Sender<()>>,
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        if self.spans.try_send(span).is_err() {
            ::metrics::counter!(metrics::TRACE_SPANS_DROPPED, "reason" => "queue_full")
                .increment(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        // Asks the export task to send what it holds; never waits (this is
        // called from async code).
        let (done, _) = oneshot::channel();
        let _ = self.flush.try_send(done);
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        self.force_flush()
    }
}

async fn export_task(
    exporter: opentelemetry_otlp::SpanExporter,
    mut spans: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    timeout: Duration,
) {
    let mut warned: Option<std::time::Instant> = None;
    let mut batch: Vec<SpanData> = Vec::with_capacity(EXPORT_BATCH_MAX);
    loop {
        let mut closed = false;
        let mut flushed = None;
        tokio::select! {
            s = spans.recv() => match s {
                Some(s) => batch.push(s),
                None => closed = true,
            },
            f = flushes.recv() => match f {
                Some(f) => flushed = Some(f),
                None => closed = true,
            },
        }
        // Gather for EXPORT_DELAY after the first span, up to a batch,
        // unless a flush asks for it now.
        let until = tokio::time::Instant::now() + EXPORT_DELAY;
        while !closed && flushed.is_none() && batch.len() < EXPORT_BATCH_MAX {
            tokio::select! {
                s = spans.recv() => match s {
                    Some(s) => batch.push(s),
                    None => closed = true,
                },
                f = flushes.recv() => match f {
                    Some(f) => flushed = Some(f),
                    None => closed = true,
                },
                _ = tokio::time::sleep_until(until) => break,
            }
        }
        loop {
            while batch.len() < EXPORT_BATCH_MAX {
                match spans.try_recv() {
                    Ok(s) => batch.push(s),
                    Err(_) => break,
                }
            }
            if batch.is_empty() {
                break;
            }
            let sent = std::mem::replace(&mut batch, Vec::with_capacity(EXPORT_BATCH_MAX));
            export(&exporter, sent, timeout, &mut warned).await;
            // A flush or the end sends everything queued; otherwise one
            // batch, and back to gathering.
            if flushed.is_none() && !closed {
                break;
            }
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
        if closed {
            return;
        }
    }
}

async fn export(
    exporter: &opentelemetry_otlp::SpanExporter,
    spans: Vec<SpanData>,
    timeout: Duration,
    warned: &mut Option<std::time::Instant>,
) {
    let n = spans.len() as u64;
    let why = match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => {
            ::metrics::counter!(metrics::TRACE_SPANS_EXPORTED).increment(n);
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer in {timeout:?}"),
    };
    ::metrics::counter!(metrics::TRACE_SPANS_DROPPED, "reason" => "export_failed").increment(n);
    // Once a minute at most: a collector that is away must not fill the
    // log.
    if warned.is_none_or(|w| w.elapsed() >= Duration::from_secs(60)) {
        *warned = Some(std::time::Instant::now());
        tracing::warn!(target: "pgwake::otel", spans = n, error = %why,
            "could not export spans to the OTLP collector: dropped (pgwake_trace_spans_dropped_total counts them)");
    }
}

/// Parent `span` on the producer's context.
pub(crate) fn set_parent(span: &tracing::Span, producer: &TraceContext) {
    let mut carrier = HashMap::with_capacity(2);
    carrier.insert("traceparent".to_string(), producer.traceparent.clone());
    if let Some(s) = &producer.tracestate {
        carrier.insert("tracestate".to_string(), s.clone());
    }
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The W3C context of `span` as an OpenTelemetry span, if an OpenTelemetry
/// layer made it one (its `tracestate` inherited from its parent's).
pub(crate) fn context_of(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return None;
    }
    Some(TraceContext {
        traceparent: format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ),
        tracestate: Some(sc.trace_state().header()).filter(|s| !s.is_empty()),
    })
}

/// A `pgwake.claim` span under the job span, from `started` to now: the
/// claim statement that took the job (a span of the global tracer, whose
/// times are set, which a `tracing` span's are not).
pub(crate) fn claim_span(job: &tracing::Span, started: SystemTime) {
    let cx = job.context();
    if !cx.span().span_context().is_sampled() {
        return;
    }
    let tracer = opentelemetry::global::tracer("pgwake");
    let mut span = tracer
        .span_builder("pgwake.claim")
        .with_start_time(started)
        .start_with_context(&tracer, &cx);
    opentelemetry::trace::Span::end_with_timestamp(&mut span, SystemTime::now());
}
