//! The configuration as kube-proxy v1.36.3 reads it; expected values are upstream's (its
//! defaults, its `--write-config-to` output, kubeadm's ConfigMap).

use super::*;
use crate::{cli::ProxyMode, node_port_addresses::NodePortAddress};
use clap::Parser;
use std::time::Duration;

/// The `config.conf` kubeadm v1.36 writes into the `kube-proxy` ConfigMap for a cluster whose
/// pod subnet is 10.244.0.0/16: every field, unset ones as null, zero or empty.
const KUBEADM_CONFIG: &str = include_str!("../../testdata/kubeadm-config.conf");

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(
        ["splitproxy-agent", "--controller", "http://c:1"]
            .iter()
            .chain(args),
    )
    .expect("valid flags")
}

fn settings(args: &[&str]) -> Result<Settings, Error> {
    let config = configuration(&cli(args))?;
    Ok(resolve(&config)?)
}

fn with_file(text: &str, args: &[&str]) -> Result<Settings, Error> {
    let file = tempfile::NamedTempFile::new().expect("temporary file");
    std::fs::write(file.path(), text).expect("write the file");
    let path = file.path().to_str().expect("UTF-8 path").to_owned();
    let mut all = vec!["--config", path.as_str()];
    all.extend_from_slice(args);
    settings(&all)
}

fn message(result: Result<Settings, Error>) -> String {
    format!(
        "{:#}",
        anyhow::Error::from(result.expect_err("the configuration is refused"))
    )
}

#[test]
fn no_flags_give_kube_proxys_defaults() {
    let settings = settings(&[]).expect("valid");
    assert_eq!(settings.mode, ProxyMode::Iptables);
    assert_eq!(
        settings.metrics_bind_address,
        "127.0.0.1:10249".parse().ok()
    );
    assert_eq!(settings.healthz_bind_address, "0.0.0.0:10256".parse().ok());
    assert_eq!(settings.bind_address, None);
    assert_eq!(
        settings.sync_periods,
        crate::sync_timer::SyncPeriods::default()
    );
    assert_eq!(
        settings.local_detector,
        LocalDetector::ClusterCidr(Vec::new())
    );
    assert!(settings.localhost_node_ports);
    assert_eq!(settings.oom_score_adj, -999);
    assert_eq!(
        settings.conntrack,
        ConntrackSettings {
            max_per_core: 32_768,
            min: 131_072,
            tcp_established_timeout: Some(Duration::from_secs(86_400)),
            tcp_close_wait_timeout: Some(Duration::from_secs(3600)),
            tcp_be_liberal: false,
            udp_timeout: None,
            udp_stream_timeout: None,
        }
    );
    assert_eq!(settings.ipvs.scheduler, "rr");
    assert!(settings.ipvs.timeouts.is_unset());
}

#[test]
fn kubeadms_configmap_reads_as_kube_proxys_defaults_with_its_cluster_cidr() {
    let from_file = with_file(KUBEADM_CONFIG, &[]).expect("kubeadm's file is valid");
    let from_flags = settings(&[
        "--cluster-cidr",
        "10.244.0.0/16",
        "--kubeconfig",
        "/var/lib/kube-proxy/kubeconfig.conf",
    ])
    .expect("valid");
    assert_eq!(from_file, from_flags);
}

#[test]
fn the_file_replaces_the_flags_but_hostname_and_logging() {
    let file = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
                mode: nftables\nhostnameOverride: from-file\n";
    let settings = with_file(
        file,
        &[
            "--proxy-mode",
            "ipvs",
            "--masquerade-all",
            "--hostname-override",
            " Node-1 ",
            "-v",
            "4",
            "--logging-format",
            "json",
        ],
    )
    .expect("valid");
    assert_eq!(settings.mode, ProxyMode::Nftables);
    assert!(!settings.masquerade_all);
    assert_eq!(settings.hostname_override.as_deref(), Some("node-1"));
    assert_eq!(settings.verbosity, 4);
    assert!(settings.json_logs);
    let flags = cli(&["--config", "f", "--proxy-mode", "ipvs", "--masquerade-all"]);
    assert_eq!(
        flags.replaced_by_config(),
        ["--proxy-mode", "--masquerade-all"]
    );
}

#[test]
fn an_unknown_field_is_refused_by_its_path() {
    let base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    let text = message(with_file(&format!("{base}bogus: 1\n"), &[]));
    assert!(text.contains("unknown field `bogus`"), "{text}");
    let text = message(with_file(
        &format!("{base}conntrack:\n  maxPercore: 1\n"),
        &[],
    ));
    assert!(
        text.contains("conntrack") && text.contains("unknown field `maxPercore`"),
        "{text}"
    );
    // Field names are case-sensitive, as upstream's decoder.
    let text = message(with_file(&format!("{base}ClusterCIDR: 10.0.0.0/8\n"), &[]));
    assert!(text.contains("unknown field `ClusterCIDR`"), "{text}");
}

#[test]
fn a_value_of_the_wrong_type_is_refused_by_its_path() {
    let base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    let text = message(with_file(&format!("{base}conntrack:\n  min: lots\n"), &[]));
    assert!(text.contains("conntrack.min"), "{text}");
    let text = message(with_file(
        &format!("{base}iptables:\n  syncPeriod: 30\n"),
        &[],
    ));
    assert!(
        text.contains("iptables.syncPeriod") && text.contains("missing unit"),
        "{text}"
    );
}

#[test]
fn invalid_values_are_each_named_by_field_and_flag() {
    let base = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";
    let file = format!(
        "{base}mode: userspace\nbindAddress: node-1\nclusterCIDR: 10.0.0.0/8,10.1.0.0/16\n\
         oomScoreAdj: 2000\nconntrack:\n  maxPerCore: -1\niptables:\n  masqueradeBit: 40\n\
         nodePortAddresses: [primary, 10.0.0.0/8]\nfeatureGates:\n  NoSuchGate: true\n\
         detectLocalMode: Nowhere\nlogging:\n  format: xml\n"
    );
    let text = message(with_file(&file, &[]));
    for expected in [
        "mode (--proxy-mode): \"userspace\" is not one of iptables, ipvs, nftables",
        "bindAddress (--bind-address): \"node-1\" is not an IP address",
        "oomScoreAdj (--oom-score-adj): 2000 is not within [-1000, 1000]",
        "conntrack.maxPerCore (--conntrack-max-per-core): -1 must be 0 or more",
        "iptables.masqueradeBit (--iptables-masquerade-bit): 40 is not within [0, 31]",
        "nodePortAddresses (--nodeport-addresses): `primary` cannot be given with CIDRs",
        "featureGates.NoSuchGate (--feature-gates): unrecognized feature gate",
        "detectLocalMode (--detect-local-mode): \"Nowhere\" is not one of",
        "logging.format (--logging-format): \"xml\" is not one of text, json",
    ] {
        assert!(text.contains(expected), "{expected:?} missing from {text}");
    }
    // The cluster CIDR is only checked under its own detector.
    let text = message(with_file(
        &format!("{base}clusterCIDR: 10.0.0.0/8,10.1.0.0/16\n"),
        &[],
    ));
    assert!(
        text.contains("clusterCIDR (--cluster-cidr): \"10.0.0.0/8,10.1.0.0/16\" is not one CIDR or a dual-stack pair"),
        "{text}"
    );
}

#[test]
fn a_file_without_its_kind_is_refused() {
    let text = message(with_file("mode: ipvs\n", &[]));
    assert!(
        text.contains("apiVersion") && text.contains("kind"),
        "{text}"
    );
}

#[test]
fn sync_period_flags_apply_to_their_mode_only() {
    let iptables =
        settings(&["--iptables-sync-period", "1m", "--ipvs-sync-period", "2m"]).expect("valid");
    assert_eq!(iptables.sync_periods.sync_period(), Duration::from_secs(60));
    let ipvs = settings(&[
        "--proxy-mode",
        "ipvs",
        "--iptables-sync-period",
        "1m",
        "--ipvs-min-sync-period",
        "0",
    ])
    .expect("valid");
    assert_eq!(ipvs.sync_periods.sync_period(), Duration::from_secs(30));
    assert_eq!(ipvs.sync_periods.min_sync_period(), Duration::ZERO);
    let nftables = settings(&[
        "--proxy-mode",
        "nftables",
        "--iptables-min-sync-period",
        "2s",
    ])
    .expect("valid");
    assert_eq!(
        nftables.sync_periods.min_sync_period(),
        Duration::from_secs(2)
    );
    // From flags IPVS keeps the 1s minimum; from a file its unset minimum is 0, as upstream.
    let flags = settings(&["--proxy-mode", "ipvs"]).expect("valid");
    assert_eq!(flags.sync_periods.min_sync_period(), Duration::from_secs(1));
    let file = with_file(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
        &[],
    )
    .expect("valid");
    assert_eq!(file.sync_periods.min_sync_period(), Duration::ZERO);
}

#[test]
fn a_min_sync_period_above_the_sync_period_names_both_flags_of_the_mode() {
    let text = message(settings(&[
        "--iptables-sync-period",
        "1m",
        "--iptables-min-sync-period",
        "2m",
    ]));
    assert!(
        text.contains("iptables.minSyncPeriod (--iptables-min-sync-period): 120s must not be greater than the sync period (60s)"),
        "{text}"
    );
    let text = message(settings(&["--iptables-sync-period", "0"]));
    assert!(
        text.contains("iptables.syncPeriod (--iptables-sync-period): must be greater than 0"),
        "{text}"
    );
}

#[test]
fn bind_addresses_take_an_ip_alone_and_ignore_empty_values() {
    let settings = settings(&[
        "--metrics-bind-address",
        "0.0.0.0",
        "--healthz-bind-address",
        "::",
        "--bind-address",
        "",
    ])
    .expect("valid");
    assert_eq!(settings.metrics_bind_address, "0.0.0.0:10249".parse().ok());
    assert_eq!(settings.healthz_bind_address, "[::]:10256".parse().ok());
    assert_eq!(settings.bind_address, None);
    // As upstream: a zero port turns the health server off, and is refused for metrics.
    let off = self::settings(&["--healthz-port", "0"]).expect("valid");
    assert_eq!(off.healthz_bind_address, None);
    let text = message(self::settings(&["--metrics-port", "0"]));
    assert!(text.contains("metricsBindAddress"), "{text}");
    let port = self::settings(&[
        "--metrics-bind-address",
        "0.0.0.0",
        "--metrics-port",
        "9100",
    ])
    .expect("valid");
    assert_eq!(port.metrics_bind_address, "0.0.0.0:9100".parse().ok());
    let file = with_file(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         bindAddress: fd00::1\nmetricsBindAddress: 0.0.0.0\n",
        &[],
    )
    .expect("valid");
    assert_eq!(file.metrics_bind_address, "0.0.0.0:10249".parse().ok());
    assert_eq!(file.healthz_bind_address, "[::]:10256".parse().ok());
    assert_eq!(file.bind_address, "fd00::1".parse().ok());
}

#[test]
fn node_port_addresses_and_detectors_read_as_kube_proxy() {
    let settings = settings(&[
        "--nodeport-addresses",
        "198.18.0.0/24",
        "--detect-local-mode",
        "InterfaceNamePrefix",
        "--pod-interface-name-prefix",
        "veth",
    ])
    .expect("valid");
    assert_eq!(
        settings.node_port_addresses,
        [NodePortAddress::Cidr(
            "198.18.0.0/24".parse().expect("CIDR")
        )]
    );
    assert_eq!(
        settings.local_detector,
        LocalDetector::InterfaceNamePrefix("veth".to_owned())
    );
    let text = message(self::settings(&["--detect-local-mode", "BridgeInterface"]));
    assert!(
        text.contains("detectLocal.bridgeInterface (--pod-bridge-interface): must not be empty"),
        "{text}"
    );
}

#[test]
fn feature_gates_take_known_names_only() {
    let settings = settings(&["--feature-gates", "NFTablesProxyMode=true,AllAlpha=false"]);
    assert!(settings.is_ok(), "{settings:?}");
    let text = message(self::settings(&["--feature-gates", "Nope=true"]));
    assert!(text.contains("featureGates.Nope"), "{text}");
    let text = message(self::settings(&["--feature-gates", "AllAlpha"]));
    assert!(
        text.contains("\"AllAlpha\" is not Name=true or Name=false"),
        "{text}"
    );
}

#[test]
fn written_configuration_reads_back_the_same() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("written.yaml");
    let config =
        configuration(&cli(&["--proxy-mode", "nftables", "--masquerade-all"])).expect("valid");
    write(&config, &path).expect("written");
    let text = std::fs::read_to_string(&path).expect("read back");
    let read = parse(&text).expect("parses");
    assert_eq!(resolve(&read), resolve(&config));
    // As upstream's internal form, only the mode's sync periods and switch are written.
    assert!(read.nftables.masquerade_all && !read.iptables.masquerade_all);
    assert!(read.iptables.sync_period.is_zero() && !read.nftables.sync_period.is_zero());
}

#[test]
fn the_masquerade_bit_is_the_modes() {
    assert_eq!(settings(&[]).expect("valid").masquerade_bit, 14);
    let iptables = settings(&["--iptables-masquerade-bit", "0"]).expect("valid");
    assert_eq!(iptables.masquerade_bit, 0);
    let file = with_file(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
         mode: nftables\niptables:\n  masqueradeBit: 3\nnftables:\n  masqueradeBit: 20\n",
        &[],
    )
    .expect("valid");
    assert_eq!(file.masquerade_bit, 20);
}

#[test]
fn the_ebpf_mode_is_taken_from_the_flag_and_the_file_with_iptables_sync_periods() {
    let flags =
        settings(&["--proxy-mode", "ebpf", "--iptables-min-sync-period", "2s"]).expect("valid");
    assert_eq!(flags.mode, ProxyMode::Ebpf);
    assert_eq!(flags.sync_periods.min_sync_period(), Duration::from_secs(2));
    let file = with_file(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ebpf\n",
        &[],
    )
    .expect("valid");
    assert_eq!(file.mode, ProxyMode::Ebpf);
    // No upstream default to follow: the newer nftables mode's, node ports on the primary IP.
    assert_eq!(file.node_port_addresses, [NodePortAddress::Primary]);
    let chosen =
        settings(&["--proxy-mode", "ebpf", "--nodeport-addresses", "10.0.0.0/8"]).expect("valid");
    assert_eq!(chosen.node_port_addresses.len(), 1);
    assert_ne!(chosen.node_port_addresses, [NodePortAddress::Primary]);
    let unknown = with_file(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: xdp\n",
        &[],
    );
    assert!(
        message(unknown).contains("\"xdp\" is not one of iptables, ipvs, nftables, ebpf"),
        "the modes are named"
    );
}
