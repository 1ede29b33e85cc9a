//! Shared by the OTel tests (`otel_export`, `serve_otel`): a real OTLP/gRPC receiver on loopback, built on
//! opentelemetry-proto's generated tonic service, and what a test reads from it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;

/// Every export request a receiver got, in arrival order.
pub type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

/// The receiver's service: keeps every request.
#[derive(Clone, Default)]
pub struct GrpcReceiver {
    /// What arrived.
    pub got: Received,
}

#[tonic::async_trait]
impl TraceService for GrpcReceiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.got.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// Serves OTLP/gRPC on 127.0.0.1 on a runtime of its own; returns the address and what arrives.
pub fn start_grpc_receiver() -> (SocketAddr, Received, tokio::runtime::Runtime) {
    start_grpc_receiver_with(None)
}

/// [`start_grpc_receiver`], behind TLS when `tls` is given.
pub fn start_grpc_receiver_with(
    tls: Option<tonic::transport::ServerTlsConfig>,
) -> (SocketAddr, Received, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let got = Received::default();
    let svc = GrpcReceiver { got: got.clone() };
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        server = server.tls_config(tls).unwrap();
    }
    rt.spawn(async move {
        server
            // Collectors send gzip by default (rotel does): accept it like a real receiver.
            .add_service(
                TraceServiceServer::new(svc).accept_compressed(tonic::codec::CompressionEncoding::Gzip),
            )
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    (addr, got, rt)
}

/// Every span the receiver got.
pub fn received_spans(got: &Received) -> Vec<Span> {
    got.lock()
        .unwrap()
        .iter()
        .flat_map(|r| r.resource_spans.clone())
        .flat_map(|rs| rs.scope_spans)
        .flat_map(|ss| ss.spans)
        .collect()
}

/// Lower-case hex, as in a W3C `traceparent`.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
