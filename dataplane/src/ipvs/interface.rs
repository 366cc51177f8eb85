//! The dummy interface kube-proxy's IPVS mode binds Service addresses to (`kube-ipvs0`), over
//! rtnetlink (no `ip` binary): found or created, and its addresses listed, added and deleted.
//!
//! An address on the interface makes the kernel take packets to it as local, which is what lets
//! IPVS (hooked at LOCAL_IN) see them. As upstream, the interface is left down: the kernel adds
//! the local route of an IPv4 address whatever the link's state, and a dummy link has no ARP, so
//! IPv6 addresses skip duplicate address detection too; IPv6 ones are added with `IFA_F_NODAD`
//! all the same, so they never wait in the tentative state.
//!
//! The messages are netlink-packet-route's, built by pure functions (unit-tested);
//! [`DummyInterface`] sends them through a [`Connection`].

use super::connection::{Connection, DecodeError, Errno, ExchangeError};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NetlinkDeserializable, NetlinkHeader,
    NetlinkMessage, Parseable,
};
use netlink_packet_route::address::{
    AddressAttribute, AddressHeader, AddressHeaderFlags, AddressMessage, AddressScope,
};
use netlink_packet_route::link::{InfoKind, LinkAttribute, LinkInfo, LinkMessage};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use std::collections::BTreeSet;
use std::net::IpAddr;

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

/// An rtnetlink request with `flags` besides `NLM_F_REQUEST`.
fn request(flags: u16, message: RouteNetlinkMessage) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut request = NetlinkMessage::from(message);
    request.header.flags = flags;
    request
}

/// A link message carrying only the link's name.
fn named_link(name: &str) -> LinkMessage {
    let mut link = LinkMessage::default();
    link.attributes.push(LinkAttribute::IfName(name.to_owned()));
    link
}

/// The request for the link named `name` (`RTM_GETLINK`); the kernel answers with one
/// `RTM_NEWLINK`, or `ENODEV` when there is none.
#[must_use]
pub fn link_request(name: &str) -> NetlinkMessage<RouteNetlinkMessage> {
    request(0, RouteNetlinkMessage::GetLink(named_link(name)))
}

/// The request that creates a dummy link named `name`, refused with `EEXIST` when a link of that
/// name exists.
#[must_use]
pub fn create_dummy_request(name: &str) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut link = named_link(name);
    link.attributes
        .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
            InfoKind::Dummy,
        )]));
    request(
        NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
        RouteNetlinkMessage::NewLink(link),
    )
}

/// The link index of the kernel's answer to [`link_request`].
///
/// # Errors
///
/// If the answer is not an `RTM_NEWLINK`.
pub fn decode_link_index(reply: RouteNetlinkMessage) -> Result<u32, DecodeError> {
    match reply {
        RouteNetlinkMessage::NewLink(link) => Ok(link.header.index),
        other => Err(DecodeError::Invalid {
            name: "ifinfomsg",
            reason: format!("expected RTM_NEWLINK, got {other:?}"),
        }),
    }
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
pub fn address_request(
    change: AddressChange,
    index: u32,
    ip: IpAddr,
) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut address = AddressMessage::default();
    address.header = match ip {
        IpAddr::V4(_) => AddressHeader {
            family: AddressFamily::Inet,
            prefix_len: 32,
            flags: AddressHeaderFlags::empty(),
            // As `ip addr add` gives a non-loopback address.
            scope: AddressScope::Universe,
            index,
        },
        IpAddr::V6(_) => AddressHeader {
            family: AddressFamily::Inet6,
            prefix_len: 128,
            flags: AddressHeaderFlags::Nodad,
            scope: AddressScope::Universe,
            index,
        },
    };
    // The same local and peer address: a host address, as `ip addr add` sends one.
    address.attributes = vec![AddressAttribute::Local(ip), AddressAttribute::Address(ip)];
    match change {
        AddressChange::Add => request(
            NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK,
            RouteNetlinkMessage::NewAddress(address),
        ),
        AddressChange::Delete => request(NLM_F_ACK, RouteNetlinkMessage::DelAddress(address)),
    }
}

/// The dump of every address of every link, both families.
#[must_use]
pub fn list_addresses_request() -> NetlinkMessage<RouteNetlinkMessage> {
    request(
        NLM_F_DUMP,
        RouteNetlinkMessage::GetAddress(AddressMessage::default()),
    )
}

/// One message of the address dump: an IPv4 or IPv6 address, or `None` for an address of
/// another family (MCTP, Phonet, …), whose attributes are left unread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedAddress(pub Option<AddressMessage>);

impl NetlinkDeserializable for ListedAddress {
    type Error = netlink_packet_core::DecodeError;

    fn deserialize(_: &NetlinkHeader, payload: &[u8]) -> Result<Self, Self::Error> {
        Ok(Self(match AddressHeader::parse(payload)?.family {
            AddressFamily::Inet | AddressFamily::Inet6 => Some(AddressMessage::parse(payload)?),
            _ => None,
        }))
    }
}

/// The link's index and the address of one message of the address dump; `None` for a family
/// other than IPv4 and IPv6.
///
/// # Errors
///
/// If the address attribute is missing.
pub fn decode_address(listed: ListedAddress) -> Result<Option<(u32, IpAddr)>, DecodeError> {
    let Some(message) = listed.0 else {
        return Ok(None);
    };
    let attribute =
        |pick: fn(&AddressAttribute) -> Option<IpAddr>| message.attributes.iter().find_map(pick);
    let local = attribute(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let address = attribute(|a| match a {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    });
    let ip = match message.header.family {
        // IFA_ADDRESS is the peer's on a point-to-point link; IFA_LOCAL is always the own one.
        AddressFamily::Inet => local.or(address),
        _ => address,
    };
    let ip = ip.ok_or(DecodeError::Missing {
        name: "IFA_ADDRESS",
    })?;
    Ok(Some((message.header.index, ip)))
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
        let connection =
            Connection::open(netlink_sys::protocols::NETLINK_ROUTE).map_err(|source| Error {
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
        let listed = self
            .connection
            .exchange(list_addresses_request(), decode_address)
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
        let request = address_request(change, self.index, ip);
        match self
            .connection
            .exchange(request, |_: RouteNetlinkMessage| Ok(()))
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
        let indexes = self
            .connection
            .exchange(link_request(&self.name), decode_link_index)
            .map_err(|source| self.error("looking up", source))?;
        indexes
            .into_iter()
            .next()
            .ok_or_else(|| self.error("looking up", ExchangeError::Refused(Errno::ENODEV)))
    }

    /// Creates the interface as a dummy link.
    fn create(&mut self) -> Result<()> {
        self.connection
            .exchange(
                create_dummy_request(&self.name),
                |_: RouteNetlinkMessage| Ok(()),
            )
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
