//! The iptables mode's backend: one [`FamilyExecutor`] executor per IP family, synced one after the
//! other, as upstream's `metaproxier` runs an IPv4 and an IPv6 proxier side by side.

// Tested with the rest of the backend, in `super::tests::dual_stack`.

use super::{Config, Error, FamilyExecutor};
use crate::{Dataplane, ProxyState, SyncReport};
use crate::{Families, IpFamily};

/// A family's sync failed; the message says which family, the source why.
#[derive(Debug, thiserror::Error)]
#[error("could not sync the {} rules", family.name())]
pub struct FamilyError {
    /// The family whose rules were not applied.
    pub family: IpFamily,
    /// Why.
    #[source]
    pub source: Error,
}

impl crate::SyncError for FamilyError {
    fn failed_step(&self) -> crate::FailedStep {
        crate::SyncError::failed_step(&self.source)
    }

    fn failed_family(&self) -> Option<IpFamily> {
        Some(self.family)
    }
}

/// The iptables dataplane for every IP family the node can program: `iptables` for IPv4 and
/// `ip6tables` for IPv6, each seeing only its family's addresses and endpoints.
#[derive(Debug, Clone)]
pub struct IptablesBackend {
    /// One executor per family, IPv4 first; never empty.
    families: Vec<FamilyExecutor>,
}

impl IptablesBackend {
    /// The executors for `families`, each from `config` with that family's tools
    /// ([`Config::with_family`]).
    #[must_use]
    pub fn new(config: &Config, families: &Families) -> Self {
        Self {
            families: families
                .iter()
                .map(|&family| FamilyExecutor::with_config(config.clone().with_family(family)))
                .collect(),
        }
    }

    /// The executors for the families whose tools work here, found by reading each family's nat
    /// table once. As kube-proxy, a node without a family's tools runs single-stack, and says so;
    /// a node with neither keeps IPv4, whose syncs then report why they fail.
    pub async fn detect(config: &Config) -> Self {
        let mut usable = Vec::new();
        for family in IpFamily::ALL {
            let probe = FamilyExecutor::with_config(config.clone().with_family(family));
            if probe.available().await {
                usable.push(family);
            } else {
                tracing::warn!(
                    ip_family = family.name(),
                    binary = probe.config().iptables_save,
                    "cannot read the nat table with this family's tools; not programming it (single-stack)"
                );
            }
        }
        let dual_stack = Self::new(config, &Families::new(usable));
        tracing::info!(
            ip_families = ?dual_stack.families().iter().map(|f| f.name()).collect::<Vec<_>>(),
            "programming iptables rules"
        );
        dual_stack
    }

    /// Removes every family's rules ([`FamilyExecutor::cleanup`]), each whatever the others'
    /// outcome.
    pub async fn cleanup(&self) -> Vec<(IpFamily, Result<super::Cleaned, Error>)> {
        let mut outcomes = Vec::new();
        for executor in &self.families {
            outcomes.push((executor.config().family, executor.cleanup().await));
        }
        outcomes
    }

    /// The families programmed.
    #[must_use]
    pub fn families(&self) -> Families {
        Families::new(
            self.families
                .iter()
                .map(|executor| executor.config().family),
        )
    }
}

impl Dataplane for IptablesBackend {
    type Error = FamilyError;

    fn mode(&self) -> &'static str {
        "iptables"
    }

    fn ip_families(&self) -> Families {
        self.families()
    }

    fn set_local_cidrs(&mut self, cidrs: Vec<crate::Cidr>) {
        for executor in &mut self.families {
            executor.set_local_cidrs(cidrs.clone());
        }
    }

    fn set_node_port_addresses(&mut self, addresses: Option<Vec<std::net::IpAddr>>) {
        for executor in &mut self.families {
            executor.set_node_port_addresses(addresses.clone());
        }
    }

    fn set_node_ips(&mut self, ips: Vec<std::net::IpAddr>) {
        for executor in &mut self.families {
            executor.set_node_ips(ips.clone());
        }
    }

    /// Syncs every family, also after one failed (the families are independent, as upstream's
    /// proxiers are); the report sums the tables and keeps each family's counts. Returns the
    /// first failing family's error when any failed, so the whole sync is retried.
    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, FamilyError> {
        let mut report: Option<SyncReport> = None;
        let mut first_error = None;
        for executor in &mut self.families {
            match executor.sync(state).await {
                Ok(family_report) => match &mut report {
                    Some(report) => report.merge(family_report),
                    None => report = Some(family_report),
                },
                Err(source) => {
                    let error = FamilyError {
                        family: executor.config().family,
                        source,
                    };
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        "iptables sync failed"
                    );
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            // `families` is never empty, so without an error there is a report.
            None => Ok(report.unwrap_or_default()),
        }
    }
}
