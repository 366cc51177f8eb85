//! Netlink framing, pure: requests written as `nlmsghdr` + the protocol's fixed header +
//! attributes, and kernel replies split into messages and attributes without trusting a single
//! length in them.
//!
//! The fixed header is the protocol's: `genlmsghdr` for generic netlink (IPVS), `ifinfomsg` or
//! `ifaddrmsg` for rtnetlink (links and addresses). Layouts per `include/uapi/linux/netlink.h`,
//! `genetlink.h` and `rtnetlink.h`: headers in host byte order, every message and attribute padded
//! to 4 bytes.

use std::fmt;

/// `NLM_F_REQUEST`: every message to the kernel.
pub const NLM_F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`: one part of a multipart reply, which ends with `NLMSG_DONE`.
pub const NLM_F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`: asks for an `NLMSG_ERROR` with 0 on success.
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`NLM_F_ROOT | NLM_F_MATCH`): list every object.
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLA_F_NESTED`: the attribute holds attributes.
pub const NLA_F_NESTED: u16 = 0x8000;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
/// Message types below this are netlink's own (`NLMSG_NOOP`, `NLMSG_OVERRUN`, …).
const NLMSG_MIN_TYPE: u16 = 0x10;
/// `NLA_TYPE_MASK`: the type without `NLA_F_NESTED` and `NLA_F_NET_BYTEORDER`.
const NLA_TYPE_MASK: u16 = 0x3fff;

const NLMSG_HDRLEN: usize = 16;
/// The length of `genlmsghdr`, generic netlink's fixed header (command, version, reserved).
pub const GENL_HDRLEN: usize = 4;
const NLA_HDRLEN: usize = 4;

/// Rounds `len` up to netlink's 4-byte alignment.
const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// Why a kernel reply could not be read. Never a panic: the bytes come from outside.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The netlink framing is broken, as netlink-packet-core reads it.
    #[error("{0}")]
    Framing(String),
    /// A header or attribute claims more bytes than there are, or fewer than its own header.
    #[error("{what} at byte {offset} claims {claimed} bytes, {available} available")]
    BadLength {
        /// What was being read (`message`, `attribute`, …).
        what: &'static str,
        /// Where it starts in the buffer being read.
        offset: usize,
        /// The length it claims.
        claimed: usize,
        /// What is left from `offset`.
        available: usize,
    },
    /// An attribute the kernel must send is missing.
    #[error("attribute {name} is missing")]
    Missing {
        /// The attribute's UAPI name.
        name: &'static str,
    },
    /// An attribute has the wrong size or an invalid value.
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

/// A request being written: `nlmsghdr`, the protocol's fixed header, then attributes.
#[derive(Debug, Clone)]
pub struct Request {
    bytes: Vec<u8>,
    /// Start offsets of the nested attributes still open.
    open: Vec<usize>,
}

impl Request {
    /// A generic netlink request to `family` running `command` (of `version`), with `flags`
    /// besides `NLM_F_REQUEST` and sequence number `seq`.
    #[must_use]
    pub fn new(family: u16, flags: u16, seq: u32, command: u8, version: u8) -> Self {
        Self::with_header(family, flags, seq, &[command, version, 0, 0])
    }

    /// A request of message type `kind` with `flags` besides `NLM_F_REQUEST`, sequence number
    /// `seq` and the protocol's fixed `header` (padded to 4 bytes). The port id is left 0: the
    /// kernel fills it in.
    #[must_use]
    pub fn with_header(kind: u16, flags: u16, seq: u32, header: &[u8]) -> Self {
        let mut bytes = Vec::with_capacity(128);
        bytes.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `finish`
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        bytes.extend_from_slice(&seq.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(header);
        let mut request = Self {
            bytes,
            open: Vec::new(),
        };
        request.pad();
        request
    }

    /// Appends attribute `kind` holding `payload`, padded to 4 bytes.
    pub fn put(&mut self, kind: u16, payload: &[u8]) -> &mut Self {
        let len = NLA_HDRLEN + payload.len();
        self.bytes
            .extend_from_slice(&attribute_len(len).to_ne_bytes());
        self.bytes.extend_from_slice(&kind.to_ne_bytes());
        self.bytes.extend_from_slice(payload);
        self.pad();
        self
    }

    /// Appends a `u16` attribute in host byte order.
    pub fn put_u16(&mut self, kind: u16, value: u16) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    /// Appends a `u32` attribute in host byte order.
    pub fn put_u32(&mut self, kind: u16, value: u32) -> &mut Self {
        self.put(kind, &value.to_ne_bytes())
    }

    /// Appends a NUL-terminated string attribute.
    pub fn put_str(&mut self, kind: u16, value: &str) -> &mut Self {
        let mut payload = Vec::with_capacity(value.len() + 1);
        payload.extend_from_slice(value.as_bytes());
        payload.push(0);
        self.put(kind, &payload)
    }

    /// Opens nested attribute `kind` (with `NLA_F_NESTED`); what follows goes inside it until
    /// [`Self::end_nested`].
    pub fn begin_nested(&mut self, kind: u16) -> &mut Self {
        self.open.push(self.bytes.len());
        self.bytes.extend_from_slice(&0u16.to_ne_bytes()); // length, set by `end_nested`
        self.bytes
            .extend_from_slice(&(kind | NLA_F_NESTED).to_ne_bytes());
        self
    }

    /// Closes the innermost nested attribute.
    pub fn end_nested(&mut self) -> &mut Self {
        if let Some(start) = self.open.pop() {
            let len = attribute_len(self.bytes.len() - start);
            self.bytes[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The message's bytes, with its length filled in and any nested attribute still open closed.
    #[must_use]
    pub fn finish(mut self) -> Vec<u8> {
        while !self.open.is_empty() {
            self.end_nested();
        }
        let len = u32::try_from(self.bytes.len()).unwrap_or(u32::MAX);
        self.bytes[..4].copy_from_slice(&len.to_ne_bytes());
        self.bytes
    }

    fn pad(&mut self) {
        self.bytes.resize(align(self.bytes.len()), 0);
    }
}

/// An attribute's `nla_len`. Requests are built from a handful of small attributes, far below
/// the 64 KiB an attribute can hold, so this saturates rather than fails.
fn attribute_len(len: usize) -> u16 {
    u16::try_from(len).unwrap_or(u16::MAX)
}

/// One message of a kernel reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// A message of the protocol: its fixed header and attributes.
    Message {
        /// The header's flags (`NLM_F_MULTI` in dumps).
        flags: u16,
        /// The sequence number of the request it answers.
        seq: u32,
        /// The protocol's fixed header (`genlmsghdr`, `ifaddrmsg`, …), as long as asked for.
        header: &'a [u8],
        /// The attributes after the headers.
        attributes: Attributes<'a>,
    },
    /// `NLMSG_ERROR`: 0 acknowledges the request, a negative errno refuses it.
    Error {
        /// The sequence number of the request it answers.
        seq: u32,
        /// 0 or a negative errno.
        code: i32,
    },
    /// `NLMSG_DONE`: the end of a dump, with 0 or a negative errno.
    Done {
        /// The sequence number of the request it answers.
        seq: u32,
        /// 0 or a negative errno.
        code: i32,
    },
    /// A message of netlink's own that needs no action (`NLMSG_NOOP`).
    Other,
}

/// Splits one datagram from the kernel into its messages, whose fixed headers are `header_len`
/// bytes long ([`GENL_HDRLEN`] for generic netlink).
///
/// # Errors
///
/// If a header claims more bytes than the datagram has, or a message is too short for its
/// headers.
pub fn replies(datagram: &[u8], header_len: usize) -> Result<Vec<Reply<'_>>, DecodeError> {
    let mut replies = Vec::new();
    for (offset, message) in records(datagram, NLMSG_HDRLEN, "message", |m| usize_at(m, 0))? {
        let kind = u16_at(message, 4);
        let flags = u16_at(message, 6);
        let seq = u32_at(message, 8);
        let body = &message[NLMSG_HDRLEN..];
        let short = |needed: usize| DecodeError::BadLength {
            what: "message",
            offset,
            claimed: message.len(),
            available: NLMSG_HDRLEN + needed,
        };
        replies.push(match kind {
            NLMSG_ERROR | NLMSG_DONE => {
                let code = body.get(..4).ok_or_else(|| short(4))?;
                let code = i32::from_ne_bytes([code[0], code[1], code[2], code[3]]);
                if kind == NLMSG_ERROR {
                    Reply::Error { seq, code }
                } else {
                    Reply::Done { seq, code }
                }
            }
            kind if kind < NLMSG_MIN_TYPE => Reply::Other,
            _ => {
                if body.len() < header_len {
                    return Err(short(header_len));
                }
                let (header, attributes) = body.split_at(align(header_len).min(body.len()));
                Reply::Message {
                    flags,
                    seq,
                    header: &header[..header_len],
                    attributes: Attributes(attributes),
                }
            }
        });
    }
    Ok(replies)
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

/// Reads one datagram of replies to request `seq`, whose fixed headers are `header_len` bytes
/// long: decodes its messages with `decode` (given each one's fixed header and attributes) into
/// `decoded`, and says whether they are complete. Replies to other requests (an earlier one that
/// timed out) are skipped.
///
/// # Errors
///
/// If the datagram or a message for `seq` cannot be read.
pub fn collect<'a, T>(
    datagram: &'a [u8],
    seq: u32,
    header_len: usize,
    decode: &mut impl FnMut(&'a [u8], Attributes<'a>) -> Result<T, DecodeError>,
    decoded: &mut Vec<T>,
) -> Result<Progress, DecodeError> {
    let mut progress = Progress::Pending;
    for reply in replies(datagram, header_len)? {
        match reply {
            Reply::Message {
                flags,
                seq: s,
                header,
                attributes,
            } if s == seq => {
                decoded.push(decode(header, attributes)?);
                if flags & NLM_F_MULTI == 0 {
                    progress = Progress::Finished;
                }
            }
            Reply::Error { seq: s, code } | Reply::Done { seq: s, code } if s == seq => {
                if code < 0 {
                    return Ok(Progress::Refused(code.saturating_neg()));
                }
                progress = Progress::Finished;
            }
            _ => {}
        }
    }
    Ok(progress)
}

/// Splits `bytes` into the records that follow each other in it, each starting with a header of
/// `header_len` bytes that holds its length (`len_at` reads it) and padded to 4 bytes: each
/// record's offset and bytes, header included, padding left out.
fn records<'a>(
    bytes: &'a [u8],
    header_len: usize,
    what: &'static str,
    len_at: fn(&[u8]) -> usize,
) -> Result<Vec<(usize, &'a [u8])>, DecodeError> {
    let mut records = Vec::new();
    let mut offset = 0;
    while bytes.len() - offset >= header_len {
        let rest = &bytes[offset..];
        let len = len_at(rest);
        if len < header_len || len > rest.len() {
            return Err(DecodeError::BadLength {
                what,
                offset,
                claimed: len,
                available: rest.len(),
            });
        }
        records.push((offset, &rest[..len]));
        offset += align(len).min(rest.len());
    }
    Ok(records)
}

/// A run of attributes, read lazily.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Attributes<'a>(&'a [u8]);

impl fmt::Debug for Attributes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Attributes({} bytes)", self.0.len())
    }
}

impl<'a> Attributes<'a> {
    /// The attributes in `bytes`.
    #[must_use]
    pub fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// Every attribute as (type without flags, payload).
    ///
    /// # Errors
    ///
    /// If an attribute's length runs past the end or is shorter than its header.
    pub fn all(self) -> Result<Vec<(u16, &'a [u8])>, DecodeError> {
        let attributes = records(self.0, NLA_HDRLEN, "attribute", |a| {
            usize::from(u16_at(a, 0))
        })?;
        Ok(attributes
            .into_iter()
            .map(|(_, a)| (u16_at(a, 2) & NLA_TYPE_MASK, &a[NLA_HDRLEN..]))
            .collect())
    }

    /// The payload of the first attribute of type `kind`, if any.
    ///
    /// # Errors
    ///
    /// As [`Self::all`].
    pub fn find(self, kind: u16) -> Result<Option<&'a [u8]>, DecodeError> {
        Ok(self
            .all()?
            .into_iter()
            .find_map(|(k, payload)| (k == kind).then_some(payload)))
    }

    /// The payload of attribute `kind`, which the kernel always sends.
    ///
    /// # Errors
    ///
    /// As [`Self::all`], or [`DecodeError::Missing`] naming it `name`.
    pub fn require(self, kind: u16, name: &'static str) -> Result<&'a [u8], DecodeError> {
        self.find(kind)?.ok_or(DecodeError::Missing { name })
    }
}

/// A fixed-size payload as an array.
///
/// # Errors
///
/// [`DecodeError::Invalid`] naming `name` when the size differs.
pub fn fixed<const N: usize>(payload: &[u8], name: &'static str) -> Result<[u8; N], DecodeError> {
    payload.try_into().map_err(|_| DecodeError::Invalid {
        name,
        reason: format!("{} bytes, expected {N}", payload.len()),
    })
}

/// A `u16` payload in host byte order.
///
/// # Errors
///
/// When it is not 2 bytes.
pub fn read_u16(payload: &[u8], name: &'static str) -> Result<u16, DecodeError> {
    fixed(payload, name).map(u16::from_ne_bytes)
}

/// A `u32` payload in host byte order.
///
/// # Errors
///
/// When it is not 4 bytes.
pub fn read_u32(payload: &[u8], name: &'static str) -> Result<u32, DecodeError> {
    fixed(payload, name).map(u32::from_ne_bytes)
}

/// A NUL-terminated string payload (the NUL optional).
///
/// # Errors
///
/// When it is not UTF-8.
pub fn read_str<'a>(payload: &'a [u8], name: &'static str) -> Result<&'a str, DecodeError> {
    let text = payload.split(|&b| b == 0).next().unwrap_or_default();
    std::str::from_utf8(text).map_err(|e| DecodeError::Invalid {
        name,
        reason: e.to_string(),
    })
}

// Callers check the buffer holds a full header before reading fields out of it.
fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn usize_at(bytes: &[u8], at: usize) -> usize {
    usize::try_from(u32_at(bytes, at)).unwrap_or(usize::MAX)
}

#[cfg(test)]
pub(crate) mod tests;
