//! TLS on the node view port: the certificate is read from its files and read again whenever they
//! change, so a renewed certificate, or one from a new CA during a rollover, is served to new
//! connections without a restart while the open ones keep theirs; and each handshake runs beside
//! the accept loop within [`HANDSHAKE_TIMEOUT`], so a peer that connects and says nothing holds
//! nothing up.

use crate::admission::{Admitted, ConnectionInfo};
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use splitproxy_telemetry::error_chain;
use std::{
    io,
    path::PathBuf,
    pin::{Pin, pin},
    sync::{Arc, PoisonError, RwLock},
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::mpsc,
    task::JoinSet,
};
use tokio_rustls::{TlsAcceptor, server::TlsStream};
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};

/// How long a TLS handshake may take (Calico Typha's default): a peer that opens a connection and
/// says nothing is closed then.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are read to see whether they changed: a Secret volume or a
/// certificate manager replaces them well ahead of the old certificate's end.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(5);
/// How long the controller waits at start for its certificate files (written by the Pod's
/// certificate sidecar, which starts first).
pub const START_PATIENCE: Duration = Duration::from_secs(120);

/// Why a certificate could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file cannot be read.
    #[error("reading {0}")]
    Read(String, #[source] io::Error),
    /// The PEM holds no certificate, or unreadable ones.
    #[error("the certificate PEM holds no usable certificate")]
    NoCertificate,
    /// The PEM holds no private key.
    #[error("the private key PEM holds no usable key")]
    NoKey(#[source] rustls_pki_types::pem::Error),
    /// The key cannot be used, or is not the certificate's.
    #[error("the key cannot serve the certificate")]
    Key(#[source] rustls::Error),
    /// TLS cannot be configured with the ring provider.
    #[error("configuring TLS")]
    Config(#[source] rustls::Error),
}

/// The certificate (chain) and private key files the port serves.
#[derive(Debug, Clone)]
pub struct CertificateFiles {
    /// PEM certificate, followed by its chain.
    pub cert: PathBuf,
    /// PEM private key of the certificate.
    pub key: PathBuf,
}

impl CertificateFiles {
    fn read(&self) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|err| Error::Read(path.display().to_string(), err))
        };
        Ok((read(&self.cert)?, read(&self.key)?))
    }
}

/// The certificate served to each new connection; replaced as a whole, so a handshake sees
/// either the old certificate and key or the new ones.
pub struct ServingCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl std::fmt::Debug for ServingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertificate").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ServingCertificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.resolve_current())
    }
}

impl ServingCertificate {
    fn resolve_current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The certificate `chain_pem` (the certificate first) with its key `key_pem`.
    ///
    /// # Errors
    ///
    /// If either is unreadable or the key is not the certificate's.
    pub fn from_pem(chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<Self>, Error> {
        Ok(Arc::new(Self {
            current: RwLock::new(certified(chain_pem, key_pem)?),
        }))
    }

    /// The certificate in `files`, waiting up to [`START_PATIENCE`] for them to appear and hold a
    /// certificate and its key.
    ///
    /// # Errors
    ///
    /// The last reason they could not be used, once the patience is spent.
    pub async fn wait_for(files: &CertificateFiles) -> Result<Arc<Self>, Error> {
        let deadline = tokio::time::Instant::now() + START_PATIENCE;
        let mut waiting = false;
        loop {
            let read = files
                .read()
                .and_then(|(chain, key)| Self::from_pem(&chain, &key));
            match read {
                Ok(certificate) => return Ok(certificate),
                Err(err) if tokio::time::Instant::now() >= deadline => return Err(err),
                Err(err) => {
                    if !std::mem::replace(&mut waiting, true) {
                        tracing::info!(
                            cert = %files.cert.display(),
                            error = %err,
                            "waiting for the serving certificate"
                        );
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Serves `chain_pem` and `key_pem` to the connections made from now on.
    ///
    /// # Errors
    ///
    /// If they cannot be used; the certificate served stays the one before.
    pub fn replace(&self, chain_pem: &[u8], key_pem: &[u8]) -> Result<(), Error> {
        let new = certified(chain_pem, key_pem)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = new;
        Ok(())
    }

    /// Reads `files` every [`RELOAD_INTERVAL`] and serves what they hold whenever it changed; a
    /// change that cannot be used (a file half written, a key that is not the certificate's) is
    /// logged and the certificate before it kept.
    pub async fn follow(self: Arc<Self>, files: CertificateFiles) {
        let mut seen = files.read().ok();
        loop {
            tokio::time::sleep(RELOAD_INTERVAL).await;
            let read = match files.read() {
                Ok(read) => read,
                Err(err) => {
                    tracing::warn!(error = %error_chain(&err), "keeping the serving certificate");
                    continue;
                }
            };
            if seen.as_ref() == Some(&read) {
                continue;
            }
            match self.replace(&read.0, &read.1) {
                Ok(()) => tracing::info!(
                    cert = %files.cert.display(),
                    "serving the certificate the files now hold to new connections"
                ),
                Err(err) => tracing::warn!(
                    cert = %files.cert.display(),
                    error = %error_chain(&err),
                    "the certificate files changed to something unusable; keeping the one before"
                ),
            }
            seen = Some(read);
        }
    }

    /// A TLS acceptor serving this certificate, offering HTTP/2 (what agents and grpcurl speak).
    ///
    /// # Errors
    ///
    /// If the ring provider cannot make a configuration.
    pub fn acceptor(self: &Arc<Self>) -> Result<TlsAcceptor, Error> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(Error::Config)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(TlsAcceptor::from(Arc::new(config)))
    }
}

/// Checks that `key_pem` is the private key of the first certificate of `chain_pem`.
///
/// # Errors
///
/// Says why not.
pub fn check_pair(chain_pem: &[u8], key_pem: &[u8]) -> Result<(), Error> {
    certified(chain_pem, key_pem).map(drop)
}

/// `chain_pem` and `key_pem` as rustls serves them, checked to belong together.
fn certified(chain_pem: &[u8], key_pem: &[u8]) -> Result<Arc<CertifiedKey>, Error> {
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .ok()
        .filter(|chain| !chain.is_empty())
        .ok_or(Error::NoCertificate)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(Error::NoKey)?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, key, &provider).map_err(Error::Key)?;
    Ok(Arc::new(certified))
}

/// A connection the node view port serves: plain, or TLS over an admitted connection.
pub enum Connection {
    /// Without TLS.
    Plain(Admitted),
    /// After a completed handshake.
    Tls(Box<TlsStream<Admitted>>),
}

impl Connection {
    fn admitted(&self) -> &Admitted {
        match self {
            Self::Plain(admitted) => admitted,
            Self::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ConnectionInfo;

    fn connect_info(&self) -> ConnectionInfo {
        self.admitted().connect_info()
    }
}

/// The connections of `admitted` whose TLS handshake with `acceptor` completes within
/// [`HANDSHAKE_TIMEOUT`]; handshakes run at once, however many. Ends when the server stops
/// taking connections.
pub fn handshakes(
    admitted: impl Stream<Item = io::Result<Admitted>> + Send + 'static,
    acceptor: TlsAcceptor,
) -> impl Stream<Item = io::Result<Connection>> + Send + 'static {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut admitted = pin!(admitted);
        let mut pending = JoinSet::new();
        loop {
            tokio::select! {
                next = admitted.next() => match next {
                    Some(Ok(connection)) => {
                        pending.spawn(handshake(acceptor.clone(), connection));
                    }
                    Some(Err(err)) => {
                        if tx.send(Err(err)).await.is_err() {
                            return;
                        }
                    }
                    None => return,
                },
                Some(done) = pending.join_next(), if !pending.is_empty() => {
                    if let Ok(Some(tls)) = done
                        && tx.send(Ok(Connection::Tls(Box::new(tls)))).await.is_err()
                    {
                        return;
                    }
                }
                () = tx.closed() => return,
            }
        }
    });
    ReceiverStream::new(rx)
}

async fn handshake(acceptor: TlsAcceptor, connection: Admitted) -> Option<TlsStream<Admitted>> {
    let peer = connection.peer();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(connection)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(err)) => {
            tracing::debug!(%peer, %err, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake took too long; closing");
            None
        }
    }
}

macro_rules! delegate {
    ($self:ident, $io:ident => $call:expr) => {
        match $self.get_mut() {
            Connection::Plain($io) => {
                let $io = Pin::new($io);
                $call
            }
            Connection::Tls($io) => {
                let $io = Pin::new($io.as_mut());
                $call
            }
        }
    };
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        delegate!(self, io => io.poll_read(cx, buf))
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, io => io.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, io => io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, io => io.poll_shutdown(cx))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, io => io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(io) => io.is_write_vectored(),
            Self::Tls(io) => io.is_write_vectored(),
        }
    }
}

#[cfg(test)]
mod tests;
