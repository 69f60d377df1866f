//! A real OTLP receiver for the tests: the collector's gRPC trace service
//! (the service opentelemetry-proto generates, served by tonic) and
//! OTLP/HTTP with protobuf bodies (`POST /v1/traces`, decoded with prost),
//! each on a free loopback port. It decodes the wire format the worker's
//! exporter sends and keeps every span it received.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;

/// One span as received.
#[derive(Debug, Clone)]
pub struct Span {
    /// Its name (`pgwake.job`, `pgwake.run`, …).
    pub name: String,
    /// Its trace id, hexadecimal.
    pub trace_id: String,
    /// Its span id, hexadecimal.
    pub span_id: String,
    /// Its parent's span id, hexadecimal; empty for a root span.
    pub parent_span_id: String,
    /// Its attributes, as text.
    pub attributes: HashMap<String, String>,
    /// Its resource's `service.name`.
    pub service: String,
    /// `grpc` or `http`: how it came.
    pub via: &'static str,
}

impl Span {
    /// Attribute `key`, or "".
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map(String::as_str).unwrap_or("")
    }
}

/// The receiver: both endpoints, and what they received.
pub struct Receiver {
    /// The gRPC endpoint's address.
    pub grpc: SocketAddr,
    /// The HTTP endpoint's address.
    pub http: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
}

#[derive(Clone)]
struct Store(Arc<Mutex<Vec<Span>>>);

impl Store {
    fn keep(&self, request: ExportTraceServiceRequest, via: &'static str) {
        let mut spans = self.0.lock().unwrap();
        for rs in request.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| {
                    r.attributes
                        .iter()
                        .find(|kv| kv.key == "service.name")
                        .map(|kv| text(kv.value.as_ref().and_then(|v| v.value.as_ref())))
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push(Span {
                        name: s.name,
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: hex(&s.parent_span_id),
                        attributes: s
                            .attributes
                            .iter()
                            .map(|kv| {
                                (
                                    kv.key.clone(),
                                    text(kv.value.as_ref().and_then(|v| v.value.as_ref())),
                                )
                            })
                            .collect(),
                        service: service.clone(),
                        via,
                    });
                }
            }
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(v: Option<&Value>) -> String {
    match v {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.keep(request.into_inner(), "grpc");
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Receiver {
    /// Start both endpoints on free loopback ports.
    pub async fn start() -> Receiver {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let store = Store(spans.clone());

        let grpc_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let grpc = grpc_listener.local_addr().unwrap();
        let service = TraceServiceServer::new(store.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener))
                .await
                .unwrap();
        });

        let http_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = http_listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let store = store.clone();
                    async move {
                        let kind = headers
                            .get(axum::http::header::CONTENT_TYPE)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("");
                        if kind != "application/x-protobuf" {
                            return (
                                axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE,
                                [(axum::http::header::CONTENT_TYPE, "text/plain")],
                                format!("content-type {kind:?}").into_bytes(),
                            );
                        }
                        match ExportTraceServiceRequest::decode(body) {
                            Ok(request) => {
                                store.keep(request, "http");
                                (
                                    axum::http::StatusCode::OK,
                                    [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                                    ExportTraceServiceResponse {
                                        partial_success: None,
                                    }
                                    .encode_to_vec(),
                                )
                            }
                            Err(e) => (
                                axum::http::StatusCode::BAD_REQUEST,
                                [(axum::http::header::CONTENT_TYPE, "text/plain")],
                                e.to_string().into_bytes(),
                            ),
                        }
                    }
                },
            ),
        );
        tokio::spawn(async move {
            axum::serve(http_listener, app).await.unwrap();
        });
        Receiver { grpc, http, spans }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap().clone()
    }
}
