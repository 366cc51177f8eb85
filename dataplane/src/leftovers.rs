//! What kube-proxy's other proxy modes leave on a node, found and removed: the nftables mode's
//! tables (`ip kube-proxy`, `ip6 kube-proxy`) and the IPVS mode's `kube-ipvs0` interface and
//! `KUBE-*` ipsets, through the `nft`, `ip` and `ipset` tools operators look with.
//!
//! Switching to iptables mode removes what would change how the node handles Service traffic
//! ([`Leftovers::remove_for_iptables_mode`]): the nftables tables (kube-proxy does the same,
//! KEP-3866) and `kube-ipvs0`, whose addresses make every cluster IP local to the node (so it
//! accepts, and answers ARP for, traffic to them itself). The ipsets are inert without the IPVS
//! mode's iptables rules, which may still use them, and are only removed by `--cleanup`
//! ([`Leftovers::remove_all`]). IPVS virtual servers are not tools' business: the IPVS client
//! removes them (`ipvs::cleanup`).

use crate::tool::{self, RunError};
use std::{io, process::Output};

/// The tools, found on `PATH` as the iptables tools are.
const NFT: &str = "nft";
const IP: &str = "ip";
const IPSET: &str = "ipset";
/// kube-proxy's nftables mode's table, in each IP family.
const NFT_TABLES: [&str; 2] = ["ip kube-proxy", "ip6 kube-proxy"];
/// The dummy interface kube-proxy's IPVS mode binds Service addresses to.
const IPVS_INTERFACE: &str = "kube-ipvs0";
/// The prefix of every ipset kube-proxy's IPVS mode creates (`KUBE-6-` for IPv6 included).
const IPSET_PREFIX: &str = "KUBE-";

/// What can go wrong while removing leftovers.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tool could not be started (other than for not being installed) or waited for.
    #[error(transparent)]
    Run(#[from] RunError),
    /// A tool refused, e.g. an ipset still used by an iptables rule.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        /// The command line, without the configured prefix.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed on stderr.
        stderr: String,
    },
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What a removal took out, and what it could not look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Removed {
    /// nftables tables, as `family name` (`ip kube-proxy`).
    pub nft_tables: Vec<String>,
    /// Network interfaces.
    pub interfaces: Vec<String>,
    /// ipsets.
    pub ipsets: Vec<String>,
    /// Why a kind of leftover was not looked at (a tool not installed, no ipset support).
    pub skipped: Vec<String>,
}

impl Removed {
    /// Whether nothing was removed.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nft_tables.is_empty() && self.interfaces.is_empty() && self.ipsets.is_empty()
    }
}

/// Finds and removes the other proxy modes' leftovers.
#[derive(Debug, Clone, Default)]
pub struct Leftovers {
    /// Words put before every command, e.g. `["ip", "netns", "exec", "ns1"]`; none for the
    /// agent, which runs in the node's namespaces itself.
    command_prefix: Vec<String>,
}

impl Leftovers {
    /// Leftovers found with every command preceded by the words of `prefix`.
    #[must_use]
    pub fn new(prefix: &[String]) -> Self {
        Self {
            command_prefix: prefix.to_vec(),
        }
    }

    /// Removes what an iptables-mode node must not keep from another mode: the nftables
    /// tables and `kube-ipvs0`.
    ///
    /// # Errors
    ///
    /// If a tool fails; what was removed before stays removed.
    pub async fn remove_for_iptables_mode(&self) -> Result<Removed> {
        let mut removed = Removed::default();
        self.remove_nft_tables(&mut removed).await?;
        self.remove_ipvs_interface(&mut removed).await?;
        Ok(removed)
    }

    /// Removes what would change how an IPVS-mode node handles Service traffic: the nftables
    /// tables. `kube-ipvs0` and the ipsets are the IPVS mode's own; the iptables mode's chains
    /// are left as upstream leaves them, unreferenced once the IPVS mode rewrites `KUBE-SERVICES`.
    ///
    /// # Errors
    ///
    /// If a tool fails; what was removed before stays removed.
    pub async fn remove_for_ipvs_mode(&self) -> Result<Removed> {
        let mut removed = Removed::default();
        self.remove_nft_tables(&mut removed).await?;
        Ok(removed)
    }

    /// Removes what the IPVS mode leaves that an nftables-mode node must not keep: `kube-ipvs0`
    /// and the `KUBE-*` ipsets. Run after the iptables rules are gone (kube-proxy's nftables
    /// mode removes both iptables-based modes' rules on start), as they may use the ipsets.
    ///
    /// # Errors
    ///
    /// If a tool fails; what was removed before stays removed.
    pub async fn remove_for_nftables_mode(&self) -> Result<Removed> {
        let mut removed = Removed::default();
        self.remove_ipvs_interface(&mut removed).await?;
        self.remove_ipsets(&mut removed).await?;
        Ok(removed)
    }

    /// Removes every leftover of the other modes: the nftables tables, `kube-ipvs0` and the
    /// `KUBE-*` ipsets. Run after the iptables rules are gone, as they may use the ipsets.
    ///
    /// # Errors
    ///
    /// If a tool fails, e.g. an ipset is still used by a rule; what was removed before stays
    /// removed.
    pub async fn remove_all(&self) -> Result<Removed> {
        let mut removed = self.remove_for_iptables_mode().await?;
        self.remove_ipsets(&mut removed).await?;
        Ok(removed)
    }

    async fn remove_nft_tables(&self, removed: &mut Removed) -> Result<()> {
        let Some(listing) = self.list(NFT, &["list", "tables"]).await? else {
            removed.skipped.push(format!("{NFT}: not installed"));
            return Ok(());
        };
        for table in nft_tables(&listing) {
            let mut args = vec!["delete", "table"];
            args.extend(table.split(' '));
            self.succeed(NFT, &args).await?;
            removed.nft_tables.push(table.to_owned());
        }
        Ok(())
    }

    async fn remove_ipvs_interface(&self, removed: &mut Removed) -> Result<()> {
        let listing = self
            .list(IP, &["-o", "link", "show"])
            .await?
            .unwrap_or_default();
        if interfaces(&listing).any(|name| name == IPVS_INTERFACE) {
            self.succeed(IP, &["link", "delete", IPVS_INTERFACE])
                .await?;
            removed.interfaces.push(IPVS_INTERFACE.to_owned());
        }
        Ok(())
    }

    async fn remove_ipsets(&self, removed: &mut Removed) -> Result<()> {
        let listing = match self.list(IPSET, &["list", "-n"]).await {
            Ok(Some(listing)) => listing,
            Ok(None) => {
                let skipped = format!("{IPSET}: not installed");
                removed.skipped.push(skipped);
                return Ok(());
            }
            // A kernel without ipset support (no `ip_set` module) holds no sets.
            Err(Error::Failed { stderr, .. }) => {
                removed.skipped.push(format!("ipsets: {stderr}"));
                return Ok(());
            }
            Err(err) => return Err(err),
        };
        for set in listing
            .lines()
            .filter(|name| name.starts_with(IPSET_PREFIX))
        {
            self.succeed(IPSET, &["destroy", set]).await?;
            removed.ipsets.push(set.to_owned());
        }
        Ok(())
    }

    /// The standard output of a listing; `None` when the tool is not installed.
    async fn list(&self, program: &str, args: &[&str]) -> Result<Option<String>> {
        match self.output(program, args).await? {
            None => Ok(None),
            Some(output) => Ok(Some(checked(program, args, output)?)),
        }
    }

    /// Runs a command that must succeed (a missing tool included).
    async fn succeed(&self, program: &str, args: &[&str]) -> Result<String> {
        let output = self.output(program, args).await?.ok_or_else(|| RunError {
            program: program.to_owned(),
            source: io::ErrorKind::NotFound.into(),
        })?;
        checked(program, args, output)
    }

    /// Runs a command behind the prefix; `None` when the program is not installed.
    async fn output(&self, program: &str, args: &[&str]) -> Result<Option<Output>> {
        let mut words = self
            .command_prefix
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(program))
            .chain(args.iter().copied());
        // `words` holds at least `program`.
        let first = words.next().unwrap_or(program);
        let rest: Vec<String> = words.map(str::to_owned).collect();
        match tool::run(first, &rest, None).await {
            Ok(ran) if !self.command_prefix.is_empty() && not_found(&ran.output) => Ok(None),
            Ok(ran) => Ok(Some(ran.output)),
            Err(err) if err.source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(err) => Err(RunError {
                program: program.to_owned(),
                source: err.source,
            }
            .into()),
        }
    }
}

/// Whether a prefix such as `ip netns exec` said it could not find the program.
fn not_found(output: &Output) -> bool {
    !output.status.success()
        && String::from_utf8_lossy(&output.stderr).contains("No such file or directory")
}

/// The standard output of a command that must have succeeded.
fn checked(program: &str, args: &[&str], output: Output) -> Result<String> {
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    Err(Error::Failed {
        command: std::iter::once(program)
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" "),
        status: output.status,
        stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
    })
}

/// kube-proxy's tables among `nft list tables` output (`table ip kube-proxy` lines).
fn nft_tables(listing: &str) -> impl Iterator<Item = &str> {
    listing
        .lines()
        .filter_map(|line| line.trim().strip_prefix("table "))
        .filter(|table| NFT_TABLES.contains(table))
}

/// Interface names in `ip -o link show` output (`2: kube-ipvs0: <BROADCAST,...`, or
/// `3: veth0@if2: ...` for a pair).
fn interfaces(listing: &str) -> impl Iterator<Item = &str> {
    listing.lines().filter_map(|line| {
        let name = line.split(": ").nth(1)?;
        Some(name.split('@').next().unwrap_or(name))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_kube_proxys_nft_tables_are_taken() {
        let listing = "table ip filter\ntable ip kube-proxy\ntable inet kube-proxy\n\
                       table ip6 kube-proxy\ntable ip kube-proxy-other\n";
        let tables: Vec<&str> = nft_tables(listing).collect();
        assert_eq!(tables, ["ip kube-proxy", "ip6 kube-proxy"]);
    }

    #[test]
    fn interface_names_are_read_without_their_peers() {
        let listing = "1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue\n\
                       2: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop\n\
                       3: eth0@if7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500\n";
        let names: Vec<&str> = interfaces(listing).collect();
        assert_eq!(names, ["lo", "kube-ipvs0", "eth0"]);
    }
}
