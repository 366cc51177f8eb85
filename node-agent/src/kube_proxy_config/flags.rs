//! The configuration kube-proxy's flags make when no `--config` file is given: its defaults,
//! then each flag given, with upstream's quirks (the sync-period flags of the other mode are
//! ignored; the deprecated port flags only turn a server off).

use super::{
    defaults::{self, HEALTHZ_PORT, METRICS_PORT},
    resolve::{Invalid, InvalidConfiguration},
    wire::{API_VERSION, GoDuration, KIND, KubeProxyConfiguration},
};
use crate::{
    cli::{Cli, ProxyMode},
    node_port_addresses::NodePortAddress,
};
use splitproxy_dataplane::Cidr;

/// The configuration `cli`'s kube-proxy flags describe, defaults filled in (all but the
/// platform's, which come after the flags that also override a file).
///
/// # Errors
///
/// When a `--feature-gates` entry is not `Name=true|false`.
pub fn configuration(cli: &Cli) -> Result<KubeProxyConfiguration, InvalidConfiguration> {
    let mut config = KubeProxyConfiguration {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        ..KubeProxyConfiguration::default()
    };
    defaults::apply(&mut config);
    config.feature_gates = feature_gates(&cli.feature_gates)?;
    let mode = cli.proxy_mode.unwrap_or(ProxyMode::Iptables);
    if let Some(mode) = cli.proxy_mode {
        mode.name().clone_into(&mut config.mode);
    }
    // Upstream keeps one sync period pair, iptables' defaults until a flag of the mode's
    // family sets it.
    let (mut sync, mut min_sync) = (config.iptables.sync_period, config.iptables.min_sync_period);
    let (sync_flag, min_sync_flag) = if mode == ProxyMode::Ipvs {
        (cli.ipvs_sync_period, cli.ipvs_min_sync_period)
    } else {
        (cli.iptables_sync_period, cli.iptables_min_sync_period)
    };
    sync = sync_flag.map_or(sync, GoDuration);
    min_sync = min_sync_flag.map_or(min_sync, GoDuration);
    let masquerade_all = cli.masquerade_all.unwrap_or(false);
    match mode {
        ProxyMode::Iptables | ProxyMode::Ebpf => {
            (config.iptables.sync_period, config.iptables.min_sync_period) = (sync, min_sync);
            config.iptables.masquerade_all = masquerade_all;
        }
        ProxyMode::Ipvs => {
            (config.ipvs.sync_period, config.ipvs.min_sync_period) = (sync, min_sync);
            config.iptables.masquerade_all = masquerade_all;
        }
        ProxyMode::Nftables => {
            (config.nftables.sync_period, config.nftables.min_sync_period) = (sync, min_sync);
            config.nftables.masquerade_all = masquerade_all;
        }
    }
    set_addresses(cli, &mut config);
    let set = |target: &mut String, value: &Option<String>| {
        if let Some(value) = value {
            value.clone_into(target);
        }
    };
    set(
        &mut config.show_hidden_metrics_for_version,
        &cli.show_hidden_metrics_for_version,
    );
    set(&mut config.detect_local_mode, &cli.detect_local_mode);
    set(
        &mut config.detect_local.bridge_interface,
        &cli.pod_bridge_interface,
    );
    set(
        &mut config.detect_local.interface_name_prefix,
        &cli.pod_interface_name_prefix,
    );
    set(&mut config.ipvs.scheduler, &cli.ipvs_scheduler);
    set(&mut config.client_connection.kubeconfig, &cli.kubeconfig);
    set(
        &mut config.client_connection.content_type,
        &cli.kube_api_content_type,
    );
    if !cli.cluster_cidr.is_empty() {
        config.cluster_cidr = strings(&cli.cluster_cidr).join(",");
    }
    if !cli.nodeport_addresses.is_empty() {
        config.node_port_addresses = Some(
            cli.nodeport_addresses
                .iter()
                .map(|address| match address {
                    NodePortAddress::Primary => "primary".to_owned(),
                    NodePortAddress::Cidr(cidr) => cidr.to_string(),
                })
                .collect(),
        );
    }
    if !cli.ipvs_exclude_cidrs.is_empty() {
        config.ipvs.exclude_cidrs = Some(strings(&cli.ipvs_exclude_cidrs));
    }
    let flag = |target: &mut bool, value: Option<bool>| *target = value.unwrap_or(*target);
    flag(
        &mut config.bind_address_hard_fail,
        cli.bind_address_hard_fail,
    );
    flag(&mut config.enable_profiling, cli.profiling);
    flag(&mut config.ipvs.strict_arp, cli.ipvs_strict_arp);
    flag(
        &mut config.conntrack.tcp_be_liberal,
        cli.conntrack_tcp_be_liberal,
    );
    if let Some(ports) = cli.iptables_localhost_nodeports {
        config.iptables.localhost_node_ports = Some(ports);
    }
    let duration = |target: &mut GoDuration, value: Option<std::time::Duration>| {
        *target = value.map_or(*target, GoDuration);
    };
    duration(&mut config.ipvs.tcp_timeout, cli.ipvs_tcp_timeout);
    duration(&mut config.ipvs.tcp_fin_timeout, cli.ipvs_tcpfin_timeout);
    duration(&mut config.ipvs.udp_timeout, cli.ipvs_udp_timeout);
    duration(&mut config.conntrack.udp_timeout, cli.conntrack_udp_timeout);
    duration(
        &mut config.conntrack.udp_stream_timeout,
        cli.conntrack_udp_timeout_stream,
    );
    duration(&mut config.config_sync_period, cli.config_sync_period);
    let conntrack = &mut config.conntrack;
    for (target, value) in [
        (
            &mut conntrack.tcp_established_timeout,
            cli.conntrack_tcp_timeout_established,
        ),
        (
            &mut conntrack.tcp_close_wait_timeout,
            cli.conntrack_tcp_timeout_close_wait,
        ),
    ] {
        if let Some(value) = value {
            *target = Some(GoDuration(value));
        }
    }
    for (target, value) in [
        (&mut conntrack.max_per_core, cli.conntrack_max_per_core),
        (&mut conntrack.min, cli.conntrack_min),
        (&mut config.oom_score_adj, cli.oom_score_adj),
        (
            &mut config.iptables.masquerade_bit,
            cli.iptables_masquerade_bit,
        ),
    ] {
        if value.is_some() {
            *target = value;
        }
    }
    config.client_connection.qps = cli.kube_api_qps.unwrap_or(config.client_connection.qps);
    config.client_connection.burst = cli.kube_api_burst.unwrap_or(config.client_connection.burst);
    Ok(config)
}

/// `--bind-address`, `--healthz-bind-address`, `--metrics-bind-address` and the deprecated port
/// flags. Empty values change nothing, as upstream's; an IP alone takes the default port.
fn set_addresses(cli: &Cli, config: &mut KubeProxyConfiguration) {
    fn given(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|text| !text.is_empty())
    }
    if let Some(ip) = given(&cli.bind_address) {
        ip.clone_into(&mut config.bind_address);
    }
    for (target, flag, port_flag, default_port) in [
        (
            &mut config.healthz_bind_address,
            &cli.healthz_bind_address,
            cli.healthz_port,
            HEALTHZ_PORT,
        ),
        (
            &mut config.metrics_bind_address,
            &cli.metrics_bind_address,
            cli.metrics_port,
            METRICS_PORT,
        ),
    ] {
        // As upstream, the deprecated port flags do not apply to --write-config-to.
        let port_flag = port_flag.filter(|_| cli.write_config_to.is_none());
        if let Some(address) = given(flag) {
            *target = match address.parse::<std::net::IpAddr>() {
                Ok(ip) => {
                    let port = port_flag.filter(|&port| port != 0).unwrap_or(default_port);
                    std::net::SocketAddr::new(ip, port).to_string()
                }
                Err(_) => address.to_owned(),
            };
        }
        if port_flag == Some(0) {
            target.clear();
        }
    }
}

/// Applies the flags that win over a `--config` file too: `--hostname-override`, `-v` and
/// `--logging-format`.
///
/// # Errors
///
/// When `--hostname-override` is given but blank.
pub fn override_file(
    cli: &Cli,
    config: &mut KubeProxyConfiguration,
) -> Result<(), InvalidConfiguration> {
    if let Some(name) = &cli.hostname_override
        && !name.is_empty()
    {
        let name = name.trim();
        if name.is_empty() {
            return Err(InvalidConfiguration(vec![Invalid {
                field: "hostnameOverride".to_owned(),
                flag: Some("--hostname-override"),
                message: "must not be blank".to_owned(),
            }]));
        }
        config.hostname_override = name.to_lowercase();
    }
    if let Some(verbosity) = cli.verbosity {
        config.logging.verbosity = verbosity;
    }
    if let Some(format) = &cli.logging_format {
        format.clone_into(&mut config.logging.format);
    }
    Ok(())
}

fn strings(items: &[Cidr]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

fn feature_gates(
    entries: &[String],
) -> Result<std::collections::BTreeMap<String, bool>, InvalidConfiguration> {
    let mut gates = std::collections::BTreeMap::new();
    let mut invalid = Vec::new();
    for entry in entries.iter().filter(|entry| !entry.trim().is_empty()) {
        let parsed = entry
            .split_once('=')
            .and_then(|(name, value)| Some((name.trim(), value.trim().parse::<bool>().ok()?)));
        match parsed {
            Some((name, value)) => {
                gates.insert(name.to_owned(), value);
            }
            None => invalid.push(Invalid {
                field: "featureGates".to_owned(),
                flag: Some("--feature-gates"),
                message: format!("{entry:?} is not Name=true or Name=false"),
            }),
        }
    }
    if invalid.is_empty() {
        Ok(gates)
    } else {
        Err(InvalidConfiguration(invalid))
    }
}
