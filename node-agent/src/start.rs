//! From a resolved configuration to a running agent: the node's sysctls, the node's options, the
//! controllers to reach, and the backend of the chosen proxy mode.

use crate::{
    Config, cleanup,
    cli::{Cli, ProxyMode},
    client::{ClientConfig, Controllers},
    config_watch,
    credentials::Credentials,
    discovery::{ControllerService, Discovery},
    host_setup,
    kube_proxy_config::{LocalDetector, Settings},
    node_port_addresses::{
        NodePortSelection, includes_ipv4_loopback, needs_primary, primary_toward,
    },
    wire_mode,
};
use splitproxy_dataplane::{
    Dataplane, Families, NodeOptions,
    ebpf::{self, EbpfBackend},
    iptables::{self, IptablesBackend},
    ipvs::backend::{self as ipvs, IpvsBackend},
    local_traffic::PodInterfaces,
    nftables::{NftablesBackend, backend as nftables},
};
use std::{net::IpAddr, process::ExitCode, time::Duration};
use tracing::Instrument;

/// Sets the node's sysctls as kube-proxy does. What the kernel refuses is a warning (the rules
/// work without it), but under `--init-only`, whose job it is, anything beyond the conntrack
/// table's size (which only the host's network namespace may change) fails.
pub fn set_up_node(settings: &Settings, init_only: bool) -> Result<(), ExitCode> {
    let paths = host_setup::Paths::default();
    let mut applied = host_setup::set_conntrack_sysctls(&settings.conntrack, &paths);
    if localhost_node_ports(settings, settings.bind_address) {
        tracing::info!(
            "setting route_localnet=1 for node ports on 127.0.0.1; iptables.localhostNodePorts \
             false (--iptables-localhost-nodeports=false) or nodePortAddresses without \
             loopback turn them off"
        );
        applied = applied.and_then(|mut applied| {
            let localnet = host_setup::set_route_localnet(&paths)?;
            applied.changed.extend(localnet.changed);
            applied.refused.extend(localnet.refused);
            Ok(applied)
        });
    }
    let applied = applied.map_err(|err| {
        tracing::error!(
            error = format!("{:#}", anyhow::Error::from(err)),
            "could not set the node's sysctls"
        );
        ExitCode::FAILURE
    })?;
    for sysctl in applied.changed {
        tracing::info!(sysctl = sysctl.name, value = sysctl.value, "set");
    }
    let mut failed = false;
    for refused in applied.refused {
        let fatal = init_only && !refused.is_table_size();
        let error = format!("{:#}", anyhow::Error::from(refused));
        if fatal {
            tracing::error!(
                error,
                "the kernel refused a sysctl --init-only is there to set"
            );
            failed = true;
        } else {
            tracing::warn!(
                error,
                "the kernel refused a sysctl kube-proxy sets; leaving it (read-only /proc/sys: \
                 run `splitproxy-agent --init-only` in a privileged init container, as deploy/ \
                 does; nf_conntrack_max outside the host's network namespace: set \
                 conntrack.maxPerCore to 0)"
            );
        }
    }
    if failed {
        Err(ExitCode::FAILURE)
    } else {
        Ok(())
    }
}

/// Mounts the ebpf mode's BPF filesystem for `--init-only`. The init container is privileged
/// and mounts the node's folder with Bidirectional propagation (deploy/ebpf), so a filesystem
/// mounted here is the node's and the pins in it outlive the agent's container.
pub fn set_up_bpffs(bpf_root: &std::path::Path) -> Result<(), ExitCode> {
    ebpf::kernel::ensure_bpffs(bpf_root).map_err(|err| {
        tracing::error!(
            error = format!("{:#}", anyhow::Error::from(err)),
            "could not mount the ebpf mode's BPF filesystem"
        );
        ExitCode::FAILURE
    })
}

/// Runs the agent until it fails or is interrupted.
pub async fn run_agent(cli: Cli, settings: Settings, node_name: String) -> anyhow::Result<()> {
    let config_file = cli.config.clone();
    let (cluster_cidrs, pod_interfaces) = match &settings.local_detector {
        LocalDetector::ClusterCidr(cidrs) => (cidrs.clone(), None),
        LocalDetector::BridgeInterface(name) => {
            (Vec::new(), Some(PodInterfaces::Bridge(name.clone())))
        }
        LocalDetector::InterfaceNamePrefix(prefix) => {
            (Vec::new(), Some(PodInterfaces::Prefix(prefix.clone())))
        }
        // Filled in from the Node's podCIDRs, which the controller sends.
        LocalDetector::NodeCidr => (Vec::new(), None),
    };
    let controllers = match cli.controller_service.clone() {
        Some(service) => {
            let discovery = Discovery::new(
                settings.kubeconfig.as_deref(),
                cli.master.as_deref(),
                service,
            )
            .await
            .map_err(|err| {
                anyhow::Error::from(err).context("finding the controllers through their Service")
            })?;
            tracing::info!(
                api_server = discovery.api_server(),
                service = %discovery.service().server_name(),
                "finding the controllers through the API server"
            );
            Controllers::Discovered(discovery)
        }
        None => Controllers::Listed(cli.controllers),
    };
    // Without --bind-address: the address the node reaches its controllers (or the API server
    // listing them) from.
    let toward = match &controllers {
        Controllers::Listed(urls) => urls.first().map_or("", String::as_str),
        Controllers::Discovered(discovery) => discovery.api_server(),
    };
    let primary_ip = match settings.bind_address {
        Some(ip) => Some(ip),
        None => match primary_toward(toward) {
            Ok(ip) => Some(ip),
            Err(err) => {
                tracing::warn!(error = %err, "cannot tell the node's primary IP; set --bind-address");
                None
            }
        },
    };
    let node_port_selection = node_port_selection(&settings, primary_ip)
        .map_err(|err| anyhow::anyhow!("cannot resolve --nodeport-addresses: {err}"))?;
    let node_port_addresses = node_port_selection
        .resolve()
        .map_err(|err| anyhow::anyhow!("cannot resolve --nodeport-addresses: {err}"))?;
    if let Some(addresses) = &node_port_addresses {
        tracing::info!(?addresses, "node ports accepted on");
    }
    let render = NodeOptions::default()
        .with_cluster_cidrs(cluster_cidrs)
        .with_pod_interfaces(pod_interfaces)
        .with_masquerade_all(settings.masquerade_all)
        .with_masquerade_bit(settings.masquerade_bit)
        .with_node_port_addresses(node_port_addresses.clone())
        .with_node_ips(primary_ip)
        .with_localhost_node_ports(localhost_node_ports(&settings, primary_ip))
        .with_tcp_be_liberal(host_setup::tcp_be_liberal());
    let iptables = iptables::Config::default()
        .with_node_options(render)
        .with_canary_interval(settings.sync_periods.sync_period());
    let ipvs = ipvs::Config {
        families: Families::default(),
        scheduler: settings.ipvs.scheduler.clone(),
        exclude_cidrs: settings.ipvs.exclude_cidrs.clone(),
        node_port_addresses: node_port_addresses.clone(),
        strict_arp: settings.ipvs.strict_arp,
        timeouts: settings.ipvs.timeouts,
        iptables: iptables.clone(),
        ipset: "ipset".to_owned(),
    };
    let config = Config {
        client: ClientConfig {
            credentials: Credentials {
                token_file: cli.token_file,
                ca_file: cli.controller_ca_file,
                server_name: cli
                    .controller_service
                    .as_ref()
                    .map(ControllerService::server_name),
            },
            controllers,
            node_name,
            proxy_mode: wire_mode(settings.mode),
            min_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
        },
        sync_periods: settings.sync_periods,
        metrics_bind_address: settings.metrics_bind_address,
        healthz_bind_address: settings.healthz_bind_address,
        bind_address_hard_fail: settings.bind_address_hard_fail,
        inspection_bind_address: cli.inspection_bind_address,
        node_cidr_detector: settings.local_detector == LocalDetector::NodeCidr,
        node_port_addresses,
        node_port_selection,
        bind_address: settings.bind_address,
    };
    let ebpf = EbpfFlags {
        bpf_root: cli.bpf_root,
        cgroup_root: cli.cgroup_root,
        node_port_addresses: config.node_port_addresses.clone(),
        devices: cli.ebpf_devices,
        masquerade_mark: 1 << (settings.masquerade_bit & 31),
    };
    let span = tracing::info_span!("agent", node = %config.client.node_name);
    let agent = run(config, settings.mode, iptables, ipvs, ebpf).instrument(span);
    match config_file {
        // As kube-proxy: a changed file ends the agent, and its restart reads it.
        Some(path) => tokio::select! {
            result = agent => result,
            err = config_watch::updated(&path) => Err(err.into()),
        },
        None => agent.await,
    }
}

/// The ebpf mode's flags; every mode removes that mode's pins under `bpf_root`.
struct EbpfFlags {
    bpf_root: std::path::PathBuf,
    cgroup_root: Option<std::path::PathBuf>,
    node_port_addresses: Option<Vec<IpAddr>>,
    devices: Option<Vec<String>>,
    masquerade_mark: u32,
}

impl EbpfFlags {
    /// The ebpf mode's configuration: the cgroup given, or the cgroup v2 hierarchy's mount point.
    fn config(self) -> anyhow::Result<ebpf::Config> {
        let cgroup = match self.cgroup_root {
            Some(folder) => folder,
            None => ebpf::kernel::cgroup2_mount()?.ok_or_else(|| {
                anyhow::anyhow!("no cgroup v2 hierarchy is mounted: set --cgroup-root")
            })?,
        };
        Ok(ebpf::Config {
            bpf_root: self.bpf_root,
            cgroup,
            node_port_addresses: self.node_port_addresses,
            devices: self.devices,
            masquerade_mark: self.masquerade_mark,
        })
    }
}

async fn run(
    config: Config,
    mode: ProxyMode,
    iptables: iptables::Config,
    ipvs: ipvs::Config,
    ebpf: EbpfFlags,
) -> anyhow::Result<()> {
    let iptables_backend = IptablesBackend::detect(&iptables).await;
    // The other modes' rules go once this mode's are in: a node switching modes whose
    // controllers cannot be reached keeps serving with the old ones meanwhile.
    let old_modes = {
        let (backend, exclude) = (iptables_backend.clone(), ipvs.exclude_cidrs.clone());
        let bpf_root = ebpf.bpf_root.clone();
        async move { cleanup::prepare_for(mode, &backend, &exclude, &bpf_root).await }
    };
    // One proxier per IP family whose tools work here, as kube-proxy's dual-stack mode; the
    // IPVS mode needs the same tools for its masquerade and filter rules. nft serves both
    // families wherever the kernel has IPv6.
    match mode {
        ProxyMode::Iptables => run_until_interrupted(config, iptables_backend, old_modes).await,
        ProxyMode::Ipvs => {
            let families = iptables_backend.ip_families();
            let dataplane = IpvsBackend::new(ipvs::Config { families, ..ipvs });
            run_until_interrupted(config, dataplane, old_modes).await
        }
        ProxyMode::Nftables => {
            let config_nft = nftables::Config {
                families: Families::of_kernel(),
                node_options: iptables.node_options.clone(),
                ..nftables::Config::default()
            };
            run_until_interrupted(config, NftablesBackend::new(config_nft), old_modes).await
        }
        ProxyMode::Ebpf => {
            let dataplane = EbpfBackend::new(ebpf.config()?);
            run_until_interrupted(config, dataplane, old_modes).await
        }
    }
}

async fn run_until_interrupted(
    config: Config,
    dataplane: impl Dataplane,
    after_first_sync: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::select! {
        result = crate::run(config, dataplane, after_first_sync) => Ok(result?),
        _ = tokio::signal::ctrl_c() => {
            // Rules stay in place on exit: traffic keeps flowing while the agent restarts.
            tracing::info!("interrupted; stopping and leaving the rules in place");
            Ok(())
        }
    }
}

/// Whether node ports answer on 127.0.0.1: only in iptables mode, when asked and when the node
/// port addresses include loopback, as kube-proxy.
fn localhost_node_ports(settings: &Settings, primary_ip: Option<IpAddr>) -> bool {
    settings.mode == ProxyMode::Iptables
        && settings.localhost_node_ports
        && includes_ipv4_loopback(&settings.node_port_addresses, primary_ip.as_slice())
}

/// The `--nodeport-addresses` selection with the node's IP known at start-up.
fn node_port_selection(
    settings: &Settings,
    primary_ip: Option<IpAddr>,
) -> std::io::Result<NodePortSelection> {
    // The nftables mode's default, `primary`, is filled in with the configuration.
    let selection = settings.node_port_addresses.clone();
    if needs_primary(&selection) && primary_ip.is_none() {
        return Err(std::io::Error::other(
            "`primary` needs the node's primary IP: set --bind-address",
        ));
    }
    Ok(NodePortSelection {
        selection,
        node_ips: primary_ip.into_iter().collect(),
    })
}
