//! Which controller the agent dials after a stream ends, against two scripted controllers over
//! loopback gRPC: each answers every subscribe with a reset revision and, once it is
//! acknowledged, ends the stream as a controller does when the agent's credential expires.

use splitproxy_agent::{
    client::{self, ClientConfig, Controllers},
    metrics::Metrics,
    status::Status,
    sync::Applier,
};
use splitproxy_dataplane::testing::recording::RecordingDataplane;
use splitproxy_proto::v1alpha1::{
    self as pb,
    node_view_service_server::{NodeViewService, NodeViewServiceServer},
    sync_request,
};
use std::{
    net::{Ipv4Addr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{net::TcpListener, sync::mpsc};
use tokio_stream::{Stream, StreamExt as _, wrappers::ReceiverStream};

/// The subscribes the controllers saw, in order: which controller, and the resume point.
type Seen = Arc<Mutex<Vec<(&'static str, Option<pb::ResumePoint>)>>>;

/// A controller that serves one reset per stream and then ends it with `ending`.
struct Scripted {
    name: &'static str,
    seen: Seen,
    ending: fn() -> tonic::Status,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<pb::SyncResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl NodeViewService for Scripted {
    type SyncStream = ResponseStream;

    async fn sync(
        &self,
        request: tonic::Request<tonic::Streaming<pb::SyncRequest>>,
    ) -> Result<tonic::Response<Self::SyncStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let Some(Ok(pb::SyncRequest {
            kind: Some(sync_request::Kind::Subscribe(subscribe)),
        })) = inbound.next().await
        else {
            return Err(tonic::Status::invalid_argument("expected a subscribe"));
        };
        let revision = {
            let mut seen = self.seen.lock().expect("not poisoned");
            seen.push((self.name, subscribe.resume));
            seen.len() as u64
        };
        let (tx, rx) = mpsc::channel(4);
        let (epoch, ending) = (self.name.to_owned(), self.ending);
        tokio::spawn(async move {
            let reset = pb::SyncResponse {
                controller_epoch: epoch,
                revision,
                reset: true,
                complete: true,
                node_status: Some(pb::NodeStatus::default()),
                ..Default::default()
            };
            if tx.send(Ok(reset)).await.is_err() {
                return;
            }
            // Ends the stream once the revision is answered.
            while let Some(Ok(request)) = inbound.next().await {
                if let Some(sync_request::Kind::Ack(ack)) = request.kind
                    && ack.revision == revision
                {
                    let _ = tx.send(Err(ending())).await;
                    return;
                }
            }
        });
        Ok(tonic::Response::new(
            Box::pin(ReceiverStream::new(rx)) as Self::SyncStream
        ))
    }
}

/// Serves `controller` on a loopback port; returns its URL.
async fn serve(controller: Scripted) -> String {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .await
        .expect("binding a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("bound"));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeViewServiceServer::new(controller))
            .serve_with_incoming(incoming),
    );
    url
}

/// Runs an agent knowing controllers `a` then `b` until both have seen `subscribes` subscribes
/// in all; returns them.
async fn subscribes_with_streams_ending_by(
    ending: fn() -> tonic::Status,
    subscribes: usize,
) -> Vec<(&'static str, Option<pb::ResumePoint>)> {
    let seen = Seen::default();
    let a = serve(Scripted {
        name: "a",
        seen: Arc::clone(&seen),
        ending,
    })
    .await;
    let b = serve(Scripted {
        name: "b",
        seen: Arc::clone(&seen),
        ending,
    })
    .await;
    let status = Status::default();
    let metrics = Metrics::new(&mut Default::default());
    let config = ClientConfig {
        controllers: Controllers::Listed(vec![a, b]),
        node_name: "node-1".into(),
        proxy_mode: pb::ProxyMode::Iptables,
        min_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(200),
        credentials: Default::default(),
    };
    let applier = Applier::new(
        "node-1",
        RecordingDataplane::default(),
        status.clone(),
        metrics.clone(),
    );
    let agent = tokio::spawn(client::run(config, applier, status, metrics));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while seen.lock().expect("not poisoned").len() < subscribes {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} after 60 s",
            seen.lock().expect("not poisoned")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    agent.abort();
    let seen = seen.lock().expect("not poisoned");
    seen[..subscribes].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_credential_expired_comes_back_to_the_same_controller_and_resumes() {
    let seen = subscribes_with_streams_ending_by(
        || tonic::Status::unauthenticated("credential expired; reconnect with a fresh one"),
        3,
    )
    .await;
    let resume = |revision| {
        Some(pb::ResumePoint {
            controller_epoch: "a".into(),
            revision,
        })
    };
    assert_eq!(seen, [("a", None), ("a", resume(1)), ("a", resume(2))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_fails_otherwise_moves_the_agent_to_the_next_controller() {
    let seen =
        subscribes_with_streams_ending_by(|| tonic::Status::unavailable("going away"), 2).await;
    let names: Vec<&str> = seen.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, ["a", "b"]);
}
