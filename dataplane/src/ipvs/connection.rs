//! A blocking netlink socket that sends one request at a time and collects the kernel's replies
//! to it: the transport both the IPVS client (generic netlink) and the `kube-ipvs0` interface
//! (rtnetlink) speak through. Call it from `spawn_blocking` in async code.

use super::netlink::{self, Attributes, DecodeError, Progress};
use socket2::{Domain, Protocol, Socket, Type};
use std::fmt;
use std::io::{self, Read};
use std::time::Duration;

/// `AF_NETLINK` (`linux/socket.h`).
const AF_NETLINK: i32 = 16;
/// Large enough for any datagram the kernel sends: it sizes dump parts to at most 32 KiB.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// How long a reply may take; the kernel answers at once, so hitting this means it never will.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an exchange with the kernel failed; the caller names the operation.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    /// Opening, sending or receiving on the socket failed.
    #[error("netlink socket: {action}")]
    Socket {
        /// What was being done.
        action: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer within [`REPLY_TIMEOUT`].
    #[error("no reply from the kernel within {REPLY_TIMEOUT:?}")]
    NoReply,
    /// The kernel refused the request.
    #[error("{text} ({0})", text = .0.text())]
    Refused(Errno),
    /// The kernel's reply could not be read.
    #[error("unreadable reply")]
    Decode(#[source] DecodeError),
}

/// An errno from the kernel (positive), shown with its name (`ENOENT`) and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// No such file or directory.
    pub const ENOENT: Self = Self(2);
    /// No such process.
    pub const ESRCH: Self = Self(3);
    /// File exists.
    pub const EEXIST: Self = Self(17);
    /// No such device.
    pub const ENODEV: Self = Self(19);
    /// Cannot assign requested address.
    pub const EADDRNOTAVAIL: Self = Self(99);

    /// The errno's symbolic name, for those netlink, IPVS and rtnetlink return.
    #[must_use]
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            1 => "EPERM",
            2 => "ENOENT",
            3 => "ESRCH",
            12 => "ENOMEM",
            13 => "EACCES",
            14 => "EFAULT",
            16 => "EBUSY",
            17 => "EEXIST",
            19 => "ENODEV",
            22 => "EINVAL",
            34 => "ERANGE",
            90 => "EMSGSIZE",
            93 => "EPROTONOSUPPORT",
            95 => "EOPNOTSUPP",
            97 => "EAFNOSUPPORT",
            99 => "EADDRNOTAVAIL",
            _ => return None,
        })
    }

    /// The system's text for it, without the number ("Invalid argument"): [`fmt::Display`]
    /// shows the number with the name.
    #[must_use]
    pub fn text(self) -> String {
        let text = io::Error::from_raw_os_error(self.0).to_string();
        text.split(" (os error")
            .next()
            .unwrap_or_default()
            .to_owned()
    }
}

impl fmt::Display for Errno {
    /// `EEXIST, errno 17`, or `errno 4095` for one without a name here.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}, errno {}", self.0),
            None => write!(f, "errno {}", self.0),
        }
    }
}

/// A netlink socket of one protocol (`NETLINK_GENERIC`, `NETLINK_ROUTE`).
pub struct Connection {
    socket: Socket,
    /// The last sequence number used.
    seq: u32,
    buffer: Vec<u8>,
}

impl fmt::Debug for Connection {
    /// Without the receive buffer's 64 KiB.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("socket", &self.socket)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Opens a socket of netlink `protocol`, bound on first use.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Socket`] when the socket cannot be opened or configured.
    pub fn open(protocol: i32) -> Result<Self, ExchangeError> {
        let socket = Socket::new(
            Domain::from(AF_NETLINK),
            Type::RAW,
            Some(Protocol::from(protocol)),
        )
        .map_err(|source| ExchangeError::Socket {
            action: "opening",
            source,
        })?;
        socket
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|source| ExchangeError::Socket {
                action: "setting the reply timeout",
                source,
            })?;
        Ok(Self {
            socket,
            seq: 0,
            buffer: vec![0; RECEIVE_BUFFER],
        })
    }

    /// The sequence number of the next request.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `request` (sequence number `seq`) and reads the replies to it, whose fixed headers
    /// are `header_len` bytes long: every message decoded with `decode`, until the
    /// acknowledgement, the end of a dump, or the single message of a plain request. Replies to
    /// earlier requests (one that timed out) are skipped.
    ///
    /// # Errors
    ///
    /// When sending or receiving fails, no reply comes, the kernel refuses, or a reply cannot be
    /// read.
    pub fn exchange<T>(
        &mut self,
        request: &[u8],
        seq: u32,
        header_len: usize,
        mut decode: impl FnMut(&[u8], Attributes<'_>) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, ExchangeError> {
        // With no address, a netlink socket sends to the kernel, and binds itself on first use.
        self.socket
            .send(request)
            .map_err(|source| ExchangeError::Socket {
                action: "sending",
                source,
            })?;
        let mut decoded = Vec::new();
        loop {
            let len = match (&self.socket).read(&mut self.buffer) {
                Ok(len) => len,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ExchangeError::NoReply);
                }
                Err(source) => {
                    return Err(ExchangeError::Socket {
                        action: "receiving",
                        source,
                    });
                }
            };
            let progress = netlink::collect(
                &self.buffer[..len],
                seq,
                header_len,
                &mut decode,
                &mut decoded,
            )
            .map_err(ExchangeError::Decode)?;
            match progress {
                Progress::Pending => {}
                Progress::Finished => return Ok(decoded),
                Progress::Refused(errno) => return Err(ExchangeError::Refused(Errno(errno))),
            }
        }
    }
}
