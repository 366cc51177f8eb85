//! A misbehaving controller, for testing the agent against hostile streams: it serves
//! `splitproxy.v1alpha1.NodeViewService` and sends every agent that subscribes one good reset
//! (the Service `demo/rogue-good` on `--cluster-ip`:80 with the endpoint `--endpoint`), then
//! one malformed revision per case of [`CASES`], printing a line per case with what the agent
//! answered: `case NODE CASE applied`, `case NODE CASE rejected: REASON` or
//! `case NODE CASE stream closed`. After a closed stream the agent's next subscription gets the
//! good reset again and the next case. `done NODE` follows the last case; the stream then stays
//! open, silent, and so does any stream after the last case: no reset, so the agent can only
//! serve what it kept.

use clap::Parser;
use splitproxy_proto::v1alpha1::{
    self as pb,
    node_view_service_server::{NodeViewService, NodeViewServiceServer},
    sync_request,
};
use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// The epoch of every revision this controller sends (except the forged one).
const EPOCH: &str = "rogue";
/// How long to wait for an agent's answer to one revision.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
struct Args {
    /// Where to serve.
    #[arg(long)]
    listen: SocketAddr,
    /// The good Service's cluster IP.
    #[arg(long)]
    cluster_ip: IpAddr,
    /// The good Service's endpoint, `ip:port`.
    #[arg(long)]
    endpoint: SocketAddr,
    /// The PEM certificate to serve TLS with (the real controller's, so agents trust it).
    #[arg(long)]
    tls_cert_file: std::path::PathBuf,
    /// Its PEM key.
    #[arg(long)]
    tls_private_key_file: std::path::PathBuf,
}

/// One malformed revision: its name and its messages, given the revision number to use.
type Case = (&'static str, fn(u64) -> Vec<pb::SyncResponse>);

/// The malformed revisions, in the order they are sent.
const CASES: [Case; 14] = [
    ("revision-zero", |_| {
        vec![complete(0, vec![service("zero", "10.96.9.1", 80)])]
    }),
    ("duplicate-keys", |r| {
        vec![complete(
            r,
            vec![
                service("twice", "10.96.9.2", 80),
                service("twice", "10.96.9.3", 80),
            ],
        )]
    }),
    ("service-without-key", |r| {
        let mut keyless = service("keyless", "10.96.9.4", 80);
        keyless.key = None;
        vec![complete(r, vec![keyless])]
    }),
    ("delta-of-another-epoch", |r| {
        let mut part = complete(r, vec![service("forged", "10.96.9.5", 80)]);
        part.controller_epoch = "forged".into();
        vec![part]
    }),
    ("invalid-cluster-ip", |r| {
        vec![complete(r, vec![service("bad-ip", "10.96.9.999", 80)])]
    }),
    ("port-zero", |r| {
        vec![complete(r, vec![service("port-zero", "10.96.9.7", 0)])]
    }),
    ("port-65536", |r| {
        vec![complete(
            r,
            vec![service("port-65536", "10.96.9.8", 65_536)],
        )]
    }),
    ("unknown-protocol", |r| {
        let mut svc = service("unknown-protocol", "10.96.9.9", 80);
        svc.ports[0].protocol = 42;
        vec![complete(r, vec![svc])]
    }),
    ("injected-name", |r| {
        vec![complete(
            r,
            vec![service("evil\"\n-A INPUT -j DROP", "10.96.9.10", 80)],
        )]
    }),
    ("huge-name", |r| {
        vec![complete(
            r,
            vec![service(&"x".repeat(100_000), "10.96.9.11", 80)],
        )]
    }),
    ("duplicate-port-names", |r| {
        let mut svc = service("dup-ports", "10.96.9.12", 80);
        svc.ports.push(svc.ports[0].clone());
        vec![complete(r, vec![svc])]
    }),
    ("invalid-endpoint-address", |r| {
        let mut part = complete(r, vec![service("bad-endpoint", "10.96.9.13", 80)]);
        part.upserted_endpoints = vec![endpoints("bad-endpoint", "10.244.1.300", 8080)];
        vec![part]
    }),
    ("parts-out-of-order", |r| {
        let mut first = complete(r, vec![service("half", "10.96.9.14", 80)]);
        first.complete = false;
        vec![first, complete(r + 1, Vec::new())]
    }),
    ("oversized-message", |r| {
        // Above the 4 MiB a gRPC stream takes by default.
        vec![complete(
            r,
            vec![service(&"y".repeat(5 << 20), "10.96.9.15", 80)],
        )]
    }),
];

fn complete(revision: u64, upserted_services: Vec<pb::Service>) -> pb::SyncResponse {
    pb::SyncResponse {
        controller_epoch: EPOCH.into(),
        revision,
        complete: true,
        upserted_services,
        ..Default::default()
    }
}

fn key(name: &str) -> pb::ObjectKey {
    pb::ObjectKey {
        namespace: "demo".into(),
        name: name.into(),
    }
}

fn service(name: &str, cluster_ip: &str, port: u32) -> pb::Service {
    pb::Service {
        key: Some(key(name)),
        cluster_ips: vec![cluster_ip.into()],
        ports: vec![pb::ServicePort {
            name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            port,
            node_port: 0,
        }],
        ..Default::default()
    }
}

fn endpoints(name: &str, address: &str, port: u32) -> pb::ServiceEndpoints {
    pb::ServiceEndpoints {
        key: Some(key(name)),
        ports: vec![pb::PortEndpoints {
            port_name: "http".into(),
            protocol: pb::Protocol::Tcp as i32,
            endpoints: vec![pb::Endpoint {
                address: address.into(),
                port,
                conditions: Some(pb::EndpointConditions {
                    ready: true,
                    serving: true,
                    terminating: false,
                }),
                ..pb::Endpoint::default()
            }],
        }],
        ..pb::ServiceEndpoints::default()
    }
}

/// Where each node is: the next case and the next revision number.
#[derive(Debug, Default)]
struct Progress {
    next_case: usize,
    revision: u64,
}

#[derive(Clone)]
struct Rogue {
    good: Vec<pb::SyncResponse>,
    progress: Arc<Mutex<BTreeMap<String, Progress>>>,
}

impl Rogue {
    /// The next revision number for `node`.
    fn next_revision(&self, node: &str) -> u64 {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let entry = progress.entry(node.to_owned()).or_default();
        // Gaps leave room for a case that uses the number after its own.
        entry.revision += 2;
        entry.revision
    }

    /// The next case for `node`, counted as sent.
    fn take_case(&self, node: &str) -> Option<Case> {
        let mut progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let entry = progress.entry(node.to_owned()).or_default();
        let case = CASES.get(entry.next_case).copied();
        entry.next_case += 1;
        case
    }

    async fn serve(
        self,
        mut inbound: Streaming<pb::SyncRequest>,
        tx: mpsc::Sender<Result<pb::SyncResponse, Status>>,
    ) {
        let node = match inbound.message().await {
            Ok(Some(pb::SyncRequest {
                kind: Some(sync_request::Kind::Subscribe(subscribe)),
            })) => subscribe.node_name,
            _ => return,
        };
        if !self.has_cases(&node) {
            // A stream after the last case gets nothing at all: the agent must keep serving what
            // it applied before the last stream broke.
            println!("done {node}");
            hold(inbound).await;
            return;
        }
        let mut reset = self.good.clone();
        let revision = self.next_revision(&node);
        for part in &mut reset {
            part.revision = revision;
        }
        if !send(&tx, reset).await || !matches!(answer(&mut inbound).await, Answer::Applied) {
            println!("reset {node} not applied");
            return;
        }
        while let Some((name, messages)) = self.take_case(&node) {
            if !send(&tx, messages(self.next_revision(&node))).await {
                println!("case {node} {name} stream closed");
                return;
            }
            match answer(&mut inbound).await {
                Answer::Applied => println!("case {node} {name} applied"),
                Answer::Rejected(reason) => println!("case {node} {name} rejected: {reason}"),
                Answer::Closed => {
                    println!("case {node} {name} stream closed");
                    return;
                }
            }
        }
        println!("done {node}");
        hold(inbound).await;
    }

    /// Whether `node` has cases left.
    fn has_cases(&self, node: &str) -> bool {
        let progress = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        progress.get(node).is_none_or(|p| p.next_case < CASES.len())
    }
}

/// Stays connected and silent until the agent goes, so it keeps what it applied.
async fn hold(mut inbound: Streaming<pb::SyncRequest>) {
    while let Ok(Some(_)) = inbound.message().await {}
}

enum Answer {
    Applied,
    Rejected(String),
    Closed,
}

/// The agent's answer to the revision just sent; `Closed` when the stream ends or none comes.
async fn answer(inbound: &mut Streaming<pb::SyncRequest>) -> Answer {
    match tokio::time::timeout(ANSWER_TIMEOUT, inbound.message()).await {
        Ok(Ok(Some(pb::SyncRequest {
            kind: Some(sync_request::Kind::Ack(ack)),
        }))) if ack.status == pb::AckStatus::Applied as i32 => Answer::Applied,
        Ok(Ok(Some(pb::SyncRequest {
            kind: Some(sync_request::Kind::Ack(ack)),
        }))) => Answer::Rejected(ack.reason),
        _ => Answer::Closed,
    }
}

/// Sends `messages`; false once the agent has gone.
async fn send(
    tx: &mpsc::Sender<Result<pb::SyncResponse, Status>>,
    messages: Vec<pb::SyncResponse>,
) -> bool {
    for message in messages {
        if tx.send(Ok(message)).await.is_err() {
            return false;
        }
    }
    true
}

#[tonic::async_trait]
impl NodeViewService for Rogue {
    type SyncStream = ReceiverStream<Result<pb::SyncResponse, Status>>;

    async fn sync(
        &self,
        request: Request<Streaming<pb::SyncRequest>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(self.clone().serve(request.into_inner(), tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut good = complete(
        0,
        vec![service("rogue-good", &args.cluster_ip.to_string(), 80)],
    );
    good.reset = true;
    good.upserted_endpoints = vec![endpoints(
        "rogue-good",
        &args.endpoint.ip().to_string(),
        u32::from(args.endpoint.port()),
    )];
    good.node_status = Some(pb::NodeStatus {
        eligible: true,
        reason: String::new(),
        pod_cidrs: Vec::new(),
        service_cidrs: Vec::new(),
        ..pb::NodeStatus::default()
    });
    let rogue = Rogue {
        good: vec![good],
        progress: Arc::default(),
    };
    println!("listening on {}", args.listen);
    let identity = tonic::transport::Identity::from_pem(
        std::fs::read(&args.tls_cert_file)?,
        std::fs::read(&args.tls_private_key_file)?,
    );
    tonic::transport::Server::builder()
        .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))?
        .add_service(NodeViewServiceServer::new(rogue))
        .serve(args.listen)
        .await?;
    Ok(())
}
