//! kube-proxy's defaults for what a configuration leaves unset, as the pinned release applies
//! them (`SetDefaults_KubeProxyConfiguration`, then the Linux platform's), and the shape it
//! writes back: one sync period pair and one masquerade-all switch, those of the chosen mode.

use super::wire::{GoDuration, KubeProxyConfiguration};
use std::time::Duration;

/// kube-proxy's metrics port.
pub const METRICS_PORT: u16 = 10249;
/// kube-proxy's health-check port.
pub const HEALTHZ_PORT: u16 = 10256;
/// kube-proxy's OOM score adjustment (`qos.KubeProxyOOMScoreAdj`).
pub const OOM_SCORE_ADJ: i32 = -999;
/// The fwmark bit that marks packets for masquerading.
pub const MASQUERADE_BIT: i32 = 14;

/// Fills in what `config` leaves unset, as upstream does after decoding a file (and before its
/// flags apply when there is none); [`apply_platform`] comes after the flags.
pub fn apply(config: &mut KubeProxyConfiguration) {
    let seconds = |s| GoDuration(Duration::from_secs(s));
    if config.bind_address.is_empty() {
        "0.0.0.0".clone_into(&mut config.bind_address);
    }
    let ipv4 = config
        .bind_address
        .parse::<std::net::IpAddr>()
        .map_or(true, |ip| ip.is_ipv4());
    let (healthz_host, metrics_host) = if ipv4 {
        ("0.0.0.0", "127.0.0.1")
    } else {
        ("[::]", "[::1]")
    };
    config.healthz_bind_address =
        with_port(&config.healthz_bind_address, healthz_host, HEALTHZ_PORT);
    config.metrics_bind_address =
        with_port(&config.metrics_bind_address, metrics_host, METRICS_PORT);
    config.oom_score_adj.get_or_insert(OOM_SCORE_ADJ);
    for (period, default) in [
        (&mut config.iptables.sync_period, 30),
        (&mut config.iptables.min_sync_period, 1),
        (&mut config.ipvs.sync_period, 30),
        (&mut config.nftables.sync_period, 30),
        (&mut config.nftables.min_sync_period, 1),
    ] {
        if period.is_zero() {
            *period = seconds(default);
        }
    }
    config.iptables.localhost_node_ports.get_or_insert(true);
    config.iptables.masquerade_bit.get_or_insert(MASQUERADE_BIT);
    config.nftables.masquerade_bit.get_or_insert(MASQUERADE_BIT);
    config.conntrack.max_per_core.get_or_insert(32 * 1024);
    config.conntrack.min.get_or_insert(128 * 1024);
    config
        .conntrack
        .tcp_established_timeout
        .get_or_insert(seconds(24 * 3600));
    config
        .conntrack
        .tcp_close_wait_timeout
        .get_or_insert(seconds(3600));
    if config.config_sync_period.is_zero() {
        config.config_sync_period = seconds(15 * 60);
    }
    let client = &mut config.client_connection;
    if client.content_type.is_empty() {
        "application/vnd.kubernetes.protobuf".clone_into(&mut client.content_type);
    }
    if client.qps == 0.0 {
        client.qps = 5.0;
    }
    if client.burst == 0 {
        client.burst = 10;
    }
    if config.logging.format.is_empty() {
        "text".clone_into(&mut config.logging.format);
    }
    if config.logging.flush_frequency.duration.is_zero() {
        config.logging.flush_frequency.duration = Duration::from_secs(5);
    }
}

/// The Linux platform's defaults, applied after the flags: the iptables mode, node ports on
/// the primary IP in nftables mode (and in ebpf mode, which has no upstream default: the newer
/// mode's), and the `ClusterCIDR` local-traffic detector.
pub fn apply_platform(config: &mut KubeProxyConfiguration) {
    if config.mode.is_empty() {
        "iptables".clone_into(&mut config.mode);
    }
    if (config.mode == "nftables" || config.mode == "ebpf")
        && config
            .node_port_addresses
            .as_ref()
            .is_none_or(Vec::is_empty)
    {
        config.node_port_addresses = Some(vec!["primary".to_owned()]);
    }
    if config.detect_local_mode.is_empty() {
        "ClusterCIDR".clone_into(&mut config.detect_local_mode);
    }
}

/// `address` with `port` when it has none; `host:port` when it is empty.
fn with_port(address: &str, host: &str, port: u16) -> String {
    if address.is_empty() {
        return format!("{host}:{port}");
    }
    if address.parse::<std::net::SocketAddr>().is_ok() {
        return address.to_owned();
    }
    match address.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("[{ip}]:{port}"),
        Ok(std::net::IpAddr::V4(ip)) => format!("{ip}:{port}"),
        Err(_) => address.to_owned(),
    }
}

/// The configuration as upstream writes it back (`--write-config-to`): its internal form keeps
/// one sync period pair and one masquerade-all switch, so only the chosen mode's are written.
#[must_use]
pub fn as_written(config: &KubeProxyConfiguration) -> KubeProxyConfiguration {
    let mut written = config.clone();
    let (sync, min_sync) = (config.sync_period(), config.min_sync_period());
    let masquerade_all = config.masquerade_all();
    for period in [
        &mut written.iptables.sync_period,
        &mut written.iptables.min_sync_period,
        &mut written.ipvs.sync_period,
        &mut written.ipvs.min_sync_period,
        &mut written.nftables.sync_period,
        &mut written.nftables.min_sync_period,
    ] {
        *period = GoDuration::default();
    }
    written.iptables.masquerade_all = false;
    written.nftables.masquerade_all = false;
    match config.mode.as_str() {
        "ipvs" => {
            (written.ipvs.sync_period, written.ipvs.min_sync_period) = (sync, min_sync);
            written.iptables.masquerade_all = masquerade_all;
        }
        "nftables" => {
            (
                written.nftables.sync_period,
                written.nftables.min_sync_period,
            ) = (sync, min_sync);
            written.nftables.masquerade_all = masquerade_all;
        }
        _ => {
            (
                written.iptables.sync_period,
                written.iptables.min_sync_period,
            ) = (sync, min_sync);
            written.iptables.masquerade_all = masquerade_all;
        }
    }
    written
}

impl KubeProxyConfiguration {
    /// The sync period of the chosen mode.
    #[must_use]
    pub fn sync_period(&self) -> GoDuration {
        match self.mode.as_str() {
            "ipvs" => self.ipvs.sync_period,
            "nftables" => self.nftables.sync_period,
            _ => self.iptables.sync_period,
        }
    }

    /// The minimum sync period of the chosen mode.
    #[must_use]
    pub fn min_sync_period(&self) -> GoDuration {
        match self.mode.as_str() {
            "ipvs" => self.ipvs.min_sync_period,
            "nftables" => self.nftables.min_sync_period,
            _ => self.iptables.min_sync_period,
        }
    }

    /// Whether every cluster-IP packet is masqueraded: `nftables.masqueradeAll` in nftables
    /// mode, `iptables.masqueradeAll` in the others.
    #[must_use]
    pub fn masquerade_all(&self) -> bool {
        if self.mode == "nftables" {
            self.nftables.masquerade_all
        } else {
            self.iptables.masquerade_all
        }
    }
}
