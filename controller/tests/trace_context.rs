//! The W3C trace context of a change reaches the agent on its revision. Alone in its test binary
//! because it installs a global OpenTelemetry subscriber: with per-thread subscribers, other
//! tests running in parallel left the stream's span callsites uninterested now and then.

use opentelemetry::trace::TracerProvider as _;
use splitproxy_controller::{cause::Cause, cluster::ClusterState, fanout::FanOut};
use splitproxy_proto::v1alpha1::{
    self as pb, node_view_service_client::NodeViewServiceClient, sync_request,
};
use std::{sync::Arc, time::Duration};
use tokio::sync::{mpsc, watch};
use tracing_subscriber::layer::SubscriberExt as _;

/// The trace id of a `traceparent` header value.
fn trace_id(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).unwrap_or_default()
}

fn caused_by(span: &tracing::Span) -> Option<Arc<ClusterState>> {
    Some(Arc::new(ClusterState {
        cause: Cause::of(span),
        ..ClusterState::default()
    }))
}

#[tokio::test]
async fn a_revision_continues_the_trace_of_the_change_that_caused_it() {
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test"))),
    )
    .expect("the only subscriber in this binary");

    let change = tracing::info_span!("manifests change");
    let (_publish, cluster) = watch::channel(caused_by(&change));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(FanOut::new(cluster).into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );

    let (tx, rx) = mpsc::channel(4);
    tx.send(pb::SyncRequest {
        kind: Some(sync_request::Kind::Subscribe(pb::Subscribe {
            node_name: "node-1".into(),
            capabilities: None,
            ..Default::default()
        })),
    })
    .await
    .expect("queue subscribe");
    let mut inbound = NodeViewServiceClient::connect(url)
        .await
        .expect("connect")
        .sync(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(30), inbound.message())
        .await
        .expect("a message within 30 s")
        .expect("stream open")
        .expect("a message");

    let sent = first
        .trace_context
        .expect("a traced change's revision carries its context");
    let change = Cause::of(&change).0.expect("the change is traced");
    assert_eq!(trace_id(&sent.traceparent), trace_id(&change.traceparent));
    assert_ne!(
        sent.traceparent, change.traceparent,
        "the revision is a span of its own under the change"
    );
}
