//! The nftables mode as a [`Dataplane`] (kube-proxy's `--proxy-mode nftables`): each sync
//! renders again only the changed Services of every family, turns the difference from what the
//! kernel holds into one script, and runs it with one `nft -f -`, so both families change in
//! one atomic transaction or not at all.
//!
//! What the kernel holds is known from the last successful transaction. The first sync reads
//! the tables once (`nft --terse list table`) to take over what an earlier run left; after a
//! failure, the next sync is full and removes whatever the failed one may have left. A sync
//! with nothing to change probes one small chain per table (`nft list chain … services`): a
//! table deleted behind the agent's back (a firewall reload) is then written whole again, as
//! it is once an hour anyway.

use super::{Leftovers, Options, Rendered, TABLE, transaction};
use crate::NodeOptions;
use crate::conntrack::{self, Conntrack};
use crate::full_sync::FullSyncClock;
use crate::tool::{self, RunError, stderr_text};
use crate::{Dataplane, FailedStep, ProxyState, SyncError, SyncReport};
use crate::{Families, IpFamily};
use std::process::ExitStatus;

/// How the nftables mode is configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The IP families programmed: one `kube-proxy` table each.
    pub families: Families,
    /// The `nft` binary.
    pub nft: String,
    /// The `conntrack` binary, to delete stale UDP and SCTP flows.
    pub conntrack: String,
    /// Words put before every command, e.g. `["ip", "netns", "exec", "ns1"]`.
    pub command_prefix: Vec<String>,
    /// The node's configuration the rules depend on (cluster CIDR, masquerade-all, node-port
    /// addresses, node IPs).
    pub node_options: NodeOptions,
    /// The cluster's service CIDRs, of both families (see [`Options::with_service_cidrs`]);
    /// none by default.
    pub service_cidrs: Vec<crate::Cidr>,
}

impl Default for Config {
    /// IPv4, `nft` and `conntrack` from PATH, in the agent's own namespace, kube-proxy's
    /// defaults for the rules.
    fn default() -> Self {
        Self {
            families: Families::default(),
            nft: "nft".to_owned(),
            conntrack: "conntrack".to_owned(),
            command_prefix: Vec::new(),
            node_options: NodeOptions::default(),
            service_cidrs: Vec::new(),
        }
    }
}

/// Why an nftables sync failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `nft` could not run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `nft -f -` refused the transaction; the kernel's tables are as they were.
    #[error("nft refused the transaction ({status}): {stderr}")]
    Refused {
        /// Its exit status.
        status: ExitStatus,
        /// What it printed (the failing command and why).
        stderr: String,
        /// The transaction held only the changed Services (a partial sync).
        partial: bool,
    },
    /// `nft` accepted the transaction but could not be sent all of it.
    #[error("could not write the transaction to nft")]
    WriteInput(#[source] std::io::Error),
}

impl SyncError for Error {
    fn failed_step(&self) -> FailedStep {
        match self {
            Self::Refused { partial, .. } => FailedStep::Restore { partial: *partial },
            Self::Run(_) | Self::WriteInput(_) => FailedStep::Other,
        }
    }
}

/// One family's table as the backend knows it.
#[derive(Debug)]
struct Table {
    options: Options,
    /// The last render, reused so a sync renders again only changed Services.
    rendered: Option<Rendered>,
    /// What the kernel holds: the render the last successful transaction wrote; `None` when
    /// unknown (first sync, after a failure), which makes the next transaction full.
    in_kernel: Option<Rendered>,
    /// Chains and sets the table may hold besides `in_kernel`'s; `None` until the first sync
    /// has read the kernel's table.
    leftovers: Option<Leftovers>,
    /// When the last full transaction of this table succeeded.
    full_syncs: FullSyncClock,
}

/// The nftables backend.
#[derive(Debug)]
pub struct NftablesBackend {
    config: Config,
    tables: Vec<Table>,
    /// The state of the last successful sync; `None` before the first, which deletes no flows.
    applied: Option<ProxyState>,
}

impl NftablesBackend {
    /// A backend with `config`; it touches the kernel only when it syncs.
    #[must_use]
    pub fn new(config: Config) -> Self {
        let tables = config
            .families
            .iter()
            .map(|&family| Table {
                options: Options::new(family, &config.node_options)
                    .with_service_cidrs(config.service_cidrs.iter().copied()),
                rendered: None,
                in_kernel: None,
                leftovers: None,
                full_syncs: FullSyncClock::default(),
            })
            .collect();
        Self {
            config,
            tables,
            applied: None,
        }
    }

    /// Runs `nft args…` under the command prefix with `input` on stdin, if any.
    async fn nft(&self, args: &[&str], input: Option<&str>) -> Result<tool::Ran, Error> {
        let mut words = self
            .config
            .command_prefix
            .iter()
            .chain([&self.config.nft])
            .cloned()
            .chain(args.iter().map(|&arg| arg.to_owned()));
        // `words` holds at least the binary.
        let program = words.next().unwrap_or_default();
        let args: Vec<String> = words.collect();
        let stdin = input.map(|text| [text]);
        Ok(tool::run(&program, &args, stdin.as_ref().map(|parts| &parts[..])).await?)
    }

    /// The chains and sets `family`'s table holds now, for a first sync to take over.
    async fn listed(&self, family: IpFamily) -> Result<Leftovers, Error> {
        let ran = self
            .nft(
                &["--terse", "list", "table", family_name(family), TABLE],
                None,
            )
            .await?;
        // No table yet (`No such file or directory`): nothing to take over.
        let listing = String::from_utf8_lossy(&ran.output.stdout);
        Ok(Leftovers::from_listing(family, &listing))
    }
}

/// `ip` or `ip6`, as `nft` names the families.
fn family_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

impl Dataplane for NftablesBackend {
    type Error = Error;

    fn mode(&self) -> &'static str {
        "nftables"
    }

    fn ip_families(&self) -> Families {
        self.config.families.clone()
    }

    fn set_local_cidrs(&mut self, cidrs: Vec<crate::Cidr>) {
        self.config.node_options.cluster_cidrs = cidrs;
        self.render_all_again();
    }

    fn set_node_port_addresses(&mut self, addresses: Option<Vec<std::net::IpAddr>>) {
        self.config.node_options.node_port_addresses = addresses;
        self.render_all_again();
    }

    fn set_node_ips(&mut self, ips: Vec<std::net::IpAddr>) {
        self.config.node_options.node_ips = ips;
        self.render_all_again();
    }

    fn set_service_cidrs(&mut self, cidrs: Vec<crate::Cidr>) {
        self.config.service_cidrs = cidrs;
        self.render_all_again();
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Error> {
        for index in 0..self.tables.len() {
            if self.tables[index].leftovers.is_none() {
                let family = self.tables[index].options.family();
                self.tables[index].leftovers = Some(self.listed(family).await?);
            }
            let due = self.tables[index].full_syncs.due();
            if due {
                self.tables[index].in_kernel = None;
            }
        }
        if self.unchanged(state) && !self.tables_present().await? {
            tracing::warn!("the kube-proxy table is gone; writing it again");
            self.forget();
        }
        let mut script = String::new();
        let mut next = Vec::with_capacity(self.tables.len());
        let mut full = false;
        for table in &self.tables {
            let rendered = match &table.rendered {
                Some(previous) => previous.update(state, &table.options),
                None => Rendered::new(state, &table.options),
            };
            let leftovers = table.leftovers.clone().unwrap_or_default();
            let transaction = transaction(table.in_kernel.as_ref(), &rendered, &leftovers);
            full |= transaction.full;
            script.push_str(&transaction.script);
            next.push((rendered, transaction.stale_chains));
        }
        if !script.is_empty() {
            let partial = !full;
            let result = self.nft(&["-f", "-"], Some(&script)).await.and_then(|ran| {
                if !ran.output.status.success() {
                    return Err(Error::Refused {
                        status: ran.output.status,
                        stderr: stderr_text(&ran.output.stderr),
                        partial,
                    });
                }
                ran.written.map_err(Error::WriteInput)
            });
            if let Err(error) = result {
                self.forget();
                return Err(error);
            }
        }
        for (table, (rendered, stale_chains)) in self.tables.iter_mut().zip(next) {
            if table.in_kernel.is_none() {
                table.full_syncs.record();
            }
            table.rendered = Some(rendered.clone());
            table.in_kernel = Some(rendered);
            table.leftovers = Some(Leftovers {
                chains: stale_chains,
                ..Leftovers::default()
            });
        }
        Ok(SyncReport {
            full,
            conntrack: self.delete_stale_flows(state).await,
            ..SyncReport::default()
        })
    }
}

impl NftablesBackend {
    /// After a change of render options: each table's options made again, its rules rendered
    /// again from nothing and written in full.
    fn render_all_again(&mut self) {
        for table in &mut self.tables {
            table.options = Options::new(table.options.family(), &self.config.node_options)
                .with_service_cidrs(self.config.service_cidrs.iter().copied());
            table.rendered = None;
        }
        self.forget();
    }

    /// Whether `state` is what the kernel holds, in every table.
    fn unchanged(&self, state: &ProxyState) -> bool {
        // Services both states share are skipped without a look inside.
        self.applied
            .as_ref()
            .is_some_and(|applied| applied.changed_services(state).next().is_none())
            && self.tables.iter().all(|table| table.in_kernel.is_some())
    }

    /// Whether every table is still there, probed through its small `services` chain.
    async fn tables_present(&self) -> Result<bool, Error> {
        for table in &self.tables {
            let family = family_name(table.options.family());
            let ran = self
                .nft(&["list", "chain", family, TABLE, "services"], None)
                .await?;
            if !ran.output.status.success() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// After a failed transaction: the kernel holds what it held before, which the next
    /// (full) transaction cleans up along with anything else in the table.
    fn forget(&mut self) {
        for table in &mut self.tables {
            if let Some(held) = table.in_kernel.take() {
                let mut leftovers = table.leftovers.take().unwrap_or_default();
                leftovers.extend(Leftovers::of(&held));
                table.leftovers = Some(leftovers);
            }
        }
    }

    /// Deletes the UDP and SCTP flows the change to `state` left stale, as upstream.
    async fn delete_stale_flows(&mut self, state: &ProxyState) -> Vec<conntrack::Cleanup> {
        let mut cleanups = Vec::new();
        if let Some(previous) = self.applied.replace(state.clone()) {
            let executor = Conntrack::new(&self.config.command_prefix, &self.config.conntrack);
            for &family in &self.config.families {
                cleanups
                    .push(conntrack::delete_stale_flows(&executor, &previous, state, family).await);
            }
        }
        cleanups
    }
}
