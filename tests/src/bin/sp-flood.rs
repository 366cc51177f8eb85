//! `sp-flood`: what anyone who reaches a controller's port can send it without a valid
//! credential, all at once for a while, so a test can show the controller keeps serving its
//! agents: idle TCP connections that never start TLS, `Sync` streams with random tokens and with
//! forged ServiceAccount JWTs (the right subject, audience and expiry, a bad signature: only the
//! API server can tell), and health `Watch` streams held open; or, given one node's valid token,
//! as many streams of that node as it can open. Prints what happened as one JSON line.
//!
//! ```text
//! sp-flood --controller https://198.18.0.2:10660 --ca-file ca.crt \
//!     --account system:serviceaccount:splitproxy:splitproxy-agent --audience splitproxy --seconds 60
//! ```

use anyhow::{Context, Result};
use clap::Parser;
use rand::Rng;
use splitproxy_proto::v1alpha1::{self as pb, node_view_service_client::NodeViewServiceClient};
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};
use tokio::io::AsyncReadExt;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// Floods a controller's node view port.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// The controller's URL.
    #[arg(long)]
    controller: String,
    /// The controller's CA.
    #[arg(long)]
    ca_file: std::path::PathBuf,
    /// The subject forged tokens claim.
    #[arg(long)]
    account: String,
    /// The audience forged tokens claim.
    #[arg(long)]
    audience: String,
    /// How long to flood.
    #[arg(long)]
    seconds: u64,
    /// Idle TCP connections kept open at once.
    #[arg(long, default_value_t = 200)]
    idle: usize,
    /// `Sync` callers at once.
    #[arg(long, default_value_t = 32)]
    callers: usize,
    /// Health `Watch` streams kept open at once.
    #[arg(long, default_value_t = 32)]
    watches: usize,
    /// The tokens the `Sync` callers send.
    #[arg(long, value_enum, default_value_t = Tokens::Both)]
    tokens: Tokens,
    /// A node's valid token: `--streams` callers then subscribe as `--node` with it, each on a
    /// connection of its own, again and again, reading what comes and acknowledging nothing.
    #[arg(long, requires = "node")]
    token_file: Option<std::path::PathBuf>,
    /// The node `--token-file` is for.
    #[arg(long)]
    node: Option<String>,
    /// Callers subscribing with `--token-file`.
    #[arg(long, default_value_t = 0)]
    streams: usize,
}

/// The tokens `Sync` callers send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Tokens {
    /// Random text.
    Random,
    /// Forged JWTs.
    Forged,
    /// Half of the callers each.
    Both,
}

/// Counts, by what happened.
#[derive(Debug, Default)]
struct Tally(Mutex<BTreeMap<String, u64>>);

impl Tally {
    fn add(&self, what: impl Into<String>) {
        if let Ok(mut counts) = self.0.lock() {
            *counts.entry(what.into()).or_default() += 1;
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Arc::new(Cli::parse());
    let ca = std::fs::read(&cli.ca_file).context("reading the CA")?;
    let endpoint = Endpoint::from_shared(cli.controller.clone())?
        .tls_config(ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)))?
        .connect_timeout(Duration::from_secs(5));
    let until = Instant::now() + Duration::from_secs(cli.seconds);
    let tally = Arc::new(Tally::default());
    let address = endpoint
        .uri()
        .authority()
        .context("no address")?
        .to_string();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..cli.idle {
        tasks.spawn(idle(address.clone(), until, Arc::clone(&tally)));
    }
    for caller in 0..cli.callers {
        let forged = match cli.tokens {
            Tokens::Random => false,
            Tokens::Forged => true,
            Tokens::Both => caller % 2 == 0,
        };
        let (cli, endpoint, tally) = (Arc::clone(&cli), endpoint.clone(), Arc::clone(&tally));
        tasks.spawn(async move { sync(&cli, endpoint, forged, until, &tally).await });
    }
    for _ in 0..cli.watches {
        tasks.spawn(watch(endpoint.clone(), until, Arc::clone(&tally)));
    }
    if let (Some(token_file), Some(node)) = (&cli.token_file, &cli.node) {
        let token = std::fs::read_to_string(token_file).context("reading the token")?;
        for _ in 0..cli.streams {
            let (endpoint, tally) = (endpoint.clone(), Arc::clone(&tally));
            let (token, node) = (token.trim().to_owned(), node.clone());
            tasks.spawn(async move { subscribe(endpoint, &token, &node, until, &tally).await });
        }
    }
    while tasks.join_next().await.is_some() {}
    let counts = tally.0.lock().map(|c| c.clone()).unwrap_or_default();
    println!("{}", serde_json::to_string(&counts)?);
    Ok(())
}

/// Opens TCP connections that say nothing, again and again, counting how each ended.
async fn idle(address: String, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        let Ok(Ok(mut stream)) = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(&address),
        )
        .await
        else {
            tally.add("idle: connect failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        tally.add("idle: opened");
        let opened = Instant::now();
        let left = until.saturating_duration_since(opened);
        let mut byte = [0u8; 1];
        let ended = tokio::time::timeout(left, stream.read(&mut byte)).await;
        match ended {
            Err(_) => tally.add(format!("idle: open at the end, held {}", held_for(opened))),
            Ok(_) if opened.elapsed() < Duration::from_secs(1) => {
                tally.add("idle: closed at once");
                // Pressure enough, without taking the test machine's cores from the others.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => tally.add(format!("idle: closed, held {}", held_for(opened))),
        }
    }
}

/// Opens `Sync` streams with random tokens, or with forged JWTs, counting the answers.
async fn sync(cli: &Cli, endpoint: Endpoint, forged: bool, until: Instant, tally: &Tally) {
    let mut channel: Option<Channel> = None;
    while Instant::now() < until {
        let connected = match channel.clone() {
            Some(channel) => channel,
            None => match endpoint.connect().await {
                Ok(fresh) => {
                    tally.add("sync: connected");
                    channel = Some(fresh.clone());
                    fresh
                }
                Err(_) => {
                    tally.add("sync: connect failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let token = if forged {
            forged_token(&cli.account, &cli.audience)
        } else {
            random_text(40)
        };
        let subscribe = pb::SyncRequest {
            kind: Some(pb::sync_request::Kind::Subscribe(pb::Subscribe {
                node_name: "node-1".into(),
                ..Default::default()
            })),
        };
        let mut request = tonic::Request::new(tokio_stream::iter([subscribe]));
        if let Ok(value) = format!("Bearer {token}").parse() {
            request.metadata_mut().insert("authorization", value);
        }
        let kind = if forged { "forged" } else { "random" };
        match NodeViewServiceClient::new(connected).sync(request).await {
            Ok(_) => tally.add(format!("sync {kind}: accepted")),
            Err(status) => {
                tally.add(format!("sync {kind}: {:?}", status.code()));
                if status.code() == tonic::Code::Unknown || status.code() == tonic::Code::Cancelled
                {
                    channel = None;
                }
            }
        }
    }
}

/// Subscribes as `node` with its valid `token`, each time on a new connection, reading what
/// comes until the stream ends, counting how each ended.
async fn subscribe(endpoint: Endpoint, token: &str, node: &str, until: Instant, tally: &Tally) {
    while Instant::now() < until {
        let Ok(channel) = endpoint.connect().await else {
            tally.add("node: connect failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let subscribe = pb::SyncRequest {
            kind: Some(pb::sync_request::Kind::Subscribe(pb::Subscribe {
                node_name: node.to_owned(),
                ..Default::default()
            })),
        };
        // The request half stays open while the stream is read: no ACK ever goes.
        let (requests, outbound) = tokio::sync::mpsc::channel(1);
        let _ = requests.send(subscribe).await;
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outbound));
        if let Ok(value) = format!("Bearer {token}").parse() {
            request.metadata_mut().insert("authorization", value);
        }
        let mut stream = match NodeViewServiceClient::new(channel).sync(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tally.add(format!("node: refused {:?}", status.code()));
                continue;
            }
        };
        tally.add("node: subscribed");
        let left = until.saturating_duration_since(Instant::now());
        let read = tokio::time::timeout(left, async {
            loop {
                match stream.message().await {
                    Ok(Some(_)) => {}
                    Ok(None) => return "closed".to_owned(),
                    Err(status) => return format!("{:?}", status.code()),
                }
            }
        });
        match read.await {
            Ok(how) => tally.add(format!("node: ended {how}")),
            Err(_) => tally.add("node: open at the end"),
        }
        drop(requests);
    }
}

/// Holds health `Watch` streams open, counting how each ended.
async fn watch(endpoint: Endpoint, until: Instant, tally: Arc<Tally>) {
    while Instant::now() < until {
        let Ok(channel) = endpoint.connect().await else {
            tally.add("watch: connect failed");
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let Ok(response) = HealthClient::new(channel).watch(request).await else {
            tally.add("watch: refused");
            continue;
        };
        tally.add("watch: opened");
        let opened = Instant::now();
        let mut stream = response.into_inner();
        let left = until.saturating_duration_since(opened);
        match tokio::time::timeout(left, async {
            while let Ok(Some(_)) = stream.message().await {}
        })
        .await
        {
            Err(_) => tally.add(format!("watch: open at the end, held {}", held_for(opened))),
            Ok(()) => tally.add(format!("watch: ended, held {}", held_for(opened))),
        }
    }
}

/// How long since `opened`, in 5-second buckets: `5-9s`.
fn held_for(opened: Instant) -> String {
    let low = opened.elapsed().as_secs() / 5 * 5;
    format!("{low:02}-{:02}s", low + 4)
}

/// A JWT claiming to be `account`'s for `audience`, valid for an hour, with a random signature.
fn forged_token(account: &str, audience: &str) -> String {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let encode = |text: &str| data_encoding::BASE64URL_NOPAD.encode(text.as_bytes());
    let header = encode(r#"{"alg":"RS256","kid":"forged"}"#);
    let payload = encode(&format!(
        r#"{{"sub":"{account}","aud":["{audience}"],"iat":{now},"exp":{},"jti":"{}"}}"#,
        now + 3600,
        random_text(16)
    ));
    format!("{header}.{payload}.{}", encode(&random_text(64)))
}

fn random_text(length: usize) -> String {
    let mut rng = rand::rng();
    (0..length)
        .map(|_| char::from(rng.random_range(b'a'..=b'z')))
        .collect()
}
