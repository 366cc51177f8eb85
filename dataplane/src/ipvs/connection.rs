//! A blocking netlink socket (netlink-sys) that sends one request at a time and collects the
//! kernel's replies to it (framed by netlink-packet-core): the transport both the IPVS client
//! (generic netlink) and the `kube-ipvs0` interface (rtnetlink) speak through. Call it from
//! `spawn_blocking` in async code.

use netlink_packet_core::{
    NLM_F_MULTIPART, NLM_F_REQUEST, NetlinkBuffer, NetlinkDeserializable, NetlinkMessage,
    NetlinkPayload, NetlinkSerializable, Parseable,
};
use netlink_sys::Socket;
use socket2::SockRef;
use std::fmt;
use std::io;
use std::time::Duration;

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

/// Why a kernel reply could not be read. Never a panic: the bytes come from outside.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The netlink framing or an attribute is broken, as netlink-packet-core reads it.
    #[error("{0}")]
    Framing(String),
    /// An attribute the kernel must send is missing.
    #[error("attribute {name} is missing")]
    Missing {
        /// The attribute's UAPI name.
        name: &'static str,
    },
    /// An attribute has an invalid value.
    #[error("attribute {name} is invalid: {reason}")]
    Invalid {
        /// The attribute's UAPI name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl From<netlink_packet_core::DecodeError> for DecodeError {
    fn from(e: netlink_packet_core::DecodeError) -> Self {
        Self::Framing(e.to_string())
    }
}

/// Where the replies to a request stand after one more datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More is to come: the rest of a dump, or the acknowledgement.
    Pending,
    /// The acknowledgement, the end of the dump, or the single message of a plain request came.
    Finished,
    /// The kernel refused the request with this errno (positive).
    Refused(i32),
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

    /// The errno's symbolic name (`ENOENT`); `None` for a number Linux does not define.
    #[must_use]
    pub fn name(self) -> Option<String> {
        let known = nix::errno::Errno::from_raw(self.0);
        (known != nix::errno::Errno::UnknownErrno).then(|| format!("{known:?}"))
    }

    /// The system's text for it ("Invalid argument"): [`fmt::Display`] shows the number with
    /// the name.
    #[must_use]
    pub fn text(self) -> &'static str {
        nix::errno::Errno::from_raw(self.0).desc()
    }
}

impl fmt::Display for Errno {
    /// `EEXIST, errno 17`, or `errno 4095` for one without a name.
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
    /// Opens a socket of netlink `protocol` (`netlink_sys::protocols`), bound on first use.
    ///
    /// # Errors
    ///
    /// [`ExchangeError::Socket`] when the socket cannot be opened or configured.
    pub fn open(protocol: isize) -> Result<Self, ExchangeError> {
        let socket = Socket::new(protocol).map_err(|source| ExchangeError::Socket {
            action: "opening",
            source,
        })?;
        SockRef::from(&socket)
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
    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `request` with the next sequence number and reads the replies to it: every message
    /// decoded with `decode`, until the acknowledgement, the end of a dump, or the single message
    /// of a plain request. Replies to earlier requests (one that timed out) are skipped.
    ///
    /// # Errors
    ///
    /// When sending or receiving fails, no reply comes, the kernel refuses, or a reply cannot be
    /// read.
    pub fn exchange<Q, R, T>(
        &mut self,
        request: NetlinkMessage<Q>,
        mut decode: impl FnMut(R) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>, ExchangeError>
    where
        Q: NetlinkSerializable,
        R: NetlinkDeserializable,
    {
        let seq = self.next_seq();
        self.send(&serialize(request, seq))?;
        let mut decoded = Vec::new();
        loop {
            let len = self.receive()?;
            let progress = collect(&self.buffer[..len], seq, &mut decode, &mut decoded)
                .map_err(ExchangeError::Decode)?;
            match progress {
                Progress::Pending => {}
                Progress::Finished => return Ok(decoded),
                Progress::Refused(errno) => return Err(ExchangeError::Refused(Errno(errno))),
            }
        }
    }

    fn send(&self, request: &[u8]) -> Result<(), ExchangeError> {
        // With no address, a netlink socket sends to the kernel, and binds itself on first use.
        self.socket
            .send(request, 0)
            .map(drop)
            .map_err(|source| ExchangeError::Socket {
                action: "sending",
                source,
            })
    }

    /// Reads one datagram into the buffer; its length.
    fn receive(&mut self) -> Result<usize, ExchangeError> {
        loop {
            match self.socket.recv(&mut &mut self.buffer[..], 0) {
                Ok(len) => return Ok(len.min(self.buffer.len())),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
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
            }
        }
    }
}

/// `request` as sent with sequence number `seq`: `NLM_F_REQUEST` added, its length and type
/// filled in. The port id is left 0: the kernel fills it in.
#[must_use]
pub fn serialize<Q: NetlinkSerializable>(mut request: NetlinkMessage<Q>, seq: u32) -> Vec<u8> {
    request.header.flags |= NLM_F_REQUEST;
    request.header.sequence_number = seq;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    bytes
}

/// Reads one datagram of replies to request `seq`: decodes its messages of the protocol with
/// `decode` into `decoded`, and says whether they are complete. Messages for other sequence
/// numbers (replies to an earlier request that timed out) are skipped unread.
///
/// # Errors
///
/// If the datagram's framing is broken, or a message for `seq` cannot be read.
pub fn collect<R: NetlinkDeserializable, T>(
    datagram: &[u8],
    seq: u32,
    decode: &mut impl FnMut(R) -> Result<T, DecodeError>,
    decoded: &mut Vec<T>,
) -> Result<Progress, DecodeError> {
    let mut progress = Progress::Pending;
    let mut offset = 0;
    while let Some(rest) = datagram.get(offset..).filter(|rest| !rest.is_empty()) {
        let buffer = NetlinkBuffer::new_checked(&rest)?;
        // At least a header and at most the rest, as `new_checked` made sure; padded to 4 bytes.
        offset += usize::try_from(buffer.length())
            .unwrap_or(usize::MAX)
            .next_multiple_of(4);
        if buffer.sequence_number() != seq {
            continue;
        }
        let message = NetlinkMessage::<R>::parse(&buffer)?;
        match message.payload {
            NetlinkPayload::InnerMessage(inner) => {
                decoded.push(decode(inner)?);
                if message.header.flags & NLM_F_MULTIPART == 0 {
                    progress = Progress::Finished;
                }
            }
            NetlinkPayload::Error(error) => match error.code {
                Some(code) => return Ok(Progress::Refused(code.get().saturating_neg())),
                None => progress = Progress::Finished,
            },
            NetlinkPayload::Done(done) if done.code < 0 => {
                return Ok(Progress::Refused(done.code.saturating_neg()));
            }
            NetlinkPayload::Done(_) => progress = Progress::Finished,
            _ => {}
        }
    }
    Ok(progress)
}

#[cfg(test)]
pub(crate) mod tests;
