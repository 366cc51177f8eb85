//! Which connections the node view port keeps: anyone who reaches a node's IP reaches it, before
//! any credential is checked, so what an unauthenticated peer can hold is bounded here. A replica
//! holds at most [`MAX_CONNECTIONS`]; a connection must open an authenticated stream within
//! [`AUTHENTICATE_WITHIN`] of being accepted or it is closed; and one address holds at most
//! [`MAX_UNAUTHENTICATED_PER_ADDRESS`] connections that have not, so a flood from one pod (or
//! one node) neither fills the replica nor keeps other nodes' agents out. Over a limit, a
//! connection is closed as soon as it is accepted.

use std::{
    collections::HashMap,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tokio_stream::{Stream, StreamExt, wrappers::TcpListenerStream};

/// Connections one replica holds at most: one per node of a 5,000-node cluster whose other
/// replicas are gone, twice over, with room left for tools. Each costs its TLS and HTTP/2
/// buffers, some tens of KiB.
pub const MAX_CONNECTIONS: usize = 10_000;
/// How long a connection may stay open without an authenticated stream: an agent opens its stream
/// at once, and its review by the API server takes well under this. Health checks and grpcurl
/// are done within it too.
pub const AUTHENTICATE_WITHIN: Duration = Duration::from_secs(20);
/// Connections without an authenticated stream one address may hold at once. An agent holds one
/// at a time; a node's address also carries its hostNetwork pods.
pub const MAX_UNAUTHENTICATED_PER_ADDRESS: usize = 16;

/// The connections a replica holds: a slot per connection, and the unauthenticated ones counted
/// per address.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
    unauthenticated: Arc<Mutex<HashMap<IpAddr, usize>>>,
    within: Duration,
}

impl Default for Admission {
    fn default() -> Self {
        Self::new(MAX_CONNECTIONS, AUTHENTICATE_WITHIN)
    }
}

impl Admission {
    /// At most `connections` at once, each to authenticate within `within`.
    #[must_use]
    pub fn new(connections: usize, within: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(connections)),
            unauthenticated: Arc::default(),
            within,
        }
    }

    /// The connections of `listener` this replica keeps; the others are closed on accept.
    pub fn incoming(
        self,
        listener: TcpListener,
    ) -> impl Stream<Item = io::Result<Admitted>> + Send + 'static {
        TcpListenerStream::new(listener).filter_map(move |accepted| match accepted {
            Ok(stream) => self.admit(stream).map(Ok),
            Err(err) => Some(Err(err)),
        })
    }

    /// `stream`, when a slot is free and its address may open one more unauthenticated
    /// connection; `None` (the stream dropped, so closed) otherwise.
    fn admit(&self, stream: TcpStream) -> Option<Admitted> {
        let peer = stream.peer_addr().ok()?;
        let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
            tracing::warn!(%peer, "closing a connection: this replica holds as many as it may");
            return None;
        };
        {
            let mut counts = self.counts();
            let count = counts.entry(peer.ip()).or_default();
            if *count >= MAX_UNAUTHENTICATED_PER_ADDRESS {
                tracing::warn!(%peer, "closing a connection: its address holds as many unauthenticated ones as it may");
                return None;
            }
            *count += 1;
        }
        let ticket = Ticket {
            peer,
            authenticated: AtomicBool::new(false),
            unauthenticated: Arc::clone(&self.unauthenticated),
        };
        Some(Admitted {
            stream,
            ticket: Arc::new(ticket),
            deadline: Box::pin(tokio::time::sleep(self.within)),
            _slot: slot,
        })
    }

    fn counts(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        lock_counts(&self.unauthenticated)
    }
}

/// One connection's standing: its peer, and whether it opened an authenticated stream. Reaches
/// the `Sync` handler as the connection's info (a request extension).
#[derive(Debug)]
pub struct Ticket {
    peer: SocketAddr,
    authenticated: AtomicBool,
    unauthenticated: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Ticket {
    /// The peer's address.
    #[must_use]
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Marks the connection as carrying an authenticated stream: it is no longer closed at its
    /// deadline, nor counted against its address.
    pub fn authenticated(&self) {
        if !self.authenticated.swap(true, Ordering::AcqRel) {
            self.uncount();
        }
    }

    fn uncount(&self) {
        let mut counts = lock_counts(&self.unauthenticated);
        if let Some(count) = counts.get_mut(&self.peer.ip()) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.peer.ip());
            }
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.authenticated.load(Ordering::Acquire) {
            self.uncount();
        }
    }
}

/// The unauthenticated connections per address, locked.
fn lock_counts(counts: &Mutex<HashMap<IpAddr, usize>>) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
    // Every write leaves the map consistent, so a poisoned lock still holds good counts.
    counts.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection kept: it fails its reads once its deadline passes unauthenticated, which makes
/// the HTTP/2 server close it.
pub struct Admitted {
    stream: TcpStream,
    ticket: Arc<Ticket>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Admitted {
    /// The peer's address.
    #[must_use]
    pub fn peer(&self) -> SocketAddr {
        self.ticket.peer
    }
}

/// What the `Sync` handler finds of a connection in the request's extensions.
#[derive(Debug, Clone)]
pub struct ConnectionInfo(pub Arc<Ticket>);

impl tonic::transport::server::Connected for Admitted {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        ConnectionInfo(Arc::clone(&self.ticket))
    }
}

impl AsyncRead for Admitted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.ticket.authenticated.load(Ordering::Acquire)
            && self.deadline.as_mut().poll(cx).is_ready()
        {
            let peer = self.ticket.peer;
            tracing::info!(%peer, "closing a connection that opened no authenticated stream in time");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "no authenticated stream in time",
            )));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
