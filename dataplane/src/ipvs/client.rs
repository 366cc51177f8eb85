//! The IPVS client: reads and writes the kernel's virtual and real servers over a blocking
//! generic netlink socket (no ipvsadm). Call it from `spawn_blocking` in async code.

use super::message::{self, Command};
use super::netlink::{self, Attributes, DecodeError, Progress};
use super::{ListedRealServer, RealServer, ServiceId, VirtualServer};
use socket2::{Domain, Protocol, Socket, Type};
use std::fmt;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// `AF_NETLINK` and its `NETLINK_GENERIC` protocol (`linux/netlink.h`).
const AF_NETLINK: i32 = 16;
const NETLINK_GENERIC: i32 = 16;
/// Large enough for any datagram the kernel sends: it sizes dump parts to at most 32 KiB.
const RECEIVE_BUFFER: usize = 64 * 1024;
/// How long a reply may take; the kernel answers at once, so hitting this means it never will.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why an IPVS operation failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be opened, or sending or receiving on it failed.
    #[error("generic netlink socket: {action}")]
    Socket {
        /// What was being done.
        action: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer within the reply timeout.
    #[error("{operation}: no reply from the kernel within {timeout:?}")]
    NoReply {
        /// What was asked.
        operation: String,
        /// How long the client waited.
        timeout: Duration,
    },
    /// The kernel has no `IPVS` generic netlink family: the `ip_vs` module is not loaded and the
    /// kernel could not load it. (The family lookup has the kernel run modprobe for the module's
    /// alias `net-pf-16-proto-16-family-IPVS`; that fails when the module is not installed or
    /// modprobe is missing, as in a container without `/lib/modules`.)
    #[error(
        "the kernel has no IPVS generic netlink family and could not load it: load the ip_vs module"
    )]
    NoIpvs,
    /// The kernel refused the operation.
    #[error("{operation}: {meaning} ({errno})")]
    Refused {
        /// What was asked, with the server it was about.
        operation: String,
        /// What IPVS means by the errno, as ipvsadm would say it.
        meaning: String,
        /// The kernel's errno.
        errno: Errno,
    },
    /// The kernel's reply could not be read.
    #[error("{operation}: unreadable reply")]
    Decode {
        /// What was asked.
        operation: String,
        /// What is wrong with the reply.
        #[source]
        source: DecodeError,
    },
}

/// `pub type Result` of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An errno from the kernel, shown with its name (`ENOENT`) and number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    const ENOENT: Self = Self(2);
    const ESRCH: Self = Self(3);
    const EEXIST: Self = Self(17);

    /// The errno's symbolic name, for those IPVS and netlink return.
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
            _ => return None,
        })
    }

    /// What IPVS means by it in an operation on `subject`: it reuses a few errnos whose
    /// generic text would mislead ("No such process" for a missing virtual server).
    fn meaning(self, subject: Subject) -> String {
        match (self, subject) {
            (Self::ESRCH, _) => "no such virtual server".to_owned(),
            (Self::ENOENT, Subject::RealServer) => "no such real server".to_owned(),
            (Self::ENOENT, Subject::VirtualServer) => {
                "unknown scheduler or persistence engine (is its module available?)".to_owned()
            }
            (Self::EEXIST, _) => "already exists".to_owned(),
            // "Invalid argument (os error 22)": the number is shown with the name already.
            _ => {
                let text = io::Error::from_raw_os_error(self.0).to_string();
                text.split(" (os error")
                    .next()
                    .unwrap_or_default()
                    .to_owned()
            }
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name}, errno {}", self.0),
            None => write!(f, "errno {}", self.0),
        }
    }
}

/// What an operation is about, which decides what an errno means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subject {
    /// A virtual server, or the family lookup.
    VirtualServer,
    /// A real server of a virtual server.
    RealServer,
}

/// A connection to the kernel's IPVS tables.
pub struct Ipvs {
    socket: Socket,
    /// The `IPVS` family's id, which the kernel assigns when the module loads.
    family: u16,
    /// The last sequence number used.
    seq: u32,
    buffer: Vec<u8>,
}

impl fmt::Debug for Ipvs {
    /// Without the receive buffer's 64 KiB.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ipvs")
            .field("socket", &self.socket)
            .field("family", &self.family)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Ipvs {
    /// Opens a generic netlink socket and resolves the `IPVS` family.
    ///
    /// # Errors
    ///
    /// [`Error::NoIpvs`] when the `ip_vs` module is not loaded and the kernel cannot load it;
    /// [`Error::Socket`] when the socket cannot be opened. (Every IPVS command afterwards, listing
    /// included, needs `CAP_NET_ADMIN`: the kernel refuses with `EPERM` otherwise.)
    pub fn connect() -> Result<Self> {
        let socket = Socket::new(
            Domain::from(AF_NETLINK),
            Type::RAW,
            Some(Protocol::from(NETLINK_GENERIC)),
        )
        .map_err(|source| Error::Socket {
            action: "opening",
            source,
        })?;
        socket
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .map_err(|source| Error::Socket {
                action: "setting the reply timeout",
                source,
            })?;
        let mut ipvs = Self {
            socket,
            family: 0,
            seq: 0,
            buffer: vec![0; RECEIVE_BUFFER],
        };
        let seq = ipvs.next_seq();
        let ids = ipvs
            .exchange(
                &message::family_request(seq),
                seq,
                Subject::VirtualServer,
                || "resolving the IPVS family".to_owned(),
                message::decode_family_id,
            )
            .map_err(|e| match e {
                Error::Refused {
                    errno: Errno::ENOENT,
                    ..
                } => Error::NoIpvs,
                other => other,
            })?;
        ipvs.family = ids.into_iter().next().ok_or(Error::NoIpvs)?;
        Ok(ipvs)
    }

    /// Every virtual server (firewall-mark ones left out), as `ipvsadm -Ln` lists them.
    ///
    /// # Errors
    ///
    /// If the kernel refuses or its reply is unreadable.
    pub fn services(&mut self) -> Result<Vec<VirtualServer>> {
        let seq = self.next_seq();
        let request = message::list_services_request(self.family, seq);
        let listed = self.exchange(
            &request,
            seq,
            Subject::VirtualServer,
            || "listing virtual servers".to_owned(),
            message::decode_service,
        )?;
        Ok(listed.into_iter().flatten().collect())
    }

    /// Adds `server`.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `EEXIST` when it exists, `ENOENT` for an unknown scheduler.
    pub fn add_service(&mut self, server: &VirtualServer) -> Result<()> {
        self.change_service(Command::NewService, server, "adding")
    }

    /// Sets the scheduler, flags and timeout of the existing virtual server `server.id`.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ESRCH` when there is no such virtual server.
    pub fn update_service(&mut self, server: &VirtualServer) -> Result<()> {
        self.change_service(Command::SetService, server, "updating")
    }

    /// Deletes virtual server `id` with its real servers.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ESRCH` when there is no such virtual server.
    pub fn delete_service(&mut self, id: ServiceId) -> Result<()> {
        let seq = self.next_seq();
        let request = message::delete_service_request(self.family, seq, id);
        self.acknowledged(&request, seq, Subject::VirtualServer, || {
            format!("deleting virtual server {id}")
        })
    }

    /// The real servers of virtual server `service`, with their connection counts.
    ///
    /// # Errors
    ///
    /// If the kernel refuses (`ESRCH`: no such virtual server) or its reply is unreadable.
    pub fn real_servers(&mut self, service: ServiceId) -> Result<Vec<ListedRealServer>> {
        let seq = self.next_seq();
        let request = message::list_real_servers_request(self.family, seq, service);
        self.exchange(
            &request,
            seq,
            Subject::RealServer,
            || format!("listing the real servers of {service}"),
            |attributes| message::decode_real_server(attributes, service),
        )
    }

    /// Adds `server` behind `service`, masquerading.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ESRCH` without the virtual server, `EEXIST` when it is there.
    pub fn add_real_server(&mut self, service: ServiceId, server: RealServer) -> Result<()> {
        self.change_real_server(Command::NewDest, service, server, "adding")
    }

    /// Sets the weight of real server `server.address`:`server.port` behind `service`.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ENOENT` when there is no such real server.
    pub fn update_real_server(&mut self, service: ServiceId, server: RealServer) -> Result<()> {
        self.change_real_server(Command::SetDest, service, server, "updating")
    }

    /// Deletes real server `address`:`port` from `service`.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ENOENT` when there is no such real server.
    pub fn delete_real_server(
        &mut self,
        service: ServiceId,
        address: IpAddr,
        port: u16,
    ) -> Result<()> {
        let seq = self.next_seq();
        let request = message::delete_real_server_request(self.family, seq, service, address, port);
        self.acknowledged(&request, seq, Subject::RealServer, || {
            format!(
                "deleting real server {} of {service}",
                SocketAddr::new(address, port)
            )
        })
    }

    fn change_service(
        &mut self,
        command: Command,
        server: &VirtualServer,
        verb: &str,
    ) -> Result<()> {
        let seq = self.next_seq();
        let request = message::service_request(self.family, seq, command, server);
        self.acknowledged(&request, seq, Subject::VirtualServer, || {
            format!(
                "{verb} virtual server {} (scheduler {})",
                server.id, server.scheduler
            )
        })
    }

    fn change_real_server(
        &mut self,
        command: Command,
        service: ServiceId,
        server: RealServer,
        verb: &str,
    ) -> Result<()> {
        let seq = self.next_seq();
        let request = message::real_server_request(self.family, seq, command, service, server);
        self.acknowledged(&request, seq, Subject::RealServer, || {
            format!(
                "{verb} real server {} (weight {}) of {service}",
                SocketAddr::new(server.address, server.port),
                server.weight
            )
        })
    }

    /// Sends a request that asked for an acknowledgement and waits for it.
    fn acknowledged(
        &mut self,
        request: &[u8],
        seq: u32,
        subject: Subject,
        operation: impl Fn() -> String,
    ) -> Result<()> {
        self.exchange(request, seq, subject, operation, |_| Ok(()))
            .map(drop)
    }

    /// Sends `request` (sequence number `seq`) and reads the replies to it: every message
    /// decoded with `decode`, until the acknowledgement, the end of a dump, or the single
    /// message of a plain request. Replies to earlier requests (one that timed out) are skipped.
    fn exchange<T>(
        &mut self,
        request: &[u8],
        seq: u32,
        subject: Subject,
        operation: impl Fn() -> String,
        mut decode: impl FnMut(Attributes<'_>) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>> {
        // With no address, a netlink socket sends to the kernel, and binds itself on first use.
        self.socket.send(request).map_err(|source| Error::Socket {
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
                    return Err(Error::NoReply {
                        operation: operation(),
                        timeout: REPLY_TIMEOUT,
                    });
                }
                Err(source) => {
                    return Err(Error::Socket {
                        action: "receiving",
                        source,
                    });
                }
            };
            let progress = netlink::collect(&self.buffer[..len], seq, &mut decode, &mut decoded)
                .map_err(|source| Error::Decode {
                    operation: operation(),
                    source,
                })?;
            match progress {
                Progress::Pending => {}
                Progress::Finished => return Ok(decoded),
                Progress::Refused(errno) => {
                    let errno = Errno(errno);
                    return Err(Error::Refused {
                        operation: operation(),
                        meaning: errno.meaning(subject),
                        errno,
                    });
                }
            }
        }
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }
}

/// The sync's view of the kernel table ([`super::apply`]) is this client's.
impl super::apply::IpvsTable for Ipvs {
    type Error = Error;

    fn services(&mut self) -> Result<Vec<VirtualServer>> {
        Self::services(self)
    }

    fn real_servers(&mut self, service: ServiceId) -> Result<Vec<ListedRealServer>> {
        Self::real_servers(self, service)
    }

    fn add_service(&mut self, server: &VirtualServer) -> Result<()> {
        Self::add_service(self, server)
    }

    fn update_service(&mut self, server: &VirtualServer) -> Result<()> {
        Self::update_service(self, server)
    }

    fn delete_service(&mut self, service: ServiceId) -> Result<()> {
        Self::delete_service(self, service)
    }

    fn add_real_server(&mut self, service: ServiceId, real: RealServer) -> Result<()> {
        Self::add_real_server(self, service, real)
    }

    fn update_real_server(&mut self, service: ServiceId, real: RealServer) -> Result<()> {
        Self::update_real_server(self, service, real)
    }

    fn delete_real_server(&mut self, service: ServiceId, real: RealServer) -> Result<()> {
        Self::delete_real_server(self, service, real.address, real.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_what_ipvs_means_and_name_the_errno() {
        let refused = |errno, subject| Error::Refused {
            operation: "deleting virtual server tcp 10.96.0.10:80".into(),
            meaning: Errno(errno).meaning(subject),
            errno: Errno(errno),
        };
        assert_eq!(
            refused(3, Subject::VirtualServer).to_string(),
            "deleting virtual server tcp 10.96.0.10:80: no such virtual server (ESRCH, errno 3)"
        );
        assert!(
            refused(2, Subject::VirtualServer)
                .to_string()
                .contains("unknown scheduler")
        );
        assert_eq!(
            refused(22, Subject::RealServer).to_string(),
            "deleting virtual server tcp 10.96.0.10:80: Invalid argument (EINVAL, errno 22)"
        );
        assert_eq!(Errno(4095).to_string(), "errno 4095");
    }
}
