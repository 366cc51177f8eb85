//! `sp-stuck-agent`: subscribes to a controller as a node, then behaves like a stuck agent, so a
//! test can show the controller and the other agents are not held up by it.
//!
//! ```text
//! sp-stuck-agent --controller https://198.18.0.2:10660 --ca-file ca.crt --token-file stuck-1.token \
//!     --node stuck-1 --behaviour never-read
//! ```
//!
//! `never-read` never reads a response; its HTTP/2 windows are the protocol's initial 64 KiB, so
//! the controller runs into flow control as soon as a revision outgrows them (with the client's
//! usual megabytes of window, a modest revision would just sit unread in its buffers). `never-ack`
//! reads every message and prints `revision N complete` for each complete revision, but never
//! acknowledges one. Both print `subscribed` once the controller accepted the stream, and hold it
//! open until killed.

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use splitproxy_agent::credentials::Credentials;
use splitproxy_proto::v1alpha1::{
    self as pb, node_view_service_client::NodeViewServiceClient, sync_request,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// The initial HTTP/2 window (RFC 9113 §6.9.2), the smallest a client can ask for.
const INITIAL_WINDOW: u32 = 65_535;

/// A node agent that subscribes and then gets stuck.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// The controller's URL.
    #[arg(long)]
    controller: String,
    /// The node name to subscribe as.
    #[arg(long)]
    node: String,
    /// How the agent is stuck.
    #[arg(long, value_enum)]
    behaviour: Behaviour,
    /// The file holding the node's token, as the agent's `--token-file`.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// The controller's CA, as the agent's `--controller-ca-file`.
    #[arg(long)]
    ca_file: Option<std::path::PathBuf>,
}

/// How the agent is stuck.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Behaviour {
    /// Never reads the response stream.
    NeverRead,
    /// Reads everything, acknowledges nothing.
    NeverAck,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    let credentials = Credentials {
        token_file: cli.token_file.clone(),
        ca_file: cli.ca_file.clone(),
        server_name: None,
    };
    let endpoint = tonic::transport::Endpoint::from_shared(cli.controller.clone())
        .context("invalid controller URL")?;
    let channel = credentials
        .secure(endpoint)?
        .initial_stream_window_size(INITIAL_WINDOW)
        .initial_connection_window_size(INITIAL_WINDOW)
        .connect()
        .await
        .with_context(|| format!("connecting to {}", cli.controller))?;
    // Kept until the end: dropping it would close the request half and end the stream.
    let (requests, outbound) = mpsc::channel(1);
    let subscribe = pb::SyncRequest {
        kind: Some(sync_request::Kind::Subscribe(pb::Subscribe {
            node_name: cli.node.clone(),
            ..Default::default()
        })),
    };
    requests
        .send(subscribe)
        .await
        .context("queueing the subscribe")?;
    let mut request = tonic::Request::new(ReceiverStream::new(outbound));
    credentials.authorize(&mut request)?;
    let mut responses = NodeViewServiceClient::new(channel)
        .sync(request)
        .await
        .context("subscribing")?
        .into_inner();
    println!("subscribed as {}", cli.node);
    match cli.behaviour {
        Behaviour::NeverRead => std::future::pending::<()>().await,
        Behaviour::NeverAck => {
            while let Some(message) = responses.message().await.context("reading the stream")? {
                if message.complete {
                    println!("revision {} complete", message.revision);
                }
            }
            println!("the controller closed the stream");
        }
    }
    drop(requests);
    Ok(())
}
