//! How the node is configured beyond the Services it programs, which every mode renders with:
//! what kube-proxy takes from `--cluster-cidr`, `--masquerade-all`, `--nodeport-addresses` and
//! their `KubeProxyConfiguration` fields, and each IP family's share of it.

use crate::local_traffic::{LocalMatch, PodInterfaces};
use crate::{Cidr, IpFamily};
use std::net::IpAddr;

/// kube-proxy's default `--iptables-masquerade-bit`: the mark 0x4000.
pub const DEFAULT_MASQUERADE_BIT: u8 = 14;
/// How the node is configured, beyond the Services it programs: what kube-proxy takes from
/// `--cluster-cidr` and `--masquerade-all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeOptions {
    /// The cluster's pod CIDRs (`--cluster-cidr`). Traffic from inside one is pod traffic
    /// (kube-proxy's `ClusterCIDR` local-traffic detector): cluster-IP traffic from outside is
    /// masqueraded (`! -s <cidr> -j KUBE-MARK-MASQ` first in the Service chain), and pod traffic to
    /// an `externalTrafficPolicy: Local` destination goes to every endpoint, as if it had left the
    /// cluster and come back through a load balancer.
    ///
    /// kube-proxy takes one CIDR per IP family; each family's render uses the first CIDR of its
    /// family and ignores the rest. Empty (the default): no detector, so cluster-IP traffic from
    /// outside the cluster is not masqueraded, as upstream without one.
    pub cluster_cidrs: Vec<Cidr>,
    /// The fwmark bit that marks packets for masquerading (`masqueradeBit`, 0 to 31; default
    /// [`DEFAULT_MASQUERADE_BIT`]).
    pub masquerade_bit: u8,
    /// The interfaces pod traffic arrives on (`BridgeInterface`, `InterfaceNamePrefix`): when
    /// set, the detector instead of [`cluster_cidrs`](Self::cluster_cidrs).
    pub pod_interfaces: Option<PodInterfaces>,
    /// Masquerade every packet sent to a cluster IP, whatever its source (`--masquerade-all`);
    /// it wins over the cluster CIDR for cluster-IP traffic and changes nothing else. Off by
    /// default, as upstream.
    pub masquerade_all: bool,
    /// The node addresses that take node ports (`--nodeport-addresses`, resolved to the node's
    /// addresses); `None` (the default) for every local address, as upstream without the flag.
    /// A family's unspecified address (`0.0.0.0`, `::`) in the list stands for every local
    /// address of that family, as upstream's catch-all CIDR. Each family's render uses its own.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The node's own IPs (kube-proxy's node IP, `--bind-address`). When one is inside a
    /// Service's `loadBalancerSourceRanges`, connections from the load-balancer IPs themselves are
    /// accepted too: a node that holds its VIP as a local address reaches it from that address.
    /// Empty (the default): no such rule.
    pub node_ips: Vec<IpAddr>,
    /// Whether IPv4 node ports answer on the node's loopback addresses (kube-proxy's
    /// `localhostNodePorts`, on by default), when they are taken on every address: the agent
    /// sets `route_localnet` for them, and the filter table drops what else reaches
    /// 127.0.0.0/8 from outside. Off, and always in IPv6, the node-port jump leaves loopback
    /// out.
    pub localhost_node_ports: bool,
    /// Whether conntrack tracks TCP liberally (`nf_conntrack_tcp_be_liberal`, read when the
    /// agent starts, as upstream reads it): then `KUBE-FORWARD` drops no INVALID packets.
    pub tcp_be_liberal: bool,
}

impl Default for NodeOptions {
    /// kube-proxy's defaults: no detector, no masquerade-all, node ports on every local
    /// address, loopback included.
    fn default() -> Self {
        Self {
            cluster_cidrs: Vec::new(),
            masquerade_bit: DEFAULT_MASQUERADE_BIT,
            pod_interfaces: None,
            masquerade_all: false,
            node_port_addresses: None,
            node_ips: Vec::new(),
            localhost_node_ports: true,
            tcp_be_liberal: false,
        }
    }
}

impl NodeOptions {
    /// Sets [`localhost_node_ports`](Self::localhost_node_ports).
    #[must_use]
    pub fn with_localhost_node_ports(mut self, localhost: bool) -> Self {
        self.localhost_node_ports = localhost;
        self
    }

    /// Sets [`tcp_be_liberal`](Self::tcp_be_liberal).
    #[must_use]
    pub fn with_tcp_be_liberal(mut self, liberal: bool) -> Self {
        self.tcp_be_liberal = liberal;
        self
    }

    /// Sets [`cluster_cidrs`](Self::cluster_cidrs).
    #[must_use]
    pub fn with_cluster_cidrs(mut self, cidrs: impl IntoIterator<Item = Cidr>) -> Self {
        self.cluster_cidrs = cidrs.into_iter().collect();
        self
    }

    /// Sets [`masquerade_bit`](Self::masquerade_bit).
    #[must_use]
    pub fn with_masquerade_bit(mut self, bit: u8) -> Self {
        self.masquerade_bit = bit;
        self
    }

    /// Sets [`pod_interfaces`](Self::pod_interfaces).
    #[must_use]
    pub fn with_pod_interfaces(mut self, interfaces: Option<PodInterfaces>) -> Self {
        self.pod_interfaces = interfaces;
        self
    }

    /// Sets [`node_ips`](Self::node_ips).
    #[must_use]
    pub fn with_node_ips(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.node_ips = ips.into_iter().collect();
        self
    }

    /// Sets [`masquerade_all`](Self::masquerade_all).
    #[must_use]
    pub fn with_masquerade_all(mut self, masquerade_all: bool) -> Self {
        self.masquerade_all = masquerade_all;
        self
    }

    /// Sets [`node_port_addresses`](Self::node_port_addresses).
    #[must_use]
    pub fn with_node_port_addresses(mut self, addresses: Option<Vec<IpAddr>>) -> Self {
        self.node_port_addresses = addresses;
        self
    }
}

/// [`NodeOptions`] as one family's render uses them: the addresses and CIDR of that family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FamilyOptions {
    /// The family rendered.
    pub family: IpFamily,
    /// [`NodeOptions::masquerade_all`].
    pub masquerade_all: bool,
    /// The masquerade mark as the tools print it (`0x4000`).
    pub masquerade_mark: String,
    /// How the family's pod traffic is told apart (the local-traffic detector), if it is.
    pub local: Option<LocalMatch>,
    /// The family's addresses taking node ports; `None` for every local address of the family.
    pub node_port_addresses: Option<Vec<IpAddr>>,
    /// The node's addresses of the family ([`NodeOptions::node_ips`]).
    pub node_ips: Vec<IpAddr>,
    /// [`NodeOptions::localhost_node_ports`], in IPv4 only.
    pub localhost_node_ports: bool,
    /// [`NodeOptions::tcp_be_liberal`].
    pub tcp_be_liberal: bool,
}

impl FamilyOptions {
    /// `options` for the `family` render.
    pub fn new(family: IpFamily, options: &NodeOptions) -> Self {
        let of_family = |ips: &[IpAddr]| -> Vec<IpAddr> {
            ips.iter()
                .copied()
                .filter(|ip| family.contains(ip))
                .collect()
        };
        let node_port_addresses = options
            .node_port_addresses
            .as_deref()
            .map(of_family)
            .filter(|ips| !ips.iter().any(IpAddr::is_unspecified));
        Self {
            family,
            masquerade_all: options.masquerade_all,
            masquerade_mark: format!("{:#x}", 1_u32 << (options.masquerade_bit & 31)),
            local: LocalMatch::for_family(
                family,
                options.pod_interfaces.as_ref(),
                &options.cluster_cidrs,
            ),
            // As upstream: only when node ports are taken on every address, loopback included.
            localhost_node_ports: family == IpFamily::V4
                && options.localhost_node_ports
                && node_port_addresses.is_none(),
            node_port_addresses,
            node_ips: of_family(&options.node_ips),
            tcp_be_liberal: options.tcp_be_liberal,
        }
    }
}
