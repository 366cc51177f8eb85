//! Removing what proxies leave on a node: once a mode's first rules are in, the other modes'
//! rules, tables, interface, ipsets and eBPF pins, which would take Service traffic beside its own (as
//! kube-proxy on a switch of mode, which removes them at start); and everything, for `--cleanup`. The dataplane finds and removes each kind
//! (`IptablesBackend::cleanup`, `ipvs::cleanup`, `Leftovers`); this module decides which go when, and
//! logs what went.

use crate::cli::ProxyMode;
use splitproxy_dataplane::ebpf::kernel as ebpf;
use splitproxy_dataplane::{
    Cidr,
    iptables::{self, IptablesBackend},
    ipvs::cleanup as ipvs_cleanup,
    leftovers::{Leftovers, Removed},
};
use std::path::Path;
use std::process::ExitCode;

/// Removes the other proxy modes' leftovers, once `mode` programs the node. A failure is logged,
/// not fatal: the rules still work.
pub async fn prepare_for(
    mode: ProxyMode,
    iptables_backend: &IptablesBackend,
    ipvs_exclude: &[Cidr],
    bpf_root: &Path,
) {
    if mode != ProxyMode::Ebpf {
        remove_ebpf_pins(bpf_root);
    }
    let leftovers = match mode {
        ProxyMode::Iptables => Leftovers::default().remove_for_iptables_mode().await,
        ProxyMode::Ipvs => Leftovers::default().remove_for_ipvs_mode().await,
        ProxyMode::Nftables => {
            remove_iptables_rules(iptables_backend).await;
            remove_ipvs_virtual_servers_or_warn(ipvs_exclude).await;
            Leftovers::default().remove_for_nftables_mode().await
        }
        // Every other mode's rules would translate packets the socket layer already sent to an
        // endpoint, or take traffic it does not serve yet.
        ProxyMode::Ebpf => {
            remove_iptables_rules(iptables_backend).await;
            remove_ipvs_virtual_servers_or_warn(ipvs_exclude).await;
            Leftovers::default().remove_all().await
        }
    };
    match leftovers {
        Ok(removed) if removed.is_empty() => {}
        Ok(removed) => log_removed(&removed, "removed another proxy mode's leftovers"),
        Err(err) => tracing::warn!(
            error = format!("{:#}", anyhow::Error::from(err)),
            "could not remove another proxy mode's leftovers"
        ),
    }
}

/// `--cleanup`: removes kube-proxy's iptables layout (splitproxy's, or kube-proxy's own leftovers)
/// in every IP family whose tools work, then the IPVS virtual servers outside `ipvs_exclude`,
/// then the other proxy modes' leftovers (after the rules, which may use their ipsets) and the
/// ebpf mode's pins under `bpf_root`, then exits; failure if anything could not be cleaned.
pub async fn cleanup_all(ipvs_exclude: Vec<Cidr>, bpf_root: &Path) -> ExitCode {
    let dataplane = IptablesBackend::detect(&iptables::Config::default()).await;
    let mut code = ExitCode::SUCCESS;
    for (family, outcome) in dataplane.cleanup().await {
        match outcome {
            Ok(cleaned) => tracing::info!(
                ip_family = family.name(),
                jumps = cleaned.jumps,
                chains = cleaned.chains,
                "removed the iptables rules"
            ),
            Err(err) => {
                tracing::error!(
                    ip_family = family.name(),
                    error = format!("{:#}", anyhow::Error::from(err)),
                    "could not remove the iptables rules"
                );
                code = ExitCode::FAILURE;
            }
        }
    }
    if let Err(err) = remove_ipvs_virtual_servers(ipvs_exclude).await {
        tracing::error!(
            error = format!("{err:#}"),
            "could not remove the IPVS virtual servers"
        );
        code = ExitCode::FAILURE;
    }
    match Leftovers::default().remove_all().await {
        Ok(removed) => log_removed(&removed, "removed the other proxy modes' leftovers"),
        Err(err) => {
            tracing::error!(
                error = format!("{:#}", anyhow::Error::from(err)),
                "could not remove the other proxy modes' leftovers"
            );
            code = ExitCode::FAILURE;
        }
    }
    if !remove_ebpf_pins(bpf_root) {
        code = ExitCode::FAILURE;
    }
    code
}

/// Unpins the ebpf mode's programs and maps, which detaches the programs, and removes its
/// masquerade rule; whether nothing failed (a failure is logged).
fn remove_ebpf_pins(bpf_root: &Path) -> bool {
    match ebpf::remove_pins(bpf_root) {
        Ok(true) => {
            tracing::info!(bpf_root = %bpf_root.display(), "removed the ebpf mode's programs, maps and masquerade rule");
            true
        }
        Ok(false) => true,
        Err(err) => {
            tracing::warn!(error = %err, "could not remove the ebpf mode's programs, maps and masquerade rule");
            false
        }
    }
}

/// Deletes the IPVS virtual servers outside `exclude`; a failure is logged, not fatal.
async fn remove_ipvs_virtual_servers_or_warn(exclude: &[Cidr]) {
    if let Err(err) = remove_ipvs_virtual_servers(exclude.to_vec()).await {
        tracing::warn!(
            error = format!("{err:#}"),
            "could not remove the IPVS mode's virtual servers"
        );
    }
}

/// Removes the iptables-based modes' rules in every family whose tools work, as kube-proxy's
/// nftables mode does on start: they would handle Service traffic before the nftables table.
/// A failure is logged, not fatal.
async fn remove_iptables_rules(iptables_backend: &IptablesBackend) {
    for (family, outcome) in iptables_backend.cleanup().await {
        match outcome {
            Ok(cleaned) if cleaned.jumps + cleaned.chains == 0 => {}
            Ok(cleaned) => tracing::info!(
                ip_family = family.name(),
                jumps = cleaned.jumps,
                chains = cleaned.chains,
                "removed the iptables rules of another proxy mode"
            ),
            Err(err) => tracing::warn!(
                ip_family = family.name(),
                error = format!("{:#}", anyhow::Error::from(err)),
                "could not remove the iptables rules of another proxy mode"
            ),
        }
    }
}

/// Deletes IPVS virtual servers outside `exclude`, as kube-proxy flushes IPVS on `--cleanup` and
/// on a switch to the nftables mode (where they would take Service traffic before the table).
async fn remove_ipvs_virtual_servers(exclude: Vec<Cidr>) -> anyhow::Result<()> {
    let removed =
        tokio::task::spawn_blocking(move || ipvs_cleanup::remove_virtual_servers(&exclude))
            .await??;
    if !removed.is_empty() {
        let removed: Vec<String> = removed.iter().map(ToString::to_string).collect();
        tracing::info!(virtual_servers = ?removed, "removed the IPVS virtual servers");
    }
    Ok(())
}

fn log_removed(removed: &Removed, message: &str) {
    tracing::info!(
        nft_tables = ?removed.nft_tables,
        interfaces = ?removed.interfaces,
        ipsets = ?removed.ipsets,
        skipped = ?removed.skipped,
        "{message}"
    );
}
