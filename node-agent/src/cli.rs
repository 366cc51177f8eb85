//! Command-line flags: kube-proxy's own, with its names and meanings, and splitproxy's few
//! (the controllers, the node's credentials, the inspection server).
//!
//! A kube-proxy flag only records what the command line (or its `SPLITPROXY_*` variable) says;
//! [`crate::kube_proxy_config`] turns the flags, or a `--config` file, into settings with
//! kube-proxy's defaults and checks.

use crate::{
    discovery::ControllerService, duration::parse_duration, node_port_addresses::NodePortAddress,
};
use clap::{Parser, ValueEnum, builder::BoolishValueParser};
use splitproxy_dataplane::Cidr;
use std::{net::SocketAddr, path::PathBuf, time::Duration};

/// Programs this node's Services from the splitproxy controller's stream.
#[derive(Debug, Parser)]
#[command(name = "splitproxy-agent", version, about)]
pub struct Cli {
    /// Controller URL (e.g. https://10.0.0.1:10660); repeat to list several, tried in turn.
    #[arg(
        long = "controller",
        env = "SPLITPROXY_CONTROLLERS",
        value_delimiter = ',',
        required_unless_present_any = ["controller_service", "cleanup", "write_config_to", "init_only"]
    )]
    pub controllers: Vec<String>,
    /// The controllers' Service (NAMESPACE/NAME): its ready endpoints, listed from the API
    /// server (found as kube-proxy finds it: --kubeconfig or the config's
    /// clientConnection.kubeconfig, else in-cluster, with --master's address) when connecting.
    /// Their certificates must name NAME.NAMESPACE.svc.
    #[arg(
        long,
        env = "SPLITPROXY_CONTROLLER_SERVICE",
        conflicts_with = "controllers",
        value_parser = clap::value_parser!(ControllerService)
    )]
    pub controller_service: Option<ControllerService>,
    /// File holding the token that proves this node's identity to controllers (a Pod-bound
    /// ServiceAccount token for the controller's audience, or a static token); read again on
    /// every connection, as the kubelet rotates it.
    #[arg(long, env = "SPLITPROXY_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM CA certificates that `https://` controllers' certificates must chain to.
    #[arg(long, env = "SPLITPROXY_CONTROLLER_CA_FILE")]
    pub controller_ca_file: Option<PathBuf>,
    /// Address of the gRPC inspection server (with reflection, for grpcurl).
    #[arg(
        long,
        env = "SPLITPROXY_INSPECTION_BIND_ADDRESS",
        default_value = "127.0.0.1:10661"
    )]
    pub inspection_bind_address: SocketAddr,

    /// A kube-proxy configuration file (`KubeProxyConfiguration`,
    /// kubeproxy.config.k8s.io/v1alpha1). As kube-proxy, it replaces every flag below except
    /// --hostname-override, -v and --logging-format; a field it does not know is an error.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Write the configuration the flags (or --config) make, defaults filled in, to this file
    /// and exit.
    #[arg(long)]
    pub write_config_to: Option<PathBuf>,
    /// Set the node's sysctls (conntrack and, with localhost node ports, route_localnet) and
    /// exit: for an init container with full privileges ahead of an agent without them.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub init_only: Option<bool>,
    /// Remove every proxy mode's rules (iptables, IPVS, nftables) and exit.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub cleanup: Option<bool>,
    /// Feature gates, `Name=true|false` comma-separated: any gate kube-proxy v1.36.3 knows is
    /// accepted; none changes what the agent does.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,

    /// The node name to program; defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub hostname_override: Option<String>,
    /// Which dataplane programs the kernel (default iptables).
    #[arg(long, env = "SPLITPROXY_PROXY_MODE", value_enum)]
    pub proxy_mode: Option<ProxyMode>,
    /// The ebpf mode's BPF filesystem, mounted there if it is not: its maps and links are
    /// pinned under `splitproxy/`, so Services keep working while the agent restarts.
    #[arg(long, env = "SPLITPROXY_BPF_ROOT", default_value = "/sys/fs/bpf")]
    pub bpf_root: PathBuf,
    /// The cgroup v2 folder the ebpf mode attaches its programs to (default: the root of the
    /// cgroup v2 hierarchy mounted on the node, which every process of the node is under).
    #[arg(long, env = "SPLITPROXY_CGROUP_ROOT")]
    pub cgroup_root: Option<PathBuf>,
    /// The devices the ebpf mode balances traffic from outside the node on, comma-separated
    /// (default: those holding the node-port addresses).
    #[arg(long, env = "SPLITPROXY_EBPF_DEVICES", value_delimiter = ',')]
    pub ebpf_devices: Option<Vec<String>>,
    /// This node's primary IP, as kube-proxy's flag of the same name overrides it (no socket is
    /// bound to it): `--nodeport-addresses primary` selects it, and when a Service's
    /// loadBalancerSourceRanges hold it the node may reach the load-balancer IPs it holds as
    /// local addresses. Unset, empty or 0.0.0.0: the address the node reaches the first
    /// controller from.
    #[arg(long, env = "SPLITPROXY_BIND_ADDRESS")]
    pub bind_address: Option<String>,
    /// Address of `/healthz` and `/livez` (default 0.0.0.0:10256); an IP alone takes port
    /// 10256.
    #[arg(long, env = "SPLITPROXY_HEALTHZ_BIND_ADDRESS")]
    pub healthz_bind_address: Option<String>,
    /// Address of `/metrics` and `/proxyMode` (default 127.0.0.1:10249); an IP alone takes port
    /// 10249.
    #[arg(long, env = "SPLITPROXY_METRICS_BIND_ADDRESS")]
    pub metrics_bind_address: Option<String>,
    /// Deprecated: the port of a bare IP in --healthz-bind-address; 0 serves no health checks.
    #[arg(long)]
    pub healthz_port: Option<u16>,
    /// Deprecated: the port of a bare IP in --metrics-bind-address; 0 is refused, as upstream
    /// refuses the empty address it makes.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Exit when the health or metrics address cannot be bound (otherwise retry every 5 s).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub bind_address_hard_fail: Option<bool>,

    /// The longest time between two syncs of the node's rules (iptables and nftables modes):
    /// a full resync repairs what was changed behind the agent's back. `/healthz` fails when a
    /// revision waits twice this long. Go duration syntax (`30s`, `1m`, `1h30m`).
    #[arg(long, env = "SPLITPROXY_IPTABLES_SYNC_PERIOD", value_parser = parse_duration)]
    pub iptables_sync_period: Option<Duration>,
    /// The shortest time between two syncs (iptables and nftables modes, default 1s); a
    /// revision that arrives sooner waits. At most --iptables-sync-period.
    #[arg(long, env = "SPLITPROXY_IPTABLES_MIN_SYNC_PERIOD", value_parser = parse_duration)]
    pub iptables_min_sync_period: Option<Duration>,
    /// The fwmark bit that marks packets for masquerading, 0 to 31 (default 14: 0x4000).
    #[arg(long)]
    pub iptables_masquerade_bit: Option<i32>,
    /// Whether IPv4 node ports answer on 127.0.0.1 in iptables mode (default true).
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub iptables_localhost_nodeports: Option<bool>,
    /// Masquerade every packet sent to a cluster IP, whatever its source.
    #[arg(long, env = "SPLITPROXY_MASQUERADE_ALL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub masquerade_all: Option<bool>,
    /// The cluster's pod CIDRs, comma-separated, at most one per IP family (e.g.
    /// `10.244.0.0/16,fd00:10:244::/56`). Cluster-IP traffic from outside them is masqueraded,
    /// and pod traffic to an externalTrafficPolicy Local node port, external IP or load-balancer
    /// IP reaches every endpoint. Unset: traffic from outside the cluster to a cluster IP is
    /// not masqueraded.
    #[arg(long, env = "SPLITPROXY_CLUSTER_CIDR", value_delimiter = ',')]
    pub cluster_cidr: Vec<Cidr>,
    /// How pod traffic is told apart: ClusterCIDR (the default), NodeCIDR, BridgeInterface or
    /// InterfaceNamePrefix.
    #[arg(long)]
    pub detect_local_mode: Option<String>,
    /// The bridge pod traffic arrives on, for --detect-local-mode BridgeInterface.
    #[arg(long)]
    pub pod_bridge_interface: Option<String>,
    /// The prefix of the interfaces pod traffic arrives on, for --detect-local-mode
    /// InterfaceNamePrefix.
    #[arg(long)]
    pub pod_interface_name_prefix: Option<String>,
    /// Which node addresses accept node-port traffic, comma-separated: CIDRs (the node's
    /// addresses inside them, e.g. `198.18.0.0/24`) or `primary` alone (the node's primary IP).
    /// Unset: every local address (the primary IP in nftables mode, as upstream). Read when the
    /// agent starts.
    #[arg(
        long = "nodeport-addresses",
        env = "SPLITPROXY_NODEPORT_ADDRESSES",
        value_delimiter = ','
    )]
    pub nodeport_addresses: Vec<NodePortAddress>,

    /// The longest time between two syncs in IPVS mode (default 30s).
    #[arg(long, value_parser = parse_duration)]
    pub ipvs_sync_period: Option<Duration>,
    /// The shortest time between two syncs in IPVS mode (default 1s; 0 syncs every change).
    #[arg(long, value_parser = parse_duration)]
    pub ipvs_min_sync_period: Option<Duration>,
    /// The IPVS scheduler of every virtual server in IPVS mode (rr, wrr, lc, wlc, lblc, lblcr,
    /// sh, dh, sed, nq, mh; default rr); its kernel module `ip_vs_<name>` must be available.
    #[arg(long, env = "SPLITPROXY_IPVS_SCHEDULER")]
    pub ipvs_scheduler: Option<String>,
    /// In IPVS mode, answer ARP only for addresses on the interface asked
    /// (`arp_ignore=1`, `arp_announce=2`), so the Service addresses bound to `kube-ipvs0` are
    /// not announced on the node's network; needed by load balancers such as MetalLB.
    #[arg(long, env = "SPLITPROXY_IPVS_STRICT_ARP", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub ipvs_strict_arp: Option<bool>,
    /// In IPVS mode, CIDRs whose IPVS virtual servers the agent never deletes, comma-separated:
    /// other programs' virtual servers on the node's own addresses.
    #[arg(long, env = "SPLITPROXY_IPVS_EXCLUDE_CIDRS", value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Vec<Cidr>,
    /// In IPVS mode, how long an idle established TCP connection stays in IPVS's table; `0`
    /// (the default) leaves the kernel's value. Whole seconds (`15m`).
    #[arg(long, env = "SPLITPROXY_IPVS_TCP_TIMEOUT", value_parser = parse_duration)]
    pub ipvs_tcp_timeout: Option<Duration>,
    /// In IPVS mode, how long a TCP connection stays in IPVS's table after a FIN; `0` (the
    /// default) leaves the kernel's value.
    #[arg(long, env = "SPLITPROXY_IPVS_TCPFIN_TIMEOUT", value_parser = parse_duration)]
    pub ipvs_tcpfin_timeout: Option<Duration>,
    /// In IPVS mode, how long an idle UDP flow stays in IPVS's table; `0` (the default) leaves
    /// the kernel's value.
    #[arg(long, env = "SPLITPROXY_IPVS_UDP_TIMEOUT", value_parser = parse_duration)]
    pub ipvs_udp_timeout: Option<Duration>,

    /// Connections tracked per CPU: `nf_conntrack_max` becomes this × CPUs, at least
    /// --conntrack-min and at most 1048576 (default 32768; 0 leaves it alone).
    #[arg(long)]
    pub conntrack_max_per_core: Option<i32>,
    /// The floor of `nf_conntrack_max` (default 131072).
    #[arg(long)]
    pub conntrack_min: Option<i32>,
    /// `nf_conntrack_tcp_timeout_established` (default 24h; 0 leaves it).
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_tcp_timeout_established: Option<Duration>,
    /// `nf_conntrack_tcp_timeout_close_wait` (default 1h; 0 leaves it).
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_tcp_timeout_close_wait: Option<Duration>,
    /// Set `nf_conntrack_tcp_be_liberal` and drop no INVALID packets in `KUBE-FORWARD`.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub conntrack_tcp_be_liberal: Option<bool>,
    /// `nf_conntrack_udp_timeout` (0, the default, leaves it).
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_udp_timeout: Option<Duration>,
    /// `nf_conntrack_udp_timeout_stream` (0, the default, leaves it).
    #[arg(long, value_parser = parse_duration)]
    pub conntrack_udp_timeout_stream: Option<Duration>,
    /// The agent's OOM score adjustment, in [-1000, 1000] (default -999).
    #[arg(long, allow_negative_numbers = true)]
    pub oom_score_adj: Option<i32>,

    /// Log verbosity: 0 and 1 log what kube-proxy logs at info, 2 to 4 add debug lines, 5 and
    /// above trace lines. `RUST_LOG` wins when set.
    #[arg(short = 'v', long = "v")]
    pub verbosity: Option<u32>,
    /// Log line format: text (the default) or json.
    #[arg(long)]
    pub logging_format: Option<String>,

    /// kube-proxy's API server connection: used only by --controller-service (the controller
    /// watches the API server).
    #[arg(long)]
    pub kubeconfig: Option<String>,
    /// The API server's address, replacing the kubeconfig's (or the in-cluster one): used only
    /// by --controller-service.
    #[arg(long, env = "SPLITPROXY_MASTER")]
    pub master: Option<String>,
    /// Moot: the controller watches the API server.
    #[arg(long)]
    pub kube_api_content_type: Option<String>,
    /// Moot: the controller watches the API server.
    #[arg(long)]
    pub kube_api_qps: Option<f32>,
    /// Moot: the controller watches the API server.
    #[arg(long)]
    pub kube_api_burst: Option<i32>,
    /// Moot: the controller watches the API server.
    #[arg(long, value_parser = parse_duration)]
    pub config_sync_period: Option<Duration>,
    /// Accepted; the agent serves no profiling handler.
    #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub profiling: Option<bool>,
    /// Accepted; the agent has no hidden metrics.
    #[arg(long)]
    pub show_hidden_metrics_for_version: Option<String>,
}

impl Cli {
    /// Whether `--cleanup` was given.
    #[must_use]
    pub fn cleanup(&self) -> bool {
        self.cleanup.unwrap_or(false)
    }

    /// Whether `--init-only` was given.
    #[must_use]
    pub fn init_only(&self) -> bool {
        self.init_only.unwrap_or(false)
    }

    /// The kube-proxy flags given that `--config` replaces, by name: kube-proxy ignores them
    /// when a file is given, and the agent says so.
    #[must_use]
    pub fn replaced_by_config(&self) -> Vec<&'static str> {
        let given = [
            ("--feature-gates", !self.feature_gates.is_empty()),
            ("--proxy-mode", self.proxy_mode.is_some()),
            ("--bind-address", self.bind_address.is_some()),
            (
                "--healthz-bind-address",
                self.healthz_bind_address.is_some(),
            ),
            (
                "--metrics-bind-address",
                self.metrics_bind_address.is_some(),
            ),
            ("--healthz-port", self.healthz_port.is_some()),
            ("--metrics-port", self.metrics_port.is_some()),
            (
                "--bind-address-hard-fail",
                self.bind_address_hard_fail.is_some(),
            ),
            (
                "--iptables-sync-period",
                self.iptables_sync_period.is_some(),
            ),
            (
                "--iptables-min-sync-period",
                self.iptables_min_sync_period.is_some(),
            ),
            (
                "--iptables-masquerade-bit",
                self.iptables_masquerade_bit.is_some(),
            ),
            (
                "--iptables-localhost-nodeports",
                self.iptables_localhost_nodeports.is_some(),
            ),
            ("--masquerade-all", self.masquerade_all.is_some()),
            ("--cluster-cidr", !self.cluster_cidr.is_empty()),
            ("--detect-local-mode", self.detect_local_mode.is_some()),
            (
                "--pod-bridge-interface",
                self.pod_bridge_interface.is_some(),
            ),
            (
                "--pod-interface-name-prefix",
                self.pod_interface_name_prefix.is_some(),
            ),
            ("--nodeport-addresses", !self.nodeport_addresses.is_empty()),
            ("--ipvs-sync-period", self.ipvs_sync_period.is_some()),
            (
                "--ipvs-min-sync-period",
                self.ipvs_min_sync_period.is_some(),
            ),
            ("--ipvs-scheduler", self.ipvs_scheduler.is_some()),
            ("--ipvs-strict-arp", self.ipvs_strict_arp.is_some()),
            ("--ipvs-exclude-cidrs", !self.ipvs_exclude_cidrs.is_empty()),
            ("--ipvs-tcp-timeout", self.ipvs_tcp_timeout.is_some()),
            ("--ipvs-tcpfin-timeout", self.ipvs_tcpfin_timeout.is_some()),
            ("--ipvs-udp-timeout", self.ipvs_udp_timeout.is_some()),
            (
                "--conntrack-max-per-core",
                self.conntrack_max_per_core.is_some(),
            ),
            ("--conntrack-min", self.conntrack_min.is_some()),
            (
                "--conntrack-tcp-timeout-established",
                self.conntrack_tcp_timeout_established.is_some(),
            ),
            (
                "--conntrack-tcp-timeout-close-wait",
                self.conntrack_tcp_timeout_close_wait.is_some(),
            ),
            (
                "--conntrack-tcp-be-liberal",
                self.conntrack_tcp_be_liberal.is_some(),
            ),
            (
                "--conntrack-udp-timeout",
                self.conntrack_udp_timeout.is_some(),
            ),
            (
                "--conntrack-udp-timeout-stream",
                self.conntrack_udp_timeout_stream.is_some(),
            ),
            ("--oom-score-adj", self.oom_score_adj.is_some()),
            ("--kubeconfig", self.kubeconfig.is_some()),
            (
                "--kube-api-content-type",
                self.kube_api_content_type.is_some(),
            ),
            ("--kube-api-qps", self.kube_api_qps.is_some()),
            ("--kube-api-burst", self.kube_api_burst.is_some()),
            ("--config-sync-period", self.config_sync_period.is_some()),
            ("--profiling", self.profiling.is_some()),
            (
                "--show-hidden-metrics-for-version",
                self.show_hidden_metrics_for_version.is_some(),
            ),
        ];
        given
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect()
    }
}

/// The dataplane backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ProxyMode {
    /// iptables, programmed with iptables-restore.
    Iptables,
    /// IPVS, programmed over netlink, with ipsets and iptables for masquerade and filtering.
    Ipvs,
    /// nftables, one `kube-proxy` table per IP family, one `nft -f -` transaction per sync.
    Nftables,
    /// eBPF: cluster IPs balanced in the socket layer by programs on the node's cgroup v2 root.
    Ebpf,
}

impl ProxyMode {
    /// The name kube-proxy's configuration gives the mode.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Ipvs => "ipvs",
            Self::Nftables => "nftables",
            Self::Ebpf => "ebpf",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(flags: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(
            ["splitproxy-agent", "--controller", "http://c:1"]
                .iter()
                .chain(flags),
        )
    }

    #[test]
    fn controller_flag_repeats() {
        let cli = parse(&[
            "--controller",
            "http://b:1",
            "--hostname-override",
            "node-1",
        ])
        .expect("valid flags");
        assert_eq!(cli.controllers, ["http://c:1", "http://b:1"]);
        assert_eq!(cli.hostname_override.as_deref(), Some("node-1"));
        assert_eq!(cli.inspection_bind_address.to_string(), "127.0.0.1:10661");
    }

    #[test]
    fn a_controller_is_needed_unless_the_agent_only_cleans_writes_or_initialises() {
        assert!(Cli::try_parse_from(["splitproxy-agent"]).is_err());
        for alone in ["--cleanup", "--init-only", "--write-config-to=/tmp/c.yaml"] {
            let cli = Cli::try_parse_from(["splitproxy-agent", alone]).expect(alone);
            assert!(cli.controllers.is_empty());
        }
    }

    #[test]
    fn switches_take_kube_proxys_forms() {
        let cli = parse(&[
            "--masquerade-all",
            "--ipvs-strict-arp=false",
            "--cleanup=true",
        ])
        .expect("valid flags");
        assert_eq!(cli.masquerade_all, Some(true));
        assert_eq!(cli.ipvs_strict_arp, Some(false));
        assert!(cli.cleanup() && !cli.init_only());
        let cli = parse(&[
            "--iptables-localhost-nodeports=false",
            "-v",
            "2",
            "--oom-score-adj",
            "-500",
        ])
        .expect("valid flags");
        assert_eq!(cli.iptables_localhost_nodeports, Some(false));
        assert_eq!((cli.verbosity, cli.oom_score_adj), (Some(2), Some(-500)));
        assert_eq!(parse(&["--v=3"]).expect("valid flags").verbosity, Some(3));
    }

    #[test]
    fn malformed_values_are_usage_errors() {
        let err = parse(&["--iptables-sync-period", "30"]).expect_err("no unit");
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("missing unit"), "{err}");
        assert!(parse(&["--conntrack-udp-timeout", "-1s"]).is_err());
        for bad in ["10.244.0.0", "10.244.0.0/33", "pods"] {
            let err = parse(&["--cluster-cidr", bad]).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{bad}");
            // main exits 64 for errors that go to stderr.
            assert!(err.use_stderr());
        }
        assert!(parse(&["--nodeport-addresses", "198.18.0.11"]).is_err());
        assert!(parse(&["--proxy-mode", "userspace"]).is_err());
        assert!(parse(&["--no-such-flag"]).is_err());
    }
}
