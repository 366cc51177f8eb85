//! `sp-testpod`: a tiny HTTP (or UDP) server that answers with its name, and a client that counts
//! who answered.
//!
//! ```text
//! sp-testpod serve --name pod-a --listen 0.0.0.0:8080
//! sp-testpod hit --url http://10.96.0.10:80/ --count 20 [--timeout-ms 2000]
//! sp-testpod serve --udp --name pod-a --listen 0.0.0.0:5353
//! sp-testpod hit --udp --url udp://10.96.0.30:53 --count 20 [--source-port 40000]
//! sp-testpod serve --name pod-a --listen [::]:8080          # both IP families
//! sp-testpod hit --url http://[fd00:10:96::10]:80/ --count 20
//! sp-testpod sctp-serve --name pod-a --port 9999
//! sp-testpod sctp-hit --address 10.96.0.40:7777 --count 20
//! sp-testpod load --target web=http://10.96.0.10/ --rate 5 --duration-s 600 --out out.jsonl
//! ```
//!
//! `hit` makes each request on a new TCP connection (so a proxy balances every one) and prints one
//! JSON line: `{"answers":{"pod-a":12,"pod-b":8},"failures":0,"errors":[]}`. It exits 0 even when
//! requests fail; the test decides what that means. Only IP addresses are accepted, never names.
//!
//! With `--udp`, the server answers every datagram with its name, and `hit` sends one datagram per
//! request and waits for the answer: from a fresh ephemeral port each time (a new conntrack flow
//! each, so a proxy balances every one), or all from `--source-port` (one flow, which sticks to
//! one endpoint for as long as conntrack remembers it).
//!
//! The HTTP server answers the path `/source` with its name and the client address it saw
//! (`pod-a 10.244.2.10`), so tests can tell whether a proxy masqueraded the client; the UDP
//! server does the same for `hit --udp --url udp://IP:PORT/source`. `hit --source IP` sends from
//! that local address.
//!
//! `sctp-serve` and `sctp-hit` do the same over SCTP with raw IP sockets (the test kernel has no
//! SCTP sockets): an INIT per request from a fresh port, answered by an INIT-ACK whose state cookie
//! is the server's name (and the client address seen, with `--with-client`); an ICMP port
//! unreachable about an INIT fails it as refused. See the `sctp` module.
//!
//! `load` sends `--rate` requests per second to each `--target NAME=URL` at once, each on a new
//! connection, for `--duration-s`, and appends one JSON line per request (start time, target, ok,
//! the answering pod or the error) to `--out`; see the `load` module.

use std::io::{Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use clap::{Parser, Subcommand};
use splitproxy_e2e::HitReport;

// A bin crate root resolves modules next to itself; this one lives in a folder named after the bin.
#[path = "sp-testpod/load.rs"]
mod load;
#[path = "sp-testpod/sctp.rs"]
mod sctp;

/// How many distinct errors a report keeps.
const MAX_ERRORS: usize = 5;

/// The largest request or response head read, in bytes.
const MAX_MESSAGE: u64 = 64 * 1024;

/// A test server and client for end-to-end tests.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// What to do.
#[derive(Subcommand, Debug)]
enum Cmd {
    /// Answer every HTTP request with 200 and NAME as the body (with `--udp`: every datagram
    /// with NAME).
    Serve {
        /// The name to answer with (the pod's name).
        #[arg(long, env = "SP_TESTPOD_NAME")]
        name: String,
        /// The address to listen on.
        #[arg(long, env = "SP_TESTPOD_LISTEN")]
        listen: SocketAddr,
        /// Serve UDP instead of HTTP.
        #[arg(long, env = "SP_TESTPOD_UDP")]
        udp: bool,
    },
    /// Make COUNT requests to URL, each on a new connection, and print who answered as JSON.
    Hit {
        /// `http://IP:PORT/path`, or `udp://IP:PORT` with `--udp`.
        #[arg(long, env = "SP_TESTPOD_URL")]
        url: String,
        /// How many requests to make.
        #[arg(long, env = "SP_TESTPOD_COUNT", default_value_t = 1)]
        count: u32,
        /// How long one request may take, connect to last byte, in milliseconds.
        #[arg(long, env = "SP_TESTPOD_TIMEOUT_MS", default_value_t = 2000)]
        timeout_ms: u64,
        /// Pause between requests, in milliseconds, for steady load over a while.
        #[arg(long, env = "SP_TESTPOD_INTERVAL_MS", default_value_t = 0)]
        interval_ms: u64,
        /// Send datagrams instead of HTTP requests.
        #[arg(long, env = "SP_TESTPOD_UDP")]
        udp: bool,
        /// With `--udp`: send every request from this port, on one socket (default: a fresh
        /// ephemeral port per request).
        #[arg(long, env = "SP_TESTPOD_SOURCE_PORT", requires = "udp")]
        source_port: Option<u16>,
        /// Send from this local address (default: the one the kernel picks for the route).
        #[arg(long, env = "SP_TESTPOD_SOURCE")]
        source: Option<IpAddr>,
    },
    /// Answer every SCTP INIT to PORT with an INIT-ACK whose state cookie is NAME.
    SctpServe {
        /// The name to answer with (the pod's name).
        #[arg(long, env = "SP_TESTPOD_NAME")]
        name: String,
        /// The SCTP port to answer on.
        #[arg(long, env = "SP_TESTPOD_PORT")]
        port: u16,
        /// Answer with NAME and the client address seen (`pod-a 10.244.2.10`).
        #[arg(long)]
        with_client: bool,
    },
    /// Send COUNT SCTP INITs to ADDRESS, each from a fresh port, and print who answered as JSON.
    SctpHit {
        /// `IP:PORT`.
        #[arg(long, env = "SP_TESTPOD_ADDRESS")]
        address: SocketAddrV4,
        /// How many INITs to send.
        #[arg(long, env = "SP_TESTPOD_COUNT", default_value_t = 1)]
        count: u32,
        /// How long to wait for each INIT-ACK, in milliseconds.
        #[arg(long, env = "SP_TESTPOD_TIMEOUT_MS", default_value_t = 2000)]
        timeout_ms: u64,
    },
    /// Send RATE requests per second to every TARGET at once for DURATION, writing one JSON line
    /// per request to OUT.
    Load {
        /// `NAME=http://IP:PORT/path`; repeat for several.
        #[arg(long = "target", required = true, value_parser = load::parse_target)]
        targets: Vec<load::Target>,
        /// Requests per second to each target.
        #[arg(long, env = "SP_TESTPOD_RATE", default_value_t = 5)]
        rate: u32,
        /// How long one request may take, connect to last byte, in milliseconds.
        #[arg(long, env = "SP_TESTPOD_TIMEOUT_MS", default_value_t = 2000)]
        timeout_ms: u64,
        /// How long to send, in seconds.
        #[arg(long, env = "SP_TESTPOD_DURATION_S")]
        duration_s: u64,
        /// The file to write the outcomes to.
        #[arg(long, env = "SP_TESTPOD_OUT")]
        out: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            return ExitCode::from(64);
        }
        Err(e) => e.exit(),
    };
    let result = match cli.command {
        Cmd::Serve {
            name,
            listen,
            udp: false,
        } => serve(&name, listen),
        Cmd::Serve {
            name,
            listen,
            udp: true,
        } => serve_udp(&name, listen),
        Cmd::Hit {
            url,
            count,
            timeout_ms,
            interval_ms,
            udp,
            source_port,
            source,
        } => {
            let pace = Pace {
                timeout: Duration::from_millis(timeout_ms),
                interval: Duration::from_millis(interval_ms),
            };
            if udp {
                parse_udp_url(&url).and_then(|(addr, payload)| {
                    let from = source.unwrap_or_else(|| unspecified_like(addr));
                    let local = SocketAddr::new(from, source_port.unwrap_or(0));
                    hit_udp(addr, payload, count, &pace, local)
                })
            } else {
                parse_url(&url).map(|(addr, path)| {
                    hit(count, &pace, |timeout| {
                        request(addr, source, &path, timeout)
                    });
                })
            }
        }
        Cmd::SctpServe {
            name,
            port,
            with_client,
        } => sctp::serve(&name, port, with_client),
        Cmd::SctpHit {
            address,
            count,
            timeout_ms,
        } => {
            let pace = Pace {
                timeout: Duration::from_millis(timeout_ms),
                interval: Duration::ZERO,
            };
            sctp::hit(address, count, &pace)
        }
        Cmd::Load {
            targets,
            rate,
            timeout_ms,
            duration_s,
            out,
        } => {
            let plan = load::Plan {
                rate,
                timeout: Duration::from_millis(timeout_ms),
                duration: Duration::from_secs(duration_s),
            };
            load::run(targets, &plan, &out)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sp-testpod: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Serves forever, one thread per connection.
fn serve(name: &str, listen: SocketAddr) -> Result<()> {
    let listener =
        TcpListener::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    println!("sp-testpod {name} listening on {listen}");
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let name = name.to_owned();
                std::thread::spawn(move || {
                    if let Err(e) = answer(stream, &name) {
                        eprintln!("sp-testpod: {e:#}");
                    }
                });
            }
            Err(e) => eprintln!("sp-testpod: accept failed: {e}"),
        }
    }
    Ok(())
}

/// Answers every datagram with `name`, forever.
fn serve_udp(name: &str, listen: SocketAddr) -> Result<()> {
    let socket = UdpSocket::bind(listen).with_context(|| format!("cannot listen on {listen}"))?;
    println!("sp-testpod {name} listening on udp {listen}");
    let mut buf = [0_u8; 2048];
    loop {
        match socket.recv_from(&mut buf) {
            Ok((len, peer)) => {
                println!("{peer} datagram");
                // As HTTP's `/source`: a datagram saying `source` gets the client's address too.
                let answer = if &buf[..len] == b"source" {
                    format!("{name} {}", peer.ip().to_canonical())
                } else {
                    name.to_owned()
                };
                if let Err(e) = socket.send_to(answer.as_bytes(), peer) {
                    eprintln!("sp-testpod: cannot answer {peer}: {e}");
                }
            }
            Err(e) => eprintln!("sp-testpod: receive failed: {e}"),
        }
    }
}

/// Reads one request head and answers it with `name`, and for `/source` the client's address.
fn answer(mut stream: TcpStream, name: &str) -> Result<()> {
    let peer = stream.peer_addr().context("no peer address")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let head = read_head(&mut stream).with_context(|| format!("bad request from {peer}"))?;
    let request_line = head.lines().next().unwrap_or_default();
    println!("{peer} {request_line}");
    let body = if request_line.split_whitespace().nth(1) == Some("/source") {
        // A dual-stack listener sees IPv4 clients as `::ffff:a.b.c.d`; report them as IPv4.
        format!("{name} {}\n", peer.ip().to_canonical())
    } else {
        format!("{name}\n")
    };
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(response.as_bytes())
        .with_context(|| format!("cannot answer {peer}"))?;
    Ok(())
}

/// Reads up to the blank line ending an HTTP head.
fn read_head(stream: &mut TcpStream) -> Result<String> {
    let mut head = Vec::new();
    let mut byte = [0_u8; 1];
    let mut limited = stream.take(MAX_MESSAGE);
    while !head.ends_with(b"\r\n\r\n") {
        if limited.read(&mut byte)? == 0 {
            bail!("connection closed in the request head");
        }
        head.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// The address of `udp://IP:PORT[/source]`, and the datagram to send: `source` (answered with
/// the client address too) for the `/source` path, as over HTTP.
fn parse_udp_url(url: &str) -> Result<(SocketAddr, &'static [u8])> {
    let rest = url
        .strip_prefix("udp://")
        .ok_or_else(|| anyhow!("url {url:?} must start with udp:// (with --udp)"))?;
    let (authority, payload): (&str, &'static [u8]) = match rest.strip_suffix("/source") {
        Some(authority) => (authority, b"source"),
        None => (rest.trim_end_matches('/'), b"hit"),
    };
    let addr = authority
        .parse()
        .map_err(|_| anyhow!("url {url:?} must name an IP address and a port"))?;
    Ok((addr, payload))
}

/// Splits `http://IP:PORT/path` into a socket address and a path.
fn parse_url(url: &str) -> Result<(SocketAddr, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("url {url:?} must start with http://"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .parse()
        .or_else(|_| format!("{authority}:80").parse())
        .map_err(|_| anyhow!("url {url:?} must name an IP address (and port), not a host name"))?;
    Ok((addr, path.to_owned()))
}

/// How requests are timed.
struct Pace {
    /// How long one request may take.
    timeout: Duration,
    /// The pause between requests.
    interval: Duration,
}

/// Makes `count` requests with `request` (given the per-request timeout) and prints the report.
fn hit(count: u32, pace: &Pace, mut request: impl FnMut(Duration) -> Result<String>) {
    let mut report = HitReport::default();
    for i in 0..count {
        if i > 0 && !pace.interval.is_zero() {
            std::thread::sleep(pace.interval);
        }
        match request(pace.timeout) {
            Ok(name) => *report.answers.entry(name).or_default() += 1,
            Err(e) => {
                report.failures += 1;
                let e = format!("{e:#}");
                if report.errors.len() < MAX_ERRORS && !report.errors.contains(&e) {
                    report.errors.push(e);
                }
            }
        }
    }
    println!(
        "{}",
        serde_json::to_string(&report).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    );
}

/// Sends the datagrams from `local`: all from one socket when it names a port, else each from a
/// fresh one; prints the report.
fn hit_udp(
    addr: SocketAddr,
    payload: &[u8],
    count: u32,
    pace: &Pace,
    local: SocketAddr,
) -> Result<()> {
    let bind = || UdpSocket::bind(local).with_context(|| format!("cannot bind {local}"));
    let fixed = (local.port() != 0).then(bind).transpose()?;
    hit(count, pace, |timeout| match &fixed {
        Some(socket) => datagram(socket, addr, payload, timeout),
        None => datagram(&bind()?, addr, payload, timeout),
    });
    Ok(())
}

/// The unspecified address of `addr`'s family, to bind a client socket that can reach it.
fn unspecified_like(addr: SocketAddr) -> IpAddr {
    match addr {
        SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        SocketAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// One datagram holding `payload` to `addr` from `socket`; returns the answer.
fn datagram(
    socket: &UdpSocket,
    addr: SocketAddr,
    payload: &[u8],
    timeout: Duration,
) -> Result<String> {
    // Connected, so only answers from `addr` count and an ICMP error fails the request at once.
    socket
        .connect(addr)
        .with_context(|| format!("connect {addr}"))?;
    socket.set_read_timeout(Some(timeout))?;
    socket
        .send(payload)
        .with_context(|| format!("send to {addr}"))?;
    let mut buf = [0_u8; 2048];
    let n = socket
        .recv(&mut buf)
        .with_context(|| format!("receive from {addr}"))?;
    Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned())
}

/// One request on a new connection, from `source` if given; returns the answering server's name.
fn request(
    addr: SocketAddr,
    source: Option<IpAddr>,
    path: &str,
    timeout: Duration,
) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut stream = connect(addr, source, timeout).with_context(|| format!("connect {addr}"))?;
    let remaining = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    };
    stream.set_write_timeout(Some(remaining()))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .with_context(|| format!("send to {addr}"))?;
    let mut response = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        ensure!(
            Instant::now() < deadline,
            "read from {addr}: timed out after {timeout:?}"
        );
        stream.set_read_timeout(Some(remaining()))?;
        let n = stream
            .read(&mut buf)
            .with_context(|| format!("read from {addr}"))?;
        if n == 0 {
            break;
        }
        response.extend_from_slice(&buf[..n]);
        ensure!(
            response.len() as u64 <= MAX_MESSAGE,
            "response from {addr} is too long"
        );
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("response from {addr} has no complete head"))?;
    let status = head.lines().next().unwrap_or_default();
    ensure!(
        status.starts_with("HTTP/1.1 200 "),
        "{addr} answered {status:?}"
    );
    Ok(body.trim().to_owned())
}

/// A TCP connection to `addr`, bound to `source` first when given.
fn connect(addr: SocketAddr, source: Option<IpAddr>, timeout: Duration) -> Result<TcpStream> {
    let Some(source) = source else {
        return Ok(TcpStream::connect_timeout(&addr, timeout)?);
    };
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket
        .bind(&SocketAddr::new(source, 0).into())
        .with_context(|| format!("bind {source}"))?;
    socket.connect_timeout(&addr.into(), timeout)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_name_an_address_a_port_and_a_path() {
        let (addr, path) = parse_url("http://10.96.0.10:8080/a/b").unwrap();
        assert_eq!(addr, "10.96.0.10:8080".parse().unwrap());
        assert_eq!(path, "/a/b");
    }

    #[test]
    fn ipv6_literals_are_bracketed_in_urls() {
        let (addr, path) = parse_url("http://[fd00:10:96::10]:8080/a").unwrap();
        assert_eq!(addr, "[fd00:10:96::10]:8080".parse().unwrap());
        assert_eq!(path, "/a");
        let (addr, _) = parse_url("http://[fd00:10:96::10]/").unwrap();
        assert_eq!(addr, "[fd00:10:96::10]:80".parse().unwrap());
        assert!(parse_url("http://fd00:10:96::10/").is_err());
        assert_eq!(
            parse_udp_url("udp://[fd00:10:96::30]:53").unwrap().0,
            "[fd00:10:96::30]:53".parse().unwrap()
        );
        assert!(unspecified_like("[fd00::1]:53".parse().unwrap()).is_ipv6());
        assert!(unspecified_like("10.0.0.1:53".parse().unwrap()).is_ipv4());
    }

    #[test]
    fn urls_without_port_or_path_use_80_and_slash() {
        let (addr, path) = parse_url("http://10.96.0.10").unwrap();
        assert_eq!(addr, "10.96.0.10:80".parse().unwrap());
        assert_eq!(path, "/");
    }

    #[test]
    fn urls_with_host_names_or_other_schemes_are_rejected() {
        assert!(parse_url("http://example.com/").is_err());
        assert!(parse_url("https://10.96.0.10/").is_err());
    }

    #[test]
    fn hit_defaults_to_a_two_second_timeout() {
        let cli = Cli::try_parse_from([
            "sp-testpod",
            "hit",
            "--url",
            "http://10.96.0.10/",
            "--count",
            "3",
        ])
        .unwrap();
        let Cmd::Hit {
            count, timeout_ms, ..
        } = cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!((count, timeout_ms), (3, 2000));
    }

    #[test]
    fn udp_urls_name_an_address_a_port_and_whether_to_ask_for_the_source() {
        let address: SocketAddr = "10.96.0.30:53".parse().unwrap();
        assert_eq!(
            parse_udp_url("udp://10.96.0.30:53").unwrap(),
            (address, &b"hit"[..])
        );
        assert_eq!(
            parse_udp_url("udp://10.96.0.30:53/source").unwrap(),
            (address, &b"source"[..])
        );
        assert!(parse_udp_url("udp://10.96.0.30").is_err());
        assert!(parse_udp_url("http://10.96.0.30:53").is_err());
    }

    #[test]
    fn source_port_needs_udp() {
        let args = ["sp-testpod", "hit", "--url", "udp://10.96.0.30:53"];
        let with_port = |extra: &[&'static str]| {
            Cli::try_parse_from(args.iter().chain(extra).copied().collect::<Vec<_>>())
        };
        assert!(with_port(&["--source-port", "40000"]).is_err());
        let cli = with_port(&["--udp", "--source-port", "40000"]).unwrap();
        let Cmd::Hit {
            udp, source_port, ..
        } = cli.command
        else {
            panic!("{cli:?}")
        };
        assert_eq!((udp, source_port), (true, Some(40000)));
    }

    #[test]
    fn serve_needs_a_name() {
        assert!(Cli::try_parse_from(["sp-testpod", "serve", "--listen", "0.0.0.0:8080"]).is_err());
    }
}
