//! The iptables backend: kube-proxy's nat chain layout, written with one `iptables-restore` per sync.
//!
//! The work is split as everywhere in this crate: [`render`] turns a [`ProxyState`] into the
//! `iptables-restore` payload (pure, unit-tested), and [`FamilyExecutor`] is the thin executor
//! that reads the kernel's chains with `iptables-save`, pipes the payload to `iptables-restore
//! --noflush` (in a full sync with the jumps from the built-in chains the kernel lacks, module
//! `hooks`), then deletes the UDP and SCTP conntrack entries the change left stale
//! ([`crate::conntrack`]).
//!
//! One [`FamilyExecutor`] programs one IP family (`iptables` or `ip6tables`,
//! [`Config::family`]), as each of upstream's per-family proxiers does; [`IptablesBackend`], the
//! mode's backend, runs one per family the node can program.
//!
//! Syncs are partial as in kube-proxy (module `partial`): only the Services that changed are
//! rendered again, and of those only the chains whose rules changed are written. A sync is full (every chain written, the jumps checked) the first time,
//! after a failure, once an hour, and when a `KUBE-PROXY-CANARY` chain is gone: someone (a
//! firewall reload, an operator) deleted chains behind the agent's back, so nothing written
//! before can be trusted to be there.

mod backend;
pub mod chain_names;
mod cleanup;
mod hooks;
pub(crate) mod partial;
pub mod render;
pub mod save;
#[cfg(test)]
pub(crate) mod tests;
mod tools;

pub use backend::{FamilyError, IptablesBackend};
pub use cleanup::Cleaned;
pub(crate) use hooks::Jump;
pub use render::{
    FilterRules, NatRules, render_filter, render_filter_for, render_nat, render_nat_for,
};
pub(crate) use tools::Tools;

use crate::IpFamily;
use crate::NodeOptions;
use crate::conntrack::{self, Conntrack};
use crate::full_sync::FullSyncClock;
use crate::node_options::FamilyOptions;
use crate::tool::RunError;
use crate::{Dataplane, FailedStep, ProxyState, SyncReport};
use partial::Rendered;
use render::{
    FILTER_KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_POSTROUTING,
    KUBE_PROXY_FIREWALL, KUBE_SERVICES,
};
use std::{io, process::ExitStatus, time::Duration};
use tracing::Instrument;

/// What can go wrong while syncing the iptables backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command could not be started or waited for.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `iptables-save` exited with an error, so the existing chains are unknown.
    #[error("iptables-save failed ({status}): {stderr}")]
    Save {
        /// Its exit status.
        status: ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
    /// `iptables-restore` rejected the payload; the previous rules stay in place.
    #[error("iptables-restore failed ({status}): {stderr}")]
    Restore {
        /// Its exit status.
        status: ExitStatus,
        /// What it printed on stderr (usually the failing line number).
        stderr: String,
        /// The payload held only the changed Services' chains (a partial sync).
        partial: bool,
    },
    /// `iptables-restore` accepted the payload but could not be sent all of it.
    #[error("could not write the rules to iptables-restore")]
    WriteInput(#[source] io::Error),
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl crate::SyncError for Error {
    fn failed_step(&self) -> FailedStep {
        match self {
            Self::Restore { partial, .. } => FailedStep::Restore { partial: *partial },
            // The tool exited 0, so the kernel did not refuse the rules.
            Self::Run(_) | Self::Save { .. } | Self::WriteInput(_) => FailedStep::Other,
        }
    }
}

/// How the executor runs the iptables tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The IP family programmed: which addresses are rendered, and which conntrack entries are
    /// deleted. The binaries below must be that family's (see [`Config::with_family`]).
    pub family: IpFamily,
    /// The `iptables` binary, used to probe the canary chains.
    pub iptables: String,
    /// The `iptables-save` binary, used to list the existing chains.
    pub iptables_save: String,
    /// The `iptables-restore` binary, used to write the rules.
    pub iptables_restore: String,
    /// The `conntrack` binary (conntrack-tools), used to delete stale UDP and SCTP flows.
    pub conntrack: String,
    /// Words put before every command, e.g. `["ip", "netns", "exec", "ns1"]`.
    pub command_prefix: Vec<String>,
    /// Seconds `iptables` and `iptables-restore` wait for the xtables lock (`-w`).
    pub lock_wait_seconds: u32,
    /// The node's configuration the rules depend on (cluster CIDR, masquerade-all).
    pub node_options: NodeOptions,
    /// How often the canary chains are probed between full syncs: the sync period, the
    /// interval of kube-proxy's canary monitor.
    pub canary_interval: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            // IPv4, kube-proxy's primary family unless the node is IPv6-only.
            family: IpFamily::V4,
            // Looked up in PATH; the image's wrapper picks the nft or legacy backend, as upstream.
            iptables: "iptables".to_owned(),
            iptables_save: "iptables-save".to_owned(),
            iptables_restore: "iptables-restore".to_owned(),
            // Looked up in PATH too, as kube-proxy did before it switched to netlink; a missing
            // binary only leaves stale flows (logged), it never fails a sync.
            conntrack: "conntrack".to_owned(),
            // Run the tools directly, in the agent's own network namespace.
            command_prefix: Vec::new(),
            // kube-proxy's `-w 5`: wait for other writers, but not forever.
            lock_wait_seconds: 5,
            // No cluster CIDR and no masquerade-all: kube-proxy's defaults.
            node_options: NodeOptions::default(),
            // kube-proxy's default sync period.
            canary_interval: Duration::from_secs(30),
        }
    }
}

impl Config {
    /// Programs `family` with its own tools: `iptables`, `iptables-save` and `iptables-restore`
    /// for IPv4, `ip6tables`, `ip6tables-save` and `ip6tables-restore` for IPv6 (from PATH).
    #[must_use]
    pub fn with_family(mut self, family: IpFamily) -> Self {
        let tool = match family {
            IpFamily::V4 => "iptables",
            IpFamily::V6 => "ip6tables",
        };
        self.family = family;
        self.iptables = tool.to_owned();
        self.iptables_save = format!("{tool}-save");
        self.iptables_restore = format!("{tool}-restore");
        self
    }

    /// Puts `prefix` before every command (e.g. `ip netns exec <ns>`).
    #[must_use]
    pub fn with_command_prefix<I, S>(mut self, prefix: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command_prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    /// Renders the rules with `options` (cluster CIDR, masquerade-all).
    #[must_use]
    pub fn with_node_options(mut self, options: NodeOptions) -> Self {
        self.node_options = options;
        self
    }

    /// The same, probing the canary chains every `interval` between full syncs.
    #[must_use]
    pub fn with_canary_interval(mut self, interval: Duration) -> Self {
        self.canary_interval = interval;
        self
    }

    /// The program and arguments that run `binary args...` under [`command_prefix`](Self::command_prefix).
    pub(crate) fn command_line(&self, binary: &str, args: &[String]) -> (String, Vec<String>) {
        let mut words = self
            .command_prefix
            .iter()
            .cloned()
            .chain(std::iter::once(binary.to_owned()))
            .chain(args.iter().cloned());
        // `words` holds at least `binary`.
        let program = words.next().unwrap_or_default();
        (program, words.collect())
    }
}

/// The empty chain whose absence shows that the tables were flushed behind the agent's back.
pub const KUBE_PROXY_CANARY: &str = "KUBE-PROXY-CANARY";
/// The tables holding a canary, as kube-proxy's.
pub(crate) const CANARY_TABLES: [&str; 3] = ["mangle", "nat", "filter"];

const SERVICE_PORTALS: &str = "kubernetes service portals";
const EXTERNAL_PORTALS: &str = "kubernetes externally-visible service portals";
const LOAD_BALANCER_FIREWALL: &str = "kubernetes load balancer firewall";

/// The jumps [`FamilyExecutor::sync`] installs, as `(table, built-in chain, rule)` in the order it
/// inserts them, each as the chain's first rule: the packet tracer hooks the same rules the same
/// way, so it follows exactly what a node gets.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn installed_jumps() -> impl Iterator<Item = (&'static str, &'static str, String)> {
    JUMPS
        .iter()
        .map(|jump| (jump.table, jump.chain, jump.rule_text()))
}

/// The jumps that hook our chains into the built-in ones, as kube-proxy installs them.
const JUMPS: [Jump; 12] = [
    Jump::nat("PREROUTING", SERVICE_PORTALS, KUBE_SERVICES),
    Jump::nat("OUTPUT", SERVICE_PORTALS, KUBE_SERVICES),
    Jump::nat(
        "POSTROUTING",
        "kubernetes postrouting rules",
        KUBE_POSTROUTING,
    ),
    Jump::filter("INPUT", true, EXTERNAL_PORTALS, KUBE_EXTERNAL_SERVICES),
    Jump::filter("FORWARD", true, EXTERNAL_PORTALS, KUBE_EXTERNAL_SERVICES),
    // The filter table's KUBE-NODEPORTS (health-check node port ACCEPTs) shares the nat name.
    Jump::filter(
        "INPUT",
        false,
        "kubernetes health check service ports",
        render::KUBE_NODEPORTS,
    ),
    Jump::filter("FORWARD", true, SERVICE_PORTALS, FILTER_KUBE_SERVICES),
    Jump::filter("OUTPUT", true, SERVICE_PORTALS, FILTER_KUBE_SERVICES),
    Jump::filter(
        "FORWARD",
        false,
        "kubernetes forwarding rules",
        KUBE_FORWARD,
    ),
    Jump::filter("INPUT", true, LOAD_BALANCER_FIREWALL, KUBE_PROXY_FIREWALL),
    Jump::filter("OUTPUT", true, LOAD_BALANCER_FIREWALL, KUBE_PROXY_FIREWALL),
    Jump::filter("FORWARD", true, LOAD_BALANCER_FIREWALL, KUBE_PROXY_FIREWALL),
];

/// kubelet's jumps to [`render::KUBE_FIREWALL`], which kube-proxy ensures as well, first in
/// INPUT and OUTPUT, without a comment. Cleanup leaves them to kubelet, as kube-proxy does.
const KUBELET_JUMPS: [Jump; 2] = [
    Jump::filter("INPUT", false, "", render::KUBE_FIREWALL),
    Jump::filter("OUTPUT", false, "", render::KUBE_FIREWALL),
];

/// The iptables dataplane for one IP family: programs its nat and filter tables through that
/// family's iptables tools.
#[derive(Debug, Clone, Default)]
pub struct FamilyExecutor {
    tools: Tools,
    /// The state of the last successful sync; `None` before the first one, which deletes no
    /// flows (kube-proxy does not flush conntrack on startup either).
    applied: Option<ProxyState>,
    /// The rules rendered for the last state synced, per Service, so a sync renders again only
    /// the Services that changed.
    rendered: Rendered,
    /// Whether the kernel holds `rendered`: false before the first sync and after a failed one,
    /// which makes the next sync full.
    in_kernel: bool,
    /// When the last full sync finished.
    full_syncs: FullSyncClock,
}

impl FamilyExecutor {
    /// An executor running `iptables`, `iptables-save` and `iptables-restore` from PATH.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// An executor with `config`.
    #[must_use]
    pub fn with_config(config: Config) -> Self {
        Self {
            tools: Tools::new(config),
            ..Self::default()
        }
    }

    /// The configuration in use.
    #[must_use]
    pub fn config(&self) -> &Config {
        self.tools.config()
    }

    /// Whether this family's tools run and can read the nat table (kube-proxy runs single-stack
    /// when the secondary family's cannot).
    pub async fn available(&self) -> bool {
        self.tools.saved("nat").await.is_ok()
    }

    /// Deletes the conntrack entries the change from `previous` to `current` left stale.
    async fn delete_stale_flows(
        &self,
        previous: &ProxyState,
        current: &ProxyState,
    ) -> conntrack::Cleanup {
        let config = self.config();
        let executor = Conntrack::new(&config.command_prefix, &config.conntrack);
        conntrack::delete_stale_flows(&executor, previous, current, config.family).await
    }
}

impl Dataplane for FamilyExecutor {
    type Error = Error;

    fn mode(&self) -> &'static str {
        "iptables"
    }

    /// One `iptables sync` span per call (a child of the caller's span, so of the agent's
    /// `apply` in a traced revision): the IP family, the rules written, full or partial, and the
    /// result.
    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport> {
        let span = tracing::info_span!(
            "iptables sync",
            ip_family = self.config().family.name(),
            rules_written = tracing::field::Empty,
            sync = tracing::field::Empty,
            result = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        let result = self.sync_rules(state).instrument(span.clone()).await;
        match &result {
            Ok(report) => {
                let written: u32 = report.family_rules.iter().map(|(_, _, n)| n).sum();
                span.record("rules_written", written);
                span.record("sync", if report.full { "full" } else { "partial" });
                span.record("result", "ok");
            }
            Err(err) => {
                span.record("result", "failed");
                span.record("error", tracing::field::display(err));
            }
        }
        result
    }

    fn set_local_cidrs(&mut self, cidrs: Vec<crate::Cidr>) {
        self.tools.config_mut().node_options.cluster_cidrs = cidrs;
        self.render_all_again();
    }

    fn set_node_port_addresses(&mut self, addresses: Option<Vec<std::net::IpAddr>>) {
        self.tools.config_mut().node_options.node_port_addresses = addresses;
        self.render_all_again();
    }

    fn set_node_ips(&mut self, ips: Vec<std::net::IpAddr>) {
        self.tools.config_mut().node_options.node_ips = ips;
        self.render_all_again();
    }
}

impl FamilyExecutor {
    /// After a change of render options: every Service's rules are rendered again, in a full
    /// sync.
    fn render_all_again(&mut self) {
        self.rendered = Rendered::default();
        self.in_kernel = false;
    }

    /// One sync of this family: the kernel transaction and its bookkeeping.
    async fn sync_rules(&mut self, state: &ProxyState) -> Result<SyncReport> {
        let family = self.config().family;
        // Cleared, so that a sync failing from here on makes the next one full.
        let in_kernel = std::mem::replace(&mut self.in_kernel, false);
        let full_reason = self
            .tools
            .full_sync_reason(&self.full_syncs, in_kernel)
            .await?;
        let options = FamilyOptions::new(family, &self.config().node_options);
        let (rendered, changed) = self.rendered.update(state, &options);
        // Changes none of this family's rules show (another family's endpoints) restore nothing,
        // as upstream's proxier of the other family does not sync for them. A sync with no
        // change at all (the periodic one) still rewrites the shared chains.
        let restore = full_reason.is_some()
            || changed.is_empty()
            || !rendered.same_rules_as(&self.rendered, &changed);
        // Only a full sync reads the kernel's tables: `iptables-save` takes seconds at tens of
        // thousands of rules, so a partial sync, as kube-proxy's, trusts the chains it wrote
        // (the canaries tell when they may be gone, and every full sync looks again).
        let saved = match full_reason {
            Some(_) => Some(self.tools.saved_for_full_sync().await?),
            None => None,
        };
        let payload = match &saved {
            Some(saved) => partial::full(&rendered, &save::chains(saved, "nat"), &options),
            None => partial::partial(&self.rendered, &rendered, &changed, &options),
        };
        self.rendered = rendered;
        // Both tables in one transaction; a full one also writes the canaries and the jumps
        // from the built-in chains, with kubelet's firewall chain that kube-proxy hooks in too
        // (and never removes). A partial one must not recreate a canary someone flushed before
        // it is probed, and trusts the jumps as kube-proxy's does.
        let tables = payload.tables();
        match &saved {
            Some(saved) => {
                // The filter table declares kubelet's chain itself when it holds the localnet
                // rule; otherwise it is created only when missing, which leaves kubelet's rules.
                let firewall = [("filter", render::KUBE_FIREWALL)];
                let chains: &[_] = if options.localhost_node_ports {
                    &[]
                } else {
                    &firewall
                };
                let jumps = JUMPS.iter().chain(&KUBELET_JUMPS);
                self.tools
                    .restore_full(&tables, saved, chains, jumps)
                    .await?;
            }
            None if restore => self.tools.restore(&tables, true).await?,
            None => {}
        }
        if let Some(reason) = full_reason {
            self.tools.canaries_written();
            self.full_syncs.record();
            tracing::debug!(reason, "full sync");
        }
        tracing::debug!(
            ip_family = family.name(),
            full = full_reason.is_some(),
            rules_written = ?payload.rules_written,
            rules_total = ?payload.rules_total,
            "synced iptables rules"
        );
        let cleanup = match &self.applied {
            Some(previous) => Some(self.delete_stale_flows(previous, state).await),
            None => None,
        };
        self.applied = Some(state.clone());
        self.in_kernel = true;
        let written = if restore {
            payload.rules_written
        } else {
            let tables = payload.rules_written.into_iter();
            tables.map(|(table, _)| (table, 0)).collect()
        };
        let mut report =
            SyncReport::for_family(family, written, payload.rules_total, full_reason.is_some());
        report.conntrack.extend(cleanup);
        Ok(report)
    }
}
