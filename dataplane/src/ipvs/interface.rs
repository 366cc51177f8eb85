//! The dummy interface kube-proxy's IPVS mode binds Service addresses to (`kube-ipvs0`), over
//! rtnetlink (no `ip` binary): found or created, and its addresses listed, added and deleted.
//!
//! An address on the interface makes the kernel take packets to it as local, which is what lets
//! IPVS (hooked at LOCAL_IN) see them. As upstream, the interface is left down: the kernel adds
//! the local route of an IPv4 address whatever the link's state, and a dummy link has no ARP, so
//! IPv6 addresses skip duplicate address detection too; IPv6 ones are added with `IFA_F_NODAD`
//! all the same, so they never wait in the tentative state.
//!
//! The messages are pure functions (`rtnetlink.h`, `if_link.h`, `if_addr.h`), unit-tested;
//! [`DummyInterface`] sends them through a [`Connection`].

use super::connection::{Connection, Errno, ExchangeError};
use super::netlink::{Attributes, DecodeError, NLM_F_ACK, NLM_F_DUMP, Request, fixed};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The `NETLINK_ROUTE` protocol (`linux/netlink.h`).
const NETLINK_ROUTE: i32 = 0;

// Message types (`RTM_*`).
const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;

// Flags of new objects (`NLM_F_CREATE`, `NLM_F_EXCL`).
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;

/// `struct ifinfomsg`: family, padding, type, index, flags, change mask.
const IFINFOMSG_LEN: usize = 16;
/// `struct ifaddrmsg`: family, prefix length, flags, scope, index.
const IFADDRMSG_LEN: usize = 8;

// Link attributes (`IFLA_*`) and the nested link info's kind.
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;

// Address attributes (`IFA_*`) and flags.
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_F_NODAD: u8 = 0x02;

const AF_UNSPEC: u8 = 0;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;

/// Why an operation on the interface failed.
#[derive(Debug, thiserror::Error)]
#[error("{operation}")]
pub struct Error {
    /// What was asked, with the interface or address it was about.
    pub operation: String,
    /// What went wrong.
    #[source]
    pub source: ExchangeError,
}

/// `pub type Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The request for the link named `name` (`RTM_GETLINK`); the kernel answers with one
/// `RTM_NEWLINK`, or `ENODEV` when there is none.
#[must_use]
pub fn link_request(seq: u32, name: &str) -> Vec<u8> {
    let mut request = Request::with_header(RTM_GETLINK, 0, seq, &[0; IFINFOMSG_LEN]);
    request.put_str(IFLA_IFNAME, name);
    request.finish()
}

/// The request that creates a dummy link named `name`, refused with `EEXIST` when a link of that
/// name exists.
#[must_use]
pub fn create_dummy_request(seq: u32, name: &str) -> Vec<u8> {
    let flags = NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK;
    let mut request = Request::with_header(RTM_NEWLINK, flags, seq, &[0; IFINFOMSG_LEN]);
    request.put_str(IFLA_IFNAME, name);
    request.begin_nested(IFLA_LINKINFO);
    request.put_str(IFLA_INFO_KIND, "dummy");
    request.end_nested();
    request.finish()
}

/// The link index in the `ifinfomsg` of an `RTM_NEWLINK`.
///
/// # Errors
///
/// If the header is not an `ifinfomsg`.
pub fn decode_link_index(header: &[u8]) -> Result<u32, DecodeError> {
    let header: [u8; IFINFOMSG_LEN] = fixed(header, "ifinfomsg")?;
    Ok(u32::from_ne_bytes([
        header[4], header[5], header[6], header[7],
    ]))
}

/// Adds or deletes an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressChange {
    /// `RTM_NEWADDR`, refused with `EEXIST` when the interface has the address.
    Add,
    /// `RTM_DELADDR`, refused with `EADDRNOTAVAIL` when it does not.
    Delete,
}

/// The request that adds `ip` to link `index` as a host address (`/32`, `/128`), or deletes it.
#[must_use]
pub fn address_request(seq: u32, change: AddressChange, index: u32, ip: IpAddr) -> Vec<u8> {
    let (kind, flags) = match change {
        AddressChange::Add => (RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK),
        AddressChange::Delete => (RTM_DELADDR, NLM_F_ACK),
    };
    let (family, prefix, address_flags, octets) = match ip {
        IpAddr::V4(v4) => (AF_INET, 32, 0, v4.octets().to_vec()),
        IpAddr::V6(v6) => (AF_INET6, 128, IFA_F_NODAD, v6.octets().to_vec()),
    };
    let index = index.to_ne_bytes();
    // Scope 0 (`RT_SCOPE_UNIVERSE`), as `ip addr add` gives a non-loopback address.
    let header = [
        family,
        prefix,
        address_flags,
        0,
        index[0],
        index[1],
        index[2],
        index[3],
    ];
    let mut request = Request::with_header(kind, flags, seq, &header);
    // The same local and peer address: a host address, as `ip addr add` sends one.
    request.put(IFA_LOCAL, &octets).put(IFA_ADDRESS, &octets);
    request.finish()
}

/// The dump of every address of every link, both families.
#[must_use]
pub fn list_addresses_request(seq: u32) -> Vec<u8> {
    let header = [AF_UNSPEC, 0, 0, 0, 0, 0, 0, 0];
    Request::with_header(RTM_GETADDR, NLM_F_DUMP, seq, &header).finish()
}

/// One address of an `RTM_NEWADDR` dump part: the link's index and the address, `None` for a
/// family other than IPv4 and IPv6.
///
/// # Errors
///
/// If the header is not an `ifaddrmsg`, or the address attribute is missing or malformed.
pub fn decode_address(
    header: &[u8],
    attributes: Attributes<'_>,
) -> Result<Option<(u32, IpAddr)>, DecodeError> {
    let header: [u8; IFADDRMSG_LEN] = fixed(header, "ifaddrmsg")?;
    let index = u32::from_ne_bytes([header[4], header[5], header[6], header[7]]);
    let address = match header[0] {
        // IFA_ADDRESS is the peer's on a point-to-point link; IFA_LOCAL is always the own one.
        AF_INET => {
            let local = match attributes.find(IFA_LOCAL)? {
                Some(local) => local,
                None => attributes.require(IFA_ADDRESS, "IFA_ADDRESS")?,
            };
            IpAddr::from(Ipv4Addr::from(fixed::<4>(local, "IFA_LOCAL")?))
        }
        AF_INET6 => {
            let address = attributes.require(IFA_ADDRESS, "IFA_ADDRESS")?;
            IpAddr::from(Ipv6Addr::from(fixed::<16>(address, "IFA_ADDRESS")?))
        }
        _ => return Ok(None),
    };
    Ok(Some((index, address)))
}

/// A dummy interface, found or created, over an rtnetlink socket of its own.
#[derive(Debug)]
pub struct DummyInterface {
    connection: Connection,
    name: String,
    index: u32,
}

impl DummyInterface {
    /// The interface `name`, created as a dummy (and left down) when there is none. An existing
    /// link of that name is used whatever its kind, as upstream.
    ///
    /// # Errors
    ///
    /// When the socket cannot be opened, or the kernel refuses to list or create the link
    /// (`EPERM` without `CAP_NET_ADMIN`; `EOPNOTSUPP` when the `dummy` module cannot be loaded).
    pub fn ensure(name: &str) -> Result<Self> {
        let connection = Connection::open(NETLINK_ROUTE).map_err(|source| Error {
            operation: "opening an rtnetlink socket".to_owned(),
            source,
        })?;
        let mut interface = Self {
            connection,
            name: name.to_owned(),
            index: 0,
        };
        interface.index = match interface.find() {
            Ok(index) => index,
            Err(Error {
                source: ExchangeError::Refused(Errno::ENODEV),
                ..
            }) => {
                match interface.create() {
                    // Someone created it in between: use theirs.
                    Ok(())
                    | Err(Error {
                        source: ExchangeError::Refused(Errno::EEXIST),
                        ..
                    }) => {}
                    Err(e) => return Err(e),
                }
                tracing::info!(interface = name, "created the dummy interface");
                interface.find()?
            }
            Err(e) => return Err(e),
        };
        Ok(interface)
    }

    /// The interface's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The addresses bound to the interface, both families.
    ///
    /// # Errors
    ///
    /// When the kernel refuses the dump or its reply is unreadable.
    pub fn addresses(&mut self) -> Result<BTreeSet<IpAddr>> {
        let seq = self.connection.next_seq();
        let request = list_addresses_request(seq);
        let listed = self
            .connection
            .exchange(&request, seq, IFADDRMSG_LEN, decode_address)
            .map_err(|source| self.error("listing the addresses of", source))?;
        Ok(listed
            .into_iter()
            .flatten()
            .filter(|(index, _)| *index == self.index)
            .map(|(_, address)| address)
            .collect())
    }

    /// Binds `ip` to the interface; one already bound is left as it is.
    ///
    /// # Errors
    ///
    /// When the kernel refuses.
    pub fn bind(&mut self, ip: IpAddr) -> Result<()> {
        self.change(AddressChange::Add, ip, Errno::EEXIST)
    }

    /// Unbinds `ip` from the interface; one not bound is not an error.
    ///
    /// # Errors
    ///
    /// When the kernel refuses.
    pub fn unbind(&mut self, ip: IpAddr) -> Result<()> {
        self.change(AddressChange::Delete, ip, Errno::EADDRNOTAVAIL)
    }

    /// Sends `change` for `ip`, taking the refusal `already` as done.
    fn change(&mut self, change: AddressChange, ip: IpAddr, already: Errno) -> Result<()> {
        let seq = self.connection.next_seq();
        let request = address_request(seq, change, self.index, ip);
        match self
            .connection
            .exchange(&request, seq, IFADDRMSG_LEN, |_, _| Ok(()))
        {
            Ok(_) => Ok(()),
            Err(ExchangeError::Refused(errno)) if errno == already => Ok(()),
            Err(source) => {
                let verb = match change {
                    AddressChange::Add => format!("binding {ip} to"),
                    AddressChange::Delete => format!("unbinding {ip} from"),
                };
                Err(self.error(&verb, source))
            }
        }
    }

    /// The index of the link named as the interface.
    fn find(&mut self) -> Result<u32> {
        let seq = self.connection.next_seq();
        let request = link_request(seq, &self.name);
        let indexes = self
            .connection
            .exchange(&request, seq, IFINFOMSG_LEN, |header, _| {
                decode_link_index(header)
            })
            .map_err(|source| self.error("looking up", source))?;
        indexes
            .into_iter()
            .next()
            .ok_or_else(|| self.error("looking up", ExchangeError::Refused(Errno::ENODEV)))
    }

    /// Creates the interface as a dummy link.
    fn create(&mut self) -> Result<()> {
        let seq = self.connection.next_seq();
        let request = create_dummy_request(seq, &self.name);
        self.connection
            .exchange(&request, seq, IFINFOMSG_LEN, |_, _| Ok(()))
            .map(drop)
            .map_err(|source| self.error("creating the dummy interface", source))
    }

    fn error(&self, operation: &str, source: ExchangeError) -> Error {
        Error {
            operation: format!("{operation} {}", self.name),
            source,
        }
    }
}

#[cfg(test)]
mod tests;
