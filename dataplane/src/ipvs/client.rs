//! The IPVS client: reads and writes the kernel's virtual and real servers over a blocking
//! generic netlink socket (no ipvsadm). Call it from `spawn_blocking` in async code.

use super::connection::{Connection, DecodeError, Errno, ExchangeError, REPLY_TIMEOUT};
use super::message::{self, Command, IpvsMessage, Request};
use super::{ListedRealServer, RealServer, ServiceId, Timeouts, VirtualServer};
use netlink_packet_generic::GenlMessage;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

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
        meaning: &'static str,
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

/// What IPVS means by the errnos it answers with.
trait IpvsMeaning {
    /// What IPVS means by it in an operation on `subject`.
    fn meaning(self, subject: Subject) -> &'static str;
}

impl IpvsMeaning for Errno {
    /// IPVS reuses a few errnos whose generic text would mislead ("No such process" for a
    /// missing virtual server).
    fn meaning(self, subject: Subject) -> &'static str {
        match (self, subject) {
            (Self::ESRCH, _) => "no such virtual server",
            (Self::ENOENT, Subject::RealServer) => "no such real server",
            (Self::ENOENT, Subject::VirtualServer) => {
                "unknown scheduler or persistence engine (is its module available?)"
            }
            (Self::EEXIST, _) => "already exists",
            _ => self.text(),
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
#[derive(Debug)]
pub struct Ipvs {
    connection: Connection,
    /// The `IPVS` family's id, which the kernel assigns when the module loads.
    family: u16,
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
        let connection = Connection::open(netlink_sys::protocols::NETLINK_GENERIC)
            .map_err(|e| exchange_error(e, Subject::VirtualServer, || "opening".to_owned()))?;
        let mut ipvs = Self {
            connection,
            family: 0,
        };
        let ids = ipvs
            .connection
            .exchange(message::family_request(), message::decode_family_id)
            .map_err(|e| {
                exchange_error(e, Subject::VirtualServer, || {
                    "resolving the IPVS family".to_owned()
                })
            })
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
        let request = message::list_services_request(self.family);
        let listed = self.exchange(
            request,
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

    /// Sets the connection timeouts that `timeouts` sets.
    ///
    /// # Errors
    ///
    /// If the kernel refuses.
    pub fn set_timeouts(&mut self, timeouts: &Timeouts) -> Result<()> {
        let request = message::timeouts_request(self.family, timeouts);
        self.acknowledged(request, Subject::VirtualServer, || {
            format!("setting the connection timeouts {timeouts:?}")
        })
    }

    /// Deletes virtual server `id` with its real servers.
    ///
    /// # Errors
    ///
    /// If the kernel refuses: `ESRCH` when there is no such virtual server.
    pub fn delete_service(&mut self, id: ServiceId) -> Result<()> {
        let request = message::delete_service_request(self.family, id);
        self.acknowledged(request, Subject::VirtualServer, || {
            format!("deleting virtual server {id}")
        })
    }

    /// The real servers of virtual server `service`, with their connection counts.
    ///
    /// # Errors
    ///
    /// If the kernel refuses (`ESRCH`: no such virtual server) or its reply is unreadable.
    pub fn real_servers(&mut self, service: ServiceId) -> Result<Vec<ListedRealServer>> {
        let request = message::list_real_servers_request(self.family, service);
        self.exchange(
            request,
            Subject::RealServer,
            || format!("listing the real servers of {service}"),
            |listed| message::decode_real_server(listed, service),
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
        let request = message::delete_real_server_request(self.family, service, address, port);
        self.acknowledged(request, Subject::RealServer, || {
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
        let request = message::service_request(self.family, command, server);
        self.acknowledged(request, Subject::VirtualServer, || {
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
        let request = message::real_server_request(self.family, command, service, server);
        self.acknowledged(request, Subject::RealServer, || {
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
        request: Request,
        subject: Subject,
        operation: impl Fn() -> String,
    ) -> Result<()> {
        self.exchange(request, subject, operation, |_| Ok(()))
            .map(drop)
    }

    /// Sends `request` and reads the replies to it, each decoded with `decode`.
    fn exchange<T>(
        &mut self,
        request: Request,
        subject: Subject,
        operation: impl Fn() -> String,
        mut decode: impl FnMut(IpvsMessage) -> Result<T, DecodeError>,
    ) -> Result<Vec<T>> {
        self.connection
            .exchange(request, |reply: GenlMessage<IpvsMessage>| {
                decode(reply.payload)
            })
            .map_err(|e| exchange_error(e, subject, operation))
    }
}

/// The client's error for a failed exchange about `subject`, naming the `operation`.
fn exchange_error(e: ExchangeError, subject: Subject, operation: impl Fn() -> String) -> Error {
    match e {
        ExchangeError::Socket { action, source } => Error::Socket { action, source },
        ExchangeError::NoReply => Error::NoReply {
            operation: operation(),
            timeout: REPLY_TIMEOUT,
        },
        ExchangeError::Refused(errno) => Error::Refused {
            operation: operation(),
            meaning: errno.meaning(subject),
            errno,
        },
        ExchangeError::Decode(source) => Error::Decode {
            operation: operation(),
            source,
        },
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
