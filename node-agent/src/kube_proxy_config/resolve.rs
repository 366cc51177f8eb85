//! Checks a defaulted configuration as kube-proxy validates it and turns it into the typed
//! settings the agent runs with. Every problem is reported, each naming its field and flag.

use super::wire::{GoDuration, KubeProxyConfiguration};
use crate::{
    cli::ProxyMode,
    node_port_addresses::NodePortAddress,
    sync_timer::{InvalidPeriods, SyncPeriods},
};
use splitproxy_dataplane::{Cidr, IpFamily, ipvs::Timeouts};
use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

/// The feature gates kube-proxy v1.36.3 knows, one per line: every gate its
/// `--feature-gates` accepts (upstream refuses any other name).
const KNOWN_FEATURE_GATES: &str = include_str!("feature_gates.txt");

/// The settings a valid configuration gives the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Which dataplane programs the kernel.
    pub mode: ProxyMode,
    /// The node name, when the configuration names it.
    pub hostname_override: Option<String>,
    /// The node's primary IP; `None` when unspecified (`0.0.0.0`), to be found.
    pub bind_address: Option<IpAddr>,
    /// Where `/healthz` and `/livez` are served; `None`: not served.
    pub healthz_bind_address: Option<SocketAddr>,
    /// Where `/metrics` and `/proxyMode` are served.
    pub metrics_bind_address: Option<SocketAddr>,
    /// Whether failing to bind those is fatal.
    pub bind_address_hard_fail: bool,
    /// The chosen mode's sync periods.
    pub sync_periods: SyncPeriods,
    /// Masquerade every packet sent to a cluster IP.
    pub masquerade_all: bool,
    /// The fwmark bit that marks packets for masquerading (the mode's `masqueradeBit`).
    pub masquerade_bit: u8,
    /// How pod traffic is told from other traffic.
    pub local_detector: LocalDetector,
    /// Whether IPv4 node ports answer on 127.0.0.1 (iptables mode).
    pub localhost_node_ports: bool,
    /// Which node addresses take node ports; empty: the mode's default.
    pub node_port_addresses: Vec<NodePortAddress>,
    /// The IPVS mode's settings.
    pub ipvs: IpvsSettings,
    /// The agent's OOM score adjustment.
    pub oom_score_adj: i32,
    /// The conntrack sysctls to set.
    pub conntrack: ConntrackSettings,
    /// The kubeconfig (`clientConnection.kubeconfig`) that finds the API server, which
    /// `--controller-service` reads.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Log verbosity (klog's `-v`).
    pub verbosity: u32,
    /// Log lines as JSON rather than text.
    pub json_logs: bool,
}

/// kube-proxy's local-traffic detectors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDetector {
    /// Sources inside the cluster's pod CIDRs (none given: no detector).
    ClusterCidr(Vec<Cidr>),
    /// Sources inside the node's own pod CIDRs.
    NodeCidr,
    /// Packets that arrive on this bridge.
    BridgeInterface(String),
    /// Packets that arrive on an interface whose name starts with this.
    InterfaceNamePrefix(String),
}

/// `ipvs.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpvsSettings {
    /// The scheduler of every virtual server.
    pub scheduler: String,
    /// Virtual servers never deleted.
    pub exclude_cidrs: Vec<Cidr>,
    /// `arp_ignore=1`, `arp_announce=2`.
    pub strict_arp: bool,
    /// The connection timeouts to set.
    pub timeouts: Timeouts,
}

/// `conntrack.*`: the sysctls kube-proxy sets on start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// `maxPerCore`; 0 leaves `nf_conntrack_max` (and `min`) alone.
    pub max_per_core: u32,
    /// `min`: the floor of `nf_conntrack_max`.
    pub min: u32,
    /// `nf_conntrack_tcp_timeout_established`; `None` leaves it.
    pub tcp_established_timeout: Option<Duration>,
    /// `nf_conntrack_tcp_timeout_close_wait`; `None` leaves it.
    pub tcp_close_wait_timeout: Option<Duration>,
    /// `nf_conntrack_tcp_be_liberal=1`, and no INVALID drop in `KUBE-FORWARD`.
    pub tcp_be_liberal: bool,
    /// `nf_conntrack_udp_timeout`; `None` leaves it.
    pub udp_timeout: Option<Duration>,
    /// `nf_conntrack_udp_timeout_stream`; `None` leaves it.
    pub udp_stream_timeout: Option<Duration>,
}

/// One invalid value: the field, the flag that sets it, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field's path in the file (`conntrack.maxPerCore`).
    pub field: String,
    /// The flag that sets it, if one does.
    pub flag: Option<&'static str>,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.flag {
            Some(flag) => write!(f, "{} ({flag}): {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// Every invalid value of a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct InvalidConfiguration(pub Vec<Invalid>);

/// Collects problems while the settings are read.
#[derive(Default)]
struct Problems(Vec<Invalid>);

impl Problems {
    fn add(&mut self, field: impl Into<String>, flag: Option<&'static str>, message: String) {
        self.0.push(Invalid {
            field: field.into(),
            flag,
            message,
        });
    }

    fn parse<T: std::str::FromStr>(
        &mut self,
        field: impl Into<String>,
        flag: Option<&'static str>,
        text: &str,
        expected: &str,
    ) -> Option<T> {
        let parsed = text.parse().ok();
        if parsed.is_none() {
            self.add(field, flag, format!("{text:?} is not {expected}"));
        }
        parsed
    }

    fn non_negative(&mut self, field: &str, flag: &'static str, value: Option<i32>) -> u32 {
        let value = value.unwrap_or(0);
        u32::try_from(value).unwrap_or_else(|_| {
            self.add(field, Some(flag), format!("{value} must be 0 or more"));
            0
        })
    }
}

/// Checks `config` (defaults applied) and returns what the agent runs with.
///
/// # Errors
///
/// Returns every invalid value, each naming its field and flag.
pub fn resolve(config: &KubeProxyConfiguration) -> Result<Settings, InvalidConfiguration> {
    let mut problems = Problems::default();
    check_kind(config, &mut problems);
    for gate in config.feature_gates.keys() {
        if !KNOWN_FEATURE_GATES.lines().any(|known| known == gate) {
            problems.add(
                format!("featureGates.{gate}"),
                Some("--feature-gates"),
                "unrecognized feature gate".to_owned(),
            );
        }
    }
    let mode = match config.mode.as_str() {
        "iptables" => ProxyMode::Iptables,
        "ipvs" => ProxyMode::Ipvs,
        "nftables" => ProxyMode::Nftables,
        // Not a kube-proxy mode: splitproxy's own, taken from the file as from the flag.
        "ebpf" => ProxyMode::Ebpf,
        other => {
            problems.add(
                "mode",
                Some("--proxy-mode"),
                format!("{other:?} is not one of iptables, ipvs, nftables, ebpf"),
            );
            ProxyMode::Iptables
        }
    };
    let bind_address: Option<IpAddr> = problems.parse(
        "bindAddress",
        Some("--bind-address"),
        &config.bind_address,
        "an IP address",
    );
    let healthz_bind_address = (!config.healthz_bind_address.is_empty())
        .then(|| {
            problems.parse(
                "healthzBindAddress",
                Some("--healthz-bind-address"),
                &config.healthz_bind_address,
                "an IP:port",
            )
        })
        .flatten();
    // Unlike the health server, the metrics server cannot be turned off: upstream refuses an
    // empty address (what --metrics-port=0 makes).
    let metrics_bind_address = problems.parse(
        "metricsBindAddress",
        Some("--metrics-bind-address"),
        &config.metrics_bind_address,
        "an IP:port",
    );
    let sync_periods = sync_periods(config, mode, &mut problems);
    for (field, flag, bit) in [
        (
            "iptables.masqueradeBit",
            "--iptables-masquerade-bit",
            config.iptables.masquerade_bit,
        ),
        ("nftables.masqueradeBit", "", config.nftables.masquerade_bit),
    ] {
        let bit = bit.unwrap_or(super::defaults::MASQUERADE_BIT);
        let flag = (!flag.is_empty()).then_some(flag);
        if !(0..=31).contains(&bit) {
            problems.add(field, flag, format!("{bit} is not within [0, 31]"));
        }
    }
    // The nftables mode has its own bit; the other modes use iptables'.
    let masquerade_bit = match mode {
        ProxyMode::Nftables => config.nftables.masquerade_bit,
        ProxyMode::Iptables | ProxyMode::Ipvs | ProxyMode::Ebpf => config.iptables.masquerade_bit,
    }
    .and_then(|bit| u8::try_from(bit).ok())
    .filter(|bit| *bit <= 31)
    .unwrap_or(splitproxy_dataplane::node_options::DEFAULT_MASQUERADE_BIT);
    let local_detector = local_detector(config, &mut problems);
    let node_port_addresses = node_port_addresses(config, &mut problems);
    let ipvs = ipvs(config, &mut problems);
    let oom_score_adj = config.oom_score_adj.unwrap_or(0);
    if !(-1000..=1000).contains(&oom_score_adj) {
        problems.add(
            "oomScoreAdj",
            Some("--oom-score-adj"),
            format!("{oom_score_adj} is not within [-1000, 1000]"),
        );
    }
    let conntrack = conntrack(config, &mut problems);
    if config.client_connection.burst < 0 {
        problems.add(
            "clientConnection.burst",
            Some("--kube-api-burst"),
            "must be 0 or more".to_owned(),
        );
    }
    let json_logs = match config.logging.format.as_str() {
        "text" => false,
        "json" => true,
        other => {
            problems.add(
                "logging.format",
                Some("--logging-format"),
                format!("{other:?} is not one of text, json"),
            );
            false
        }
    };
    if problems.0.is_empty() {
        Ok(Settings {
            mode,
            hostname_override: Some(config.hostname_override.trim().to_lowercase())
                .filter(|name| !name.is_empty()),
            bind_address: bind_address.filter(|ip| !ip.is_unspecified()),
            healthz_bind_address,
            metrics_bind_address,
            bind_address_hard_fail: config.bind_address_hard_fail,
            sync_periods: sync_periods.unwrap_or_default(),
            masquerade_all: config.masquerade_all(),
            masquerade_bit,
            local_detector,
            localhost_node_ports: config.iptables.localhost_node_ports.unwrap_or(true),
            node_port_addresses,
            ipvs,
            oom_score_adj,
            conntrack,
            kubeconfig: Some(config.client_connection.kubeconfig.clone())
                .filter(|path| !path.is_empty())
                .map(Into::into),
            verbosity: config.logging.verbosity,
            json_logs,
        })
    } else {
        Err(InvalidConfiguration(problems.0))
    }
}

fn check_kind(config: &KubeProxyConfiguration, problems: &mut Problems) {
    use super::wire::{API_VERSION, KIND};
    if config.api_version != API_VERSION {
        problems.add(
            "apiVersion",
            None,
            format!("{:?} is not {API_VERSION}", config.api_version),
        );
    }
    if config.kind != KIND {
        problems.add("kind", None, format!("{:?} is not {KIND}", config.kind));
    }
}

fn sync_periods(
    config: &KubeProxyConfiguration,
    mode: ProxyMode,
    problems: &mut Problems,
) -> Option<SyncPeriods> {
    let (section, flag) = match mode {
        ProxyMode::Ipvs => ("ipvs", "--ipvs"),
        ProxyMode::Nftables => ("nftables", "--iptables"),
        ProxyMode::Iptables | ProxyMode::Ebpf => ("iptables", "--iptables"),
    };
    let flag = |suffix: &str| -> &'static str {
        match (flag, suffix) {
            ("--ipvs", "sync") => "--ipvs-sync-period",
            ("--ipvs", _) => "--ipvs-min-sync-period",
            (_, "sync") => "--iptables-sync-period",
            _ => "--iptables-min-sync-period",
        }
    };
    let GoDuration(sync) = config.sync_period();
    let GoDuration(min) = config.min_sync_period();
    match SyncPeriods::new(sync, min) {
        Ok(periods) => Some(periods),
        Err(InvalidPeriods::ZeroSyncPeriod) => {
            problems.add(
                format!("{section}.syncPeriod"),
                Some(flag("sync")),
                "must be greater than 0".to_owned(),
            );
            None
        }
        Err(InvalidPeriods::MinAboveSync { sync, min }) => {
            problems.add(
                format!("{section}.minSyncPeriod"),
                Some(flag("min")),
                format!("{min:?} must not be greater than the sync period ({sync:?})"),
            );
            None
        }
    }
}

fn local_detector(config: &KubeProxyConfiguration, problems: &mut Problems) -> LocalDetector {
    let interface = |problems: &mut Problems, field, flag, name: &str| {
        if name.is_empty() {
            problems.add(field, Some(flag), "must not be empty".to_owned());
        }
        name.to_owned()
    };
    match config.detect_local_mode.as_str() {
        "ClusterCIDR" => LocalDetector::ClusterCidr(cluster_cidrs(config, problems)),
        "NodeCIDR" => LocalDetector::NodeCidr,
        "BridgeInterface" => LocalDetector::BridgeInterface(interface(
            problems,
            "detectLocal.bridgeInterface",
            "--pod-bridge-interface",
            &config.detect_local.bridge_interface,
        )),
        "InterfaceNamePrefix" => LocalDetector::InterfaceNamePrefix(interface(
            problems,
            "detectLocal.interfaceNamePrefix",
            "--pod-interface-name-prefix",
            &config.detect_local.interface_name_prefix,
        )),
        other => {
            problems.add(
                "detectLocalMode",
                Some("--detect-local-mode"),
                format!(
                    "{other:?} is not one of ClusterCIDR, NodeCIDR, BridgeInterface, \
                     InterfaceNamePrefix"
                ),
            );
            LocalDetector::ClusterCidr(Vec::new())
        }
    }
}

fn cluster_cidrs(config: &KubeProxyConfiguration, problems: &mut Problems) -> Vec<Cidr> {
    if config.cluster_cidr.is_empty() {
        return Vec::new();
    }
    let flag = Some("--cluster-cidr");
    let cidrs: Vec<Cidr> = config
        .cluster_cidr
        .split(',')
        .filter_map(|text| problems.parse("clusterCIDR", flag, text, "a CIDR"))
        .collect();
    let ipv4 = cidrs
        .iter()
        .filter(|cidr| IpFamily::V4.contains(&cidr.address))
        .count();
    if cidrs.len() > 2 || (cidrs.len() == 2 && ipv4 != 1) {
        problems.add(
            "clusterCIDR",
            flag,
            format!(
                "{:?} is not one CIDR or a dual-stack pair",
                config.cluster_cidr
            ),
        );
    }
    cidrs
}

fn node_port_addresses(
    config: &KubeProxyConfiguration,
    problems: &mut Problems,
) -> Vec<NodePortAddress> {
    let texts = config.node_port_addresses.as_deref().unwrap_or_default();
    let flag = Some("--nodeport-addresses");
    let addresses: Vec<NodePortAddress> = texts
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            problems.parse(
                format!("nodePortAddresses[{i}]"),
                flag,
                text,
                "a CIDR or `primary`",
            )
        })
        .collect();
    if addresses.len() > 1 && addresses.contains(&NodePortAddress::Primary) {
        problems.add(
            "nodePortAddresses",
            flag,
            "`primary` cannot be given with CIDRs".to_owned(),
        );
    }
    addresses
}

fn ipvs(config: &KubeProxyConfiguration, problems: &mut Problems) -> IpvsSettings {
    let exclude_cidrs = config
        .ipvs
        .exclude_cidrs
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, text)| {
            problems.parse(
                format!("ipvs.excludeCIDRs[{i}]"),
                Some("--ipvs-exclude-cidrs"),
                text,
                "a CIDR",
            )
        })
        .collect();
    let seconds = |GoDuration(duration): GoDuration| {
        let seconds = u32::try_from(duration.as_secs()).unwrap_or(u32::MAX);
        (seconds > 0).then_some(seconds)
    };
    let scheduler = if config.ipvs.scheduler.is_empty() {
        "rr".to_owned()
    } else {
        config.ipvs.scheduler.clone()
    };
    IpvsSettings {
        scheduler,
        exclude_cidrs,
        strict_arp: config.ipvs.strict_arp,
        timeouts: Timeouts {
            tcp: seconds(config.ipvs.tcp_timeout),
            tcp_fin: seconds(config.ipvs.tcp_fin_timeout),
            udp: seconds(config.ipvs.udp_timeout),
        },
    }
}

fn conntrack(config: &KubeProxyConfiguration, problems: &mut Problems) -> ConntrackSettings {
    let conntrack = &config.conntrack;
    let set = |duration: Option<GoDuration>| duration.map(|d| d.0).filter(|d| !d.is_zero());
    ConntrackSettings {
        max_per_core: problems.non_negative(
            "conntrack.maxPerCore",
            "--conntrack-max-per-core",
            conntrack.max_per_core,
        ),
        min: problems.non_negative("conntrack.min", "--conntrack-min", conntrack.min),
        tcp_established_timeout: set(conntrack.tcp_established_timeout),
        tcp_close_wait_timeout: set(conntrack.tcp_close_wait_timeout),
        tcp_be_liberal: conntrack.tcp_be_liberal,
        udp_timeout: set(Some(conntrack.udp_timeout)),
        udp_stream_timeout: set(Some(conntrack.udp_stream_timeout)),
    }
}
