//! `sp-testpod`: a tiny HTTP server that answers with its name, and a client that counts who answered.
//!
//! ```text
//! sp-testpod serve --name pod-a --listen 0.0.0.0:8080
//! sp-testpod hit --url http://10.96.0.10:80/ --count 20 [--timeout-ms 2000]
//! ```
//!
//! `hit` makes each request on a new TCP connection (so a proxy balances every one) and prints one
//! JSON line: `{"answers":{"pod-a":12,"pod-b":8},"failures":0,"errors":[]}`. It exits 0 even when
//! requests fail; the test decides what that means. Only IP addresses are accepted, never names.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use clap::{Parser, Subcommand};
use splitproxy_e2e::HitReport;

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
    /// Answer every HTTP request with 200 and NAME as the body.
    Serve {
        /// The name to answer with (the pod's name).
        #[arg(long, env = "SP_TESTPOD_NAME")]
        name: String,
        /// The address to listen on.
        #[arg(long, env = "SP_TESTPOD_LISTEN")]
        listen: SocketAddr,
    },
    /// Make COUNT requests to URL, each on a new connection, and print who answered as JSON.
    Hit {
        /// `http://IP:PORT/path`.
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
        Cmd::Serve { name, listen } => serve(&name, listen),
        Cmd::Hit {
            url,
            count,
            timeout_ms,
            interval_ms,
        } => parse_url(&url).map(|(addr, path)| {
            let pace = Pace {
                timeout: Duration::from_millis(timeout_ms),
                interval: Duration::from_millis(interval_ms),
            };
            hit(addr, &path, count, pace);
        }),
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
    let body = format!("{name}\n");
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let body = body.clone();
                std::thread::spawn(move || {
                    if let Err(e) = answer(stream, &body) {
                        eprintln!("sp-testpod: {e:#}");
                    }
                });
            }
            Err(e) => eprintln!("sp-testpod: accept failed: {e}"),
        }
    }
    Ok(())
}

/// Reads one request head and answers it with `body`.
fn answer(mut stream: TcpStream, body: &str) -> Result<()> {
    let peer = stream.peer_addr().context("no peer address")?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    let head = read_head(&mut stream).with_context(|| format!("bad request from {peer}"))?;
    let request_line = head.lines().next().unwrap_or_default();
    println!("{peer} {request_line}");
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

/// Makes the requests and prints the report.
fn hit(addr: SocketAddr, path: &str, count: u32, pace: Pace) {
    let mut report = HitReport::default();
    for i in 0..count {
        if i > 0 && !pace.interval.is_zero() {
            std::thread::sleep(pace.interval);
        }
        match request(addr, path, pace.timeout) {
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

/// One request on a new connection; returns the answering server's name.
fn request(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
    let deadline = Instant::now() + timeout;
    let mut stream =
        TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connect {addr}"))?;
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
    fn serve_needs_a_name() {
        assert!(Cli::try_parse_from(["sp-testpod", "serve", "--listen", "0.0.0.0:8080"]).is_err());
    }
}
