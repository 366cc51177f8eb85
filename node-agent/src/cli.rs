//! Command-line flags, named as kube-proxy names them where the meaning is the same.

use crate::node_port_addresses::NodePortAddress;
use crate::runner::{InvalidPeriods, SyncPeriods};
use clap::{CommandFactory, Parser, ValueEnum, error::ErrorKind};
use splitproxy_dataplane::{Cidr, iptables::RenderOptions, ipvs::Timeouts};
use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

/// Programs this node's Services from the splitproxy controller's stream.
#[derive(Debug, Parser)]
#[command(name = "splitproxy-agent", version, about)]
pub struct Cli {
    /// Controller URL (e.g. https://10.0.0.1:10660); repeat to list several, tried in turn.
    #[arg(
        long = "controller",
        env = "SPLITPROXY_CONTROLLERS",
        value_delimiter = ',',
        required_unless_present = "cleanup"
    )]
    pub controllers: Vec<String>,
    /// File holding the token that proves this node's identity to controllers (a Pod-bound
    /// ServiceAccount token for the controller's audience, or a static token); read again on
    /// every connection, as the kubelet rotates it.
    #[arg(long, env = "SPLITPROXY_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// PEM CA certificates that `https://` controllers' certificates must chain to.
    #[arg(long, env = "SPLITPROXY_CONTROLLER_CA_FILE")]
    pub controller_ca_file: Option<std::path::PathBuf>,
    /// Remove every iptables rule of kube-proxy's layout (splitproxy's, and an iptables-mode
    /// kube-proxy's leftovers) in both IP families, then exit.
    #[arg(long)]
    pub cleanup: bool,
    /// The node name to program; defaults to the host name.
    #[arg(long, env = "NODE_NAME")]
    pub hostname_override: Option<String>,
    /// Which dataplane programs the kernel.
    #[arg(
        long,
        env = "SPLITPROXY_PROXY_MODE",
        value_enum,
        default_value_t = ProxyMode::Iptables
    )]
    pub proxy_mode: ProxyMode,
    /// The IPVS scheduler of every virtual server in IPVS mode (rr, wrr, lc, wlc, lblc, lblcr,
    /// sh, dh, sed, nq, mh); its kernel module `ip_vs_<name>` must be available.
    #[arg(long, env = "SPLITPROXY_IPVS_SCHEDULER", default_value = "rr")]
    pub ipvs_scheduler: String,
    /// In IPVS mode, answer ARP only for addresses on the interface asked
    /// (`arp_ignore=1`, `arp_announce=2`), so the Service addresses bound to `kube-ipvs0` are
    /// not announced on the node's network; needed by load balancers such as MetalLB.
    #[arg(long, env = "SPLITPROXY_IPVS_STRICT_ARP")]
    pub ipvs_strict_arp: bool,
    /// In IPVS mode, CIDRs whose IPVS virtual servers the agent never deletes, comma-separated:
    /// other programs' virtual servers on the node's own addresses.
    #[arg(long, env = "SPLITPROXY_IPVS_EXCLUDE_CIDRS", value_delimiter = ',')]
    pub ipvs_exclude_cidrs: Vec<Cidr>,
    /// In IPVS mode, how long an idle established TCP connection stays in IPVS's table; `0`
    /// (the default) leaves the kernel's value. Go duration syntax, whole seconds (`15m`).
    #[arg(
        long,
        env = "SPLITPROXY_IPVS_TCP_TIMEOUT",
        default_value = "0",
        value_parser = parse_duration
    )]
    pub ipvs_tcp_timeout: Duration,
    /// In IPVS mode, how long a TCP connection stays in IPVS's table after a FIN; `0` (the
    /// default) leaves the kernel's value.
    #[arg(
        long,
        env = "SPLITPROXY_IPVS_TCPFIN_TIMEOUT",
        default_value = "0",
        value_parser = parse_duration
    )]
    pub ipvs_tcpfin_timeout: Duration,
    /// In IPVS mode, how long an idle UDP flow stays in IPVS's table; `0` (the default) leaves
    /// the kernel's value.
    #[arg(
        long,
        env = "SPLITPROXY_IPVS_UDP_TIMEOUT",
        default_value = "0",
        value_parser = parse_duration
    )]
    pub ipvs_udp_timeout: Duration,
    /// Address of `/metrics` and `/proxyMode`.
    #[arg(
        long,
        env = "SPLITPROXY_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10249"
    )]
    pub metrics_bind_address: SocketAddr,
    /// Address of `/healthz` and `/livez`.
    #[arg(
        long,
        env = "SPLITPROXY_HEALTHZ_BIND_ADDRESS",
        default_value = "0.0.0.0:10256"
    )]
    pub healthz_bind_address: SocketAddr,
    /// Address of the gRPC inspection server (with reflection, for grpcurl).
    #[arg(
        long,
        env = "SPLITPROXY_INSPECTION_BIND_ADDRESS",
        default_value = "127.0.0.1:10661"
    )]
    pub inspection_bind_address: SocketAddr,
    /// The longest time between two syncs of the node's rules: a full resync repairs what was
    /// changed behind the agent's back. `/healthz` fails when a revision waits twice this long.
    /// Go duration syntax (`30s`, `1m`, `1h30m`).
    #[arg(
        long,
        env = "SPLITPROXY_IPTABLES_SYNC_PERIOD",
        default_value = "30s",
        value_parser = parse_duration
    )]
    pub iptables_sync_period: Duration,
    /// The shortest time between two syncs of the node's rules; a revision that arrives sooner
    /// waits. At most --iptables-sync-period. Go duration syntax (`1s`, `500ms`).
    #[arg(
        long,
        env = "SPLITPROXY_IPTABLES_MIN_SYNC_PERIOD",
        default_value = "1s",
        value_parser = parse_duration
    )]
    pub iptables_min_sync_period: Duration,
    /// The cluster's pod CIDRs, comma-separated, at most one per IP family (e.g.
    /// `10.244.0.0/16,fd00:10:244::/56`). Cluster-IP traffic from outside them is masqueraded,
    /// and pod traffic to an externalTrafficPolicy Local node port, external IP or load-balancer
    /// IP reaches every endpoint. Each IP family's rules use the first CIDR of that family. Unset: traffic
    /// from outside the cluster to a cluster IP is not masqueraded.
    #[arg(long, env = "SPLITPROXY_CLUSTER_CIDR", value_delimiter = ',')]
    pub cluster_cidr: Vec<Cidr>,
    /// Masquerade every packet sent to a cluster IP, whatever its source.
    #[arg(long, env = "SPLITPROXY_MASQUERADE_ALL")]
    pub masquerade_all: bool,
    /// Which node addresses accept node-port traffic, comma-separated: CIDRs (the node's
    /// addresses inside them, e.g. `198.18.0.0/24`) or `primary` (the node's primary IP).
    /// Unset: every local address (the primary IP in nftables mode, as upstream). Read when the
    /// agent starts.
    #[arg(
        long = "nodeport-addresses",
        env = "SPLITPROXY_NODEPORT_ADDRESSES",
        value_delimiter = ','
    )]
    pub nodeport_addresses: Vec<NodePortAddress>,
    /// This node's primary IP, as kube-proxy's flag of the same name overrides it (no socket is
    /// bound to it): `--nodeport-addresses primary` selects it, and when a Service's
    /// loadBalancerSourceRanges hold it the node may reach the load-balancer IPs it holds as
    /// local addresses. Unset (or 0.0.0.0): the address the node reaches the first controller
    /// from.
    #[arg(long, env = "SPLITPROXY_BIND_ADDRESS")]
    pub bind_address: Option<IpAddr>,
}

impl Cli {
    /// What `--cluster-cidr` and `--masquerade-all` ask of the rules, with the node-port
    /// addresses `--nodeport-addresses` resolved to (`None`: every local address) and the node's
    /// primary IP.
    #[must_use]
    pub fn render_options(
        &self,
        node_port_addresses: Option<Vec<IpAddr>>,
        primary_ip: Option<IpAddr>,
    ) -> RenderOptions {
        RenderOptions::default()
            .with_cluster_cidrs(self.cluster_cidr.iter().copied())
            .with_masquerade_all(self.masquerade_all)
            .with_node_port_addresses(node_port_addresses)
            .with_node_ips(primary_ip)
    }

    /// The IPVS connection timeouts the flags set, in seconds (rounded down, as kube-proxy
    /// passes them); `0` sets none.
    #[must_use]
    pub fn ipvs_timeouts(&self) -> Timeouts {
        let seconds = |duration: Duration| {
            let seconds = u32::try_from(duration.as_secs()).unwrap_or(u32::MAX);
            (seconds > 0).then_some(seconds)
        };
        Timeouts {
            tcp: seconds(self.ipvs_tcp_timeout),
            tcp_fin: seconds(self.ipvs_tcpfin_timeout),
            udp: seconds(self.ipvs_udp_timeout),
        }
    }

    /// The node's primary IP: `--bind-address` when it names one, else the address the node
    /// reaches the first controller from.
    ///
    /// # Errors
    ///
    /// If neither tells.
    pub fn primary_ip(&self) -> std::io::Result<IpAddr> {
        match self.bind_address {
            Some(ip) if !ip.is_unspecified() => Ok(ip),
            _ => crate::node_port_addresses::primary_toward(
                self.controllers.first().map_or("", String::as_str),
            ),
        }
    }

    /// The sync periods, checked against each other as kube-proxy checks them.
    ///
    /// # Errors
    ///
    /// Returns a clap validation error (exit code 64 in `main`) when `--iptables-sync-period` is
    /// zero or shorter than `--iptables-min-sync-period`.
    pub fn sync_periods(&self) -> Result<SyncPeriods, clap::Error> {
        SyncPeriods::new(self.iptables_sync_period, self.iptables_min_sync_period).map_err(|err| {
            let message = match err {
                InvalidPeriods::ZeroSyncPeriod => {
                    "--iptables-sync-period must be greater than 0".to_owned()
                }
                InvalidPeriods::MinAboveSync { sync, min } => format!(
                    "--iptables-min-sync-period ({min:?}) must not be greater than \
                     --iptables-sync-period ({sync:?})"
                ),
            };
            Self::command().error(ErrorKind::ValueValidation, message)
        })
    }
}

/// Why a duration flag does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDuration {
    /// The text is not a Go duration (`1h30m`, `500ms`, `1.5s`).
    #[error("not a duration (expected e.g. 30s, 1m, 500ms, 1h30m)")]
    Malformed,
    /// A number has no unit.
    #[error("missing unit (one of ns, us, ms, s, m, h)")]
    MissingUnit,
    /// A unit is not one of Go's.
    #[error("unknown unit {0:?} (one of ns, us, ms, s, m, h)")]
    UnknownUnit(String),
    /// The duration is below zero.
    #[error("must not be negative")]
    Negative,
    /// The duration does not fit Go's range (about 292 years).
    #[error("too long")]
    Overflow,
}

/// Parses a duration in Go's `time.ParseDuration` syntax, as kube-proxy's flags take it: an
/// optional sign, then one or more decimal numbers each with a unit (`ns`, `us`/`µs`, `ms`, `s`,
/// `m`, `h`), e.g. `30s`, `1m`, `500ms`, `1h30m`, `1.5h`; `0` needs no unit.
///
/// # Errors
///
/// Returns [`InvalidDuration`] for anything else, for negative durations and for durations
/// beyond Go's range.
pub fn parse_duration(text: &str) -> Result<Duration, InvalidDuration> {
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(InvalidDuration::Malformed);
    }
    let digits = |s: &str| s.bytes().take_while(u8::is_ascii_digit).count();
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let (whole, after) = rest.split_at(digits(rest));
        let (fraction, after) = match after.strip_prefix('.') {
            Some(after) => after.split_at(digits(after)),
            None => ("", after),
        };
        if whole.is_empty() && fraction.is_empty() {
            return Err(InvalidDuration::Malformed);
        }
        let unit_len = after
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "" => return Err(InvalidDuration::MissingUnit),
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 60 * 60 * 1_000_000_000,
            other => return Err(InvalidDuration::UnknownUnit(other.to_owned())),
        };
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| InvalidDuration::Overflow)?
        };
        // Digits past the 18th are below a nanosecond of any unit; drop them as Go does.
        let fraction = &fraction[..fraction.len().min(18)];
        let fraction_nanos = if fraction.is_empty() {
            0
        } else {
            let value: u128 = fraction.parse().map_err(|_| InvalidDuration::Malformed)?;
            value * unit_nanos / 10u128.pow(u32::try_from(fraction.len()).unwrap_or(18))
        };
        nanos = whole
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(fraction_nanos))
            .and_then(|n| n.checked_add(nanos))
            .ok_or(InvalidDuration::Overflow)?;
        rest = after;
    }
    let nanos = u64::try_from(nanos)
        .ok()
        .filter(|n| i64::try_from(*n).is_ok())
        .ok_or(InvalidDuration::Overflow)?;
    if negative && nanos > 0 {
        return Err(InvalidDuration::Negative);
    }
    Ok(Duration::from_nanos(nanos))
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_kube_proxy() {
        let cli = Cli::try_parse_from(["splitproxy-agent", "--controller", "http://c:1"])
            .expect("valid flags");
        assert_eq!(cli.metrics_bind_address.to_string(), "127.0.0.1:10249");
        assert_eq!(cli.healthz_bind_address.to_string(), "0.0.0.0:10256");
        assert_eq!(cli.inspection_bind_address.to_string(), "127.0.0.1:10661");
        assert_eq!(cli.proxy_mode, ProxyMode::Iptables);
    }

    #[test]
    fn controller_flag_repeats() {
        let cli = Cli::try_parse_from([
            "splitproxy-agent",
            "--controller",
            "http://a:1",
            "--controller",
            "http://b:1",
            "--hostname-override",
            "node-1",
        ])
        .expect("valid flags");
        assert_eq!(cli.controllers, ["http://a:1", "http://b:1"]);
        assert_eq!(cli.hostname_override.as_deref(), Some("node-1"));
    }

    fn parse(flags: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(
            ["splitproxy-agent", "--controller", "http://c:1"]
                .iter()
                .chain(flags),
        )
    }

    #[test]
    fn ipvs_timeouts_are_left_alone_unless_set() {
        assert!(parse(&[]).expect("valid flags").ipvs_timeouts().is_unset());
        let cli = parse(&["--ipvs-tcp-timeout", "15m", "--ipvs-udp-timeout", "90.5s"])
            .expect("valid flags");
        assert_eq!(
            cli.ipvs_timeouts(),
            Timeouts {
                tcp: Some(900),
                tcp_fin: None,
                udp: Some(90),
            }
        );
    }

    #[test]
    fn sync_periods_default_to_kube_proxys() {
        let cli = parse(&[]).expect("valid flags");
        assert_eq!(cli.iptables_sync_period, Duration::from_secs(30));
        assert_eq!(cli.iptables_min_sync_period, Duration::from_secs(1));
        assert_eq!(
            cli.sync_periods().expect("valid periods"),
            SyncPeriods::default()
        );
    }

    #[test]
    fn sync_period_flags_take_go_durations() {
        let cli = parse(&[
            "--iptables-sync-period",
            "1h30m",
            "--iptables-min-sync-period",
            "500ms",
        ])
        .expect("valid flags");
        let periods = cli.sync_periods().expect("valid periods");
        assert_eq!(periods.sync_period(), Duration::from_secs(90 * 60));
        assert_eq!(periods.min_sync_period(), Duration::from_millis(500));
        assert_eq!(periods.health_timeout(), Duration::from_secs(3 * 60 * 60));
    }

    #[test]
    fn a_min_sync_period_above_the_sync_period_is_a_usage_error() {
        let cli = parse(&[
            "--iptables-sync-period",
            "1m",
            "--iptables-min-sync-period",
            "2m",
        ])
        .expect("each flag parses alone");
        let err = cli.sync_periods().expect_err("min above sync is refused");
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        // main exits 64 for errors that go to stderr.
        assert!(err.use_stderr());
        let text = err.to_string();
        assert!(
            text.contains("--iptables-min-sync-period (120s) must not be greater than --iptables-sync-period (60s)"),
            "{text}"
        );
    }

    #[test]
    fn a_zero_sync_period_is_a_usage_error() {
        let cli = parse(&[
            "--iptables-sync-period",
            "0",
            "--iptables-min-sync-period",
            "0s",
        ])
        .expect("each flag parses alone");
        let err = cli
            .sync_periods()
            .expect_err("a zero sync period is refused");
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(
            err.to_string()
                .contains("--iptables-sync-period must be greater than 0"),
            "{err}"
        );
    }

    #[test]
    fn a_malformed_sync_period_is_refused_while_parsing() {
        let err = parse(&["--iptables-sync-period", "30"]).expect_err("no unit");
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        assert!(err.to_string().contains("missing unit"), "{err}");
        assert!(parse(&["--iptables-min-sync-period", "-1s"]).is_err());
    }

    #[test]
    fn go_durations_parse() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        for (text, expected) in [
            ("30s", s(30)),
            ("1m", s(60)),
            ("500ms", ms(500)),
            ("1h30m", s(5400)),
            ("2h45m30.5s", ms((2 * 3600 + 45 * 60 + 30) * 1000 + 500)),
            ("1.5h", s(5400)),
            (".5s", ms(500)),
            ("1.s", s(1)),
            ("+2s", s(2)),
            ("0", Duration::ZERO),
            ("-0", Duration::ZERO),
            ("0s", Duration::ZERO),
            ("100ns", Duration::from_nanos(100)),
            ("3us", Duration::from_micros(3)),
            ("3\u{b5}s", Duration::from_micros(3)),
            ("3\u{3bc}s", Duration::from_micros(3)),
            ("1m0.000000001s", Duration::new(60, 1)),
            (
                "0.1234567891234567891234s",
                Duration::from_nanos(123_456_789),
            ),
        ] {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn malformed_go_durations_are_refused() {
        for (text, expected) in [
            ("", InvalidDuration::Malformed),
            ("-", InvalidDuration::Malformed),
            ("s", InvalidDuration::Malformed),
            (".s", InvalidDuration::Malformed),
            ("1", InvalidDuration::MissingUnit),
            ("1.5.3s", InvalidDuration::MissingUnit),
            ("1h30", InvalidDuration::MissingUnit),
            ("10x", InvalidDuration::UnknownUnit("x".into())),
            ("1 s", InvalidDuration::UnknownUnit(" s".into())),
            ("1d", InvalidDuration::UnknownUnit("d".into())),
            ("-1s", InvalidDuration::Negative),
            ("3000000h", InvalidDuration::Overflow),
            (
                "99999999999999999999999999999999999999999s",
                InvalidDuration::Overflow,
            ),
        ] {
            assert_eq!(parse_duration(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn cluster_cidr_and_masquerade_all_default_to_kube_proxys() {
        let cli = parse(&[]).expect("valid flags");
        assert!(cli.cluster_cidr.is_empty());
        assert!(!cli.masquerade_all);
        assert_eq!(cli.render_options(None, None), RenderOptions::default());
    }

    #[test]
    fn cluster_cidr_takes_a_comma_separated_list_and_masquerade_all_is_a_switch() {
        let cli = parse(&[
            "--cluster-cidr",
            "10.244.0.0/16,fd00:10:244::/56",
            "--masquerade-all",
        ])
        .expect("valid flags");
        let cidrs: Vec<Cidr> = ["10.244.0.0/16", "fd00:10:244::/56"]
            .iter()
            .map(|text| text.parse().expect("valid CIDR"))
            .collect();
        assert_eq!(cli.cluster_cidr, cidrs);
        assert_eq!(
            cli.render_options(None, None),
            RenderOptions::default()
                .with_cluster_cidrs(cidrs)
                .with_masquerade_all(true)
        );
    }

    #[test]
    fn the_primary_ip_is_the_node_ip_of_the_rules() {
        let cli = parse(&["--bind-address", "198.18.0.11"]).expect("valid flags");
        let primary = cli.primary_ip().ok();
        assert_eq!(
            cli.render_options(None, primary),
            RenderOptions::default().with_node_ips(["198.18.0.11".parse().expect("an IP")])
        );
        assert!(parse(&["--bind-address", "node-1"]).is_err());
    }

    #[test]
    fn an_invalid_cluster_cidr_is_a_usage_error() {
        for bad in ["10.244.0.0", "10.244.0.0/33", "pods", "10.244.0.0/16,"] {
            let err = parse(&["--cluster-cidr", bad]).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::ValueValidation, "{bad}");
            // main exits 64 for errors that go to stderr.
            assert!(err.use_stderr());
        }
        let err = parse(&["--cluster-cidr", "10.244.0.0/33"]).expect_err("prefix too long");
        assert!(err.to_string().contains("invalid CIDR"), "{err}");
    }

    #[test]
    fn a_controller_is_required_and_unknown_modes_are_refused() {
        assert!(Cli::try_parse_from(["splitproxy-agent"]).is_err());
        assert!(
            Cli::try_parse_from([
                "splitproxy-agent",
                "--controller",
                "http://a:1",
                "--proxy-mode",
                "userspace"
            ])
            .is_err()
        );
    }

    #[test]
    fn nodeport_addresses_take_cidrs_and_primary_and_refuse_bare_ips() {
        let cli = parse(&["--nodeport-addresses", "198.18.0.0/24,primary"]).expect("valid");
        assert_eq!(
            cli.nodeport_addresses,
            [
                NodePortAddress::Cidr("198.18.0.0/24".parse().expect("valid CIDR")),
                NodePortAddress::Primary
            ]
        );
        assert!(parse(&[]).expect("valid").nodeport_addresses.is_empty());
        assert!(parse(&["--nodeport-addresses", "198.18.0.11"]).is_err());
    }

    #[test]
    fn the_primary_ip_is_the_bind_address_or_the_route_to_the_controller() {
        let named = parse(&["--bind-address", "198.18.0.11"]).expect("valid");
        assert_eq!(named.primary_ip().ok(), "198.18.0.11".parse().ok());
        let unspecified = Cli::try_parse_from([
            "splitproxy-agent",
            "--controller",
            "http://127.0.0.1:10660",
            "--bind-address",
            "0.0.0.0",
        ])
        .expect("valid");
        assert_eq!(unspecified.primary_ip().ok(), "127.0.0.1".parse().ok());
    }

    #[test]
    fn cleanup_needs_no_controller_and_the_agent_otherwise_does() {
        let cleanup = Cli::try_parse_from(["splitproxy-agent", "--cleanup"]).expect("valid");
        assert!(cleanup.cleanup && cleanup.controllers.is_empty());
        assert!(Cli::try_parse_from(["splitproxy-agent"]).is_err());
    }
}
