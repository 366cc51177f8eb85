//! B5's traffic: an echo server for a server pod, and a client that times what an application
//! feels through a Service, run by the benchmark inside a client pod's namespace, pinned to a CPU
//! of its own. The client prints one JSON [`Trial`] on stdout.
//!
//! Each exchange sends [`MESSAGE`] bytes and reads as many back. A new TCP connection is closed
//! with a reset (linger 0), so neither end keeps a TIME_WAIT socket and the client's ports never
//! run out during a trial; the node's conntrack entry then lasts 10 s (`CLOSE`), and the
//! benchmark flushes conntrack between trials.

use anyhow::{Context as _, Result};
use nix::errno::Errno;
use serde::{Deserialize, Serialize};
use socket2::{Domain, Protocol, Socket, Type};
use std::{
    collections::BTreeMap,
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

/// Bytes each way per exchange: a small request and reply, as a health check or a DNS query.
pub const MESSAGE: usize = 64;
/// The server's TCP accept queue: far above what the client keeps in flight.
const BACKLOG: i32 = 4096;
/// How long one connect or exchange may take before it counts as an error: a lost SYN is
/// retransmitted after 1 s, which a valid trial never sees.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(2);

/// `splitproxy-bench b5-serve`'s flags.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The TCP port to echo on.
    #[arg(long, default_value_t = 8080)]
    tcp_port: u16,
    /// The UDP port to echo on.
    #[arg(long, default_value_t = 8053)]
    udp_port: u16,
    /// Threads accepting and serving TCP connections (each serves one connection at a time:
    /// more than the client keeps open at once).
    #[arg(long, default_value_t = 64)]
    threads: usize,
}

/// What the client does per exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Exchange {
    /// A new TCP connection for each request and reply.
    Connect,
    /// One TCP connection per worker (to the first target it is given), kept open for every
    /// request and reply.
    KeptAlive,
    /// A new UDP socket, on the next source port, for each request and reply, as a DNS client.
    Udp,
}

/// How the client measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Measure {
    /// One exchange in flight, `--count` of them, each timed.
    Latency,
    /// `--concurrency` exchanges in flight for `--seconds`, counted.
    Rate,
}

/// `splitproxy-bench b5-load`'s flags.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// Where to send (address:port; several are used in turn, one per exchange).
    #[arg(long, value_delimiter = ',', required = true)]
    targets: Vec<SocketAddr>,
    /// What one exchange is.
    #[arg(long, value_enum)]
    exchange: Exchange,
    /// Latency (one in flight, each timed) or rate (several in flight, counted).
    #[arg(long, value_enum)]
    measure: Measure,
    /// Exchanges timed in latency mode.
    #[arg(long, default_value_t = 1_000)]
    count: usize,
    /// Seconds of load in rate mode.
    #[arg(long, default_value_t = 1.0)]
    seconds: f64,
    /// Exchanges in flight in rate mode (one thread each).
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
}

/// What one client run measured.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Trial {
    /// Exchanges completed.
    pub completed: u64,
    /// Failed exchanges by cause (`EADDRNOTAVAIL`, `ETIMEDOUT`, `short reply`, …).
    pub errors: BTreeMap<String, u64>,
    /// The measured window, in seconds.
    pub elapsed_s: f64,
    /// Latency mode: each connect, in µs (TCP with a new connection only).
    pub connect_us: Vec<f64>,
    /// Latency mode: each whole exchange, connect included, in µs.
    pub exchange_us: Vec<f64>,
    /// CPU time the whole machine spent busy in the window (every CPU; user, system, interrupts,
    /// not steal), in µs.
    pub machine_busy_us: f64,
    /// CPU time stolen by the hypervisor in the window, in µs.
    pub machine_steal_us: f64,
}

/// Serves TCP and UDP echo until killed.
///
/// # Errors
///
/// If a port cannot be bound.
pub fn serve(args: &ServeArgs) -> Result<()> {
    let tcp = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))?;
    tcp.set_reuse_address(true)?;
    tcp.bind(&SocketAddr::from(([0, 0, 0, 0], args.tcp_port)).into())
        .with_context(|| format!("binding TCP port {}", args.tcp_port))?;
    tcp.listen(BACKLOG)?;
    let listener: TcpListener = tcp.into();
    let udp = UdpSocket::bind(("0.0.0.0", args.udp_port))
        .with_context(|| format!("binding UDP port {}", args.udp_port))?;
    std::thread::scope(|scope| {
        for _ in 0..args.threads.max(1) {
            scope.spawn(|| {
                loop {
                    // A failed accept or connection concerns that connection alone.
                    if let Ok((stream, _)) = listener.accept() {
                        let _ = echo(stream);
                    }
                }
            });
        }
        let mut buffer = [0u8; 1500];
        loop {
            if let Ok((len, from)) = udp.recv_from(&mut buffer) {
                let _ = udp.send_to(&buffer[..len], from);
            }
        }
    })
}

/// Echoes whole messages until the peer closes or resets.
fn echo(mut stream: TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let mut message = [0u8; MESSAGE];
    loop {
        stream.read_exact(&mut message)?;
        stream.write_all(&message)?;
    }
}

/// Runs one trial and prints it as JSON.
///
/// # Errors
///
/// If the trial cannot be printed.
pub fn load(args: &LoadArgs) -> Result<()> {
    let trial = match args.measure {
        Measure::Latency => latency(args),
        Measure::Rate => rate(args),
    };
    println!("{}", serde_json::to_string(&trial)?);
    Ok(())
}

fn latency(args: &LoadArgs) -> Trial {
    let mut trial = Trial::default();
    let mut worker = Worker::new(args.exchange, 0, 1);
    let window = MachineCpu::start();
    let started = Instant::now();
    for i in 0..args.count {
        if worker.done() {
            break;
        }
        let target = args.targets[i % args.targets.len()];
        match worker.exchange(target) {
            Ok(timing) => {
                trial.completed += 1;
                trial.exchange_us.push(micros(timing.exchange));
                if let Some(connect) = timing.connect {
                    trial.connect_us.push(micros(connect));
                }
            }
            Err(cause) => *trial.errors.entry(cause).or_default() += 1,
        }
    }
    trial.elapsed_s = started.elapsed().as_secs_f64();
    (trial.machine_busy_us, trial.machine_steal_us) = window.finish();
    trial
}

fn rate(args: &LoadArgs) -> Trial {
    let deadline = Duration::from_secs_f64(args.seconds);
    let window = MachineCpu::start();
    let started = Instant::now();
    let workers: Vec<(u64, BTreeMap<String, u64>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..args.concurrency.max(1))
            .map(|w| {
                scope.spawn(move || {
                    let mut worker = Worker::new(args.exchange, w, args.concurrency.max(1));
                    let (mut completed, mut errors) = (0u64, BTreeMap::<String, u64>::new());
                    let mut i = w;
                    while started.elapsed() < deadline && !worker.done() {
                        match worker.exchange(args.targets[i % args.targets.len()]) {
                            Ok(_) => completed += 1,
                            Err(cause) => *errors.entry(cause).or_default() += 1,
                        }
                        i += 1;
                    }
                    (completed, errors)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    // A worker that panicked made this trial worthless: say so in its errors.
                    (0, BTreeMap::from([("worker panicked".to_owned(), 1)]))
                })
            })
            .collect()
    });
    let mut trial = Trial {
        elapsed_s: started.elapsed().as_secs_f64(),
        ..Trial::default()
    };
    (trial.machine_busy_us, trial.machine_steal_us) = window.finish();
    for (completed, errors) in workers {
        trial.completed += completed;
        for (cause, n) in errors {
            *trial.errors.entry(cause).or_default() += n;
        }
    }
    trial
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The times of one exchange.
struct Timing {
    /// The TCP connect, for a new connection.
    connect: Option<Duration>,
    /// The whole exchange.
    exchange: Duration,
}

/// The source ports a UDP client takes, one after the other: a port the kernel picked at random
/// would come back within a trial while conntrack still holds its last flow, so that request
/// would skip the rules, or clash with a flow to another Service on the same endpoint (and be
/// dropped). Each worker has its own share; a trial ends when its share is used up.
const UDP_SOURCE_PORTS: std::ops::Range<u16> = 1024..u16::MAX;

/// One client: what it keeps between exchanges (its kept-alive connection, its next source
/// port).
struct Worker {
    exchange: Exchange,
    kept: Option<TcpStream>,
    ports: std::ops::Range<u16>,
}

impl Worker {
    /// Worker `index` of `workers`.
    fn new(exchange: Exchange, index: usize, workers: usize) -> Self {
        let all = usize::from(UDP_SOURCE_PORTS.end - UDP_SOURCE_PORTS.start);
        let share = all / workers.max(1);
        let port = |i: usize| {
            // i ≤ workers, so i × share ≤ the range's length: it fits in a port.
            UDP_SOURCE_PORTS.start + u16::try_from(i * share).unwrap_or(UDP_SOURCE_PORTS.end)
        };
        Self {
            exchange,
            kept: None,
            ports: port(index)..port(index + 1),
        }
    }

    /// Whether it can make no more exchanges: a UDP worker whose source ports are used up.
    fn done(&self) -> bool {
        self.exchange == Exchange::Udp && self.ports.is_empty()
    }

    /// One request and reply with `target`; the error is its cause's name.
    fn exchange(&mut self, target: SocketAddr) -> Result<Timing, String> {
        let started = Instant::now();
        let mut message = [0x5a_u8; MESSAGE];
        match self.exchange {
            Exchange::Connect => {
                let mut stream =
                    TcpStream::connect_timeout(&target, EXCHANGE_TIMEOUT).map_err(cause)?;
                let connect = started.elapsed();
                round_trip(&stream, &mut message)?;
                // Reset on close: no TIME_WAIT on either end.
                let _ = Socket::from(stream.try_clone().map_err(cause)?)
                    .set_linger(Some(Duration::ZERO));
                let _ = stream.flush();
                drop(stream);
                Ok(Timing {
                    connect: Some(connect),
                    exchange: started.elapsed(),
                })
            }
            Exchange::KeptAlive => {
                // One connection per worker, to the first target it is given: only a
                // connection's first packet meets the rules, so one Service is enough, and a
                // connection per target would outnumber the server's threads.
                let stream = match &mut self.kept {
                    Some(stream) => stream,
                    kept @ None => kept.insert(
                        TcpStream::connect_timeout(&target, EXCHANGE_TIMEOUT).map_err(cause)?,
                    ),
                };
                let result = round_trip(stream, &mut message);
                if result.is_err() {
                    self.kept = None;
                }
                result?;
                Ok(Timing {
                    connect: None,
                    exchange: started.elapsed(),
                })
            }
            Exchange::Udp => {
                let socket = loop {
                    let port = self
                        .ports
                        .next()
                        .ok_or_else(|| "source ports used up".to_owned())?;
                    match UdpSocket::bind(("0.0.0.0", port)) {
                        Ok(socket) => break socket,
                        // Another socket holds it: take the next.
                        Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {}
                        Err(err) => return Err(cause(err)),
                    }
                };
                socket.connect(target).map_err(cause)?;
                socket
                    .set_read_timeout(Some(EXCHANGE_TIMEOUT))
                    .map_err(cause)?;
                socket.send(&message).map_err(cause)?;
                let len = socket.recv(&mut message).map_err(cause)?;
                if len != MESSAGE {
                    return Err("short reply".to_owned());
                }
                Ok(Timing {
                    connect: None,
                    exchange: started.elapsed(),
                })
            }
        }
    }
}

/// Sends `message` on `stream` and reads the echo back into it.
fn round_trip(mut stream: &TcpStream, message: &mut [u8; MESSAGE]) -> Result<(), String> {
    stream.set_nodelay(true).map_err(cause)?;
    stream
        .set_read_timeout(Some(EXCHANGE_TIMEOUT))
        .map_err(cause)?;
    stream.write_all(message).map_err(cause)?;
    stream.read_exact(message).map_err(cause)
}

/// The name of an I/O error's cause: the errno's symbol (`EADDRNOTAVAIL`), `timeout` for a read
/// that timed out, or the error's kind.
fn cause(err: std::io::Error) -> String {
    match err.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EAGAIN) => "timeout".to_owned(),
        Some(errno) => format!("{errno:?}"),
        None => format!("{:?}", err.kind()),
    }
}

/// The whole machine's busy and stolen CPU time over a window, from `/proc/stat`.
struct MachineCpu {
    at_start: Option<(f64, f64)>,
}

impl MachineCpu {
    fn start() -> Self {
        Self {
            at_start: machine_cpu_us(),
        }
    }

    /// Busy and stolen µs since [`MachineCpu::start`] (0 when `/proc/stat` cannot be read).
    fn finish(self) -> (f64, f64) {
        match (self.at_start, machine_cpu_us()) {
            (Some((busy0, steal0)), Some((busy1, steal1))) => (busy1 - busy0, steal1 - steal0),
            _ => (0.0, 0.0),
        }
    }
}

/// The busy (user, nice, system, irq, softirq) and steal time of all CPUs so far, in µs.
fn machine_cpu_us() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// The busy and steal µs of `/proc/stat`'s first line (`cpu  user nice system idle iowait irq
/// softirq steal …`, in USER_HZ ticks of 10 ms).
fn parse_cpu_line(line: &str) -> Option<(f64, f64)> {
    let ticks: Vec<f64> = line
        .strip_prefix("cpu ")?
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = ticks[..] else {
        return None;
    };
    let tick_us = 10_000.0;
    Some((
        (user + nice + system + irq + softirq) * tick_us,
        steal * tick_us,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_leaves_out_idle_iowait_and_steal() {
        let line = "cpu  100 5 20 1000 7 3 2 4 0 0";
        assert_eq!(parse_cpu_line(line), Some((1_300_000.0, 40_000.0)));
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8"), None);
    }

    /// The server and the client on loopback: every exchange kind completes and is timed.
    #[test]
    fn every_exchange_completes_against_the_echo_server() {
        let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = probe.local_addr().expect("its address").port();
        drop(probe);
        // Fewer server threads than targets: a kept-alive client holds one connection, not
        // one per target.
        let serve_args = ServeArgs {
            tcp_port: port,
            udp_port: port,
            threads: 3,
        };
        std::thread::spawn(move || serve(&serve_args));
        let target = SocketAddr::from(([127, 0, 0, 1], port));
        // The server binds in its own thread: wait for it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(target).is_err() {
            assert!(Instant::now() < deadline, "the echo server never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        for exchange in [Exchange::Connect, Exchange::KeptAlive, Exchange::Udp] {
            // The server listens on every loopback address; its UDP replies come from
            // 127.0.0.1 alone (in the lab conntrack gives them the Service's address back).
            let hosts = if exchange == Exchange::Udp { 1 } else { 5 };
            let args = LoadArgs {
                targets: (1..=hosts)
                    .map(|host| SocketAddr::from(([127, 0, 0, host], port)))
                    .collect(),
                exchange,
                measure: Measure::Latency,
                count: 50,
                seconds: 0.2,
                concurrency: 2,
            };
            let timed = latency(&args);
            let clean = (50, &BTreeMap::new());
            assert_eq!((timed.completed, &timed.errors), clean, "{exchange:?}");
            assert_eq!(timed.exchange_us.len(), 50);
            let connects = if exchange == Exchange::Connect { 50 } else { 0 };
            assert_eq!(timed.connect_us.len(), connects, "{exchange:?}");
            let counted = rate(&LoadArgs {
                measure: Measure::Rate,
                ..args
            });
            assert!(
                counted.completed > 0 && counted.errors.is_empty(),
                "{counted:?}"
            );
        }
    }

    #[test]
    fn a_refused_connection_is_counted_by_its_cause() {
        let probe = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let target = probe.local_addr().expect("its address");
        drop(probe);
        let timed = latency(&LoadArgs {
            targets: vec![target],
            exchange: Exchange::Connect,
            measure: Measure::Latency,
            count: 3,
            seconds: 0.0,
            concurrency: 1,
        });
        assert_eq!(timed.completed, 0);
        assert_eq!(timed.errors.get("ECONNREFUSED"), Some(&3));
    }

    #[test]
    fn udp_workers_take_source_ports_in_turn_from_shares_of_their_own() {
        let first = Worker::new(Exchange::Udp, 0, 4);
        let last = Worker::new(Exchange::Udp, 3, 4);
        assert_eq!(first.ports.start, UDP_SOURCE_PORTS.start);
        assert!(first.ports.end <= last.ports.start && !last.ports.is_empty());
        assert!(first.ports.len() > 16_000);
        let mut spent = Worker::new(Exchange::Udp, 0, 1);
        spent.ports = 2000..2000;
        assert!(spent.done());
        assert!(!Worker::new(Exchange::Connect, 0, 1).done());
    }
}
