//! The netfilter half of an IPVS sync: the ipsets ([`super::sets`]) written with one
//! `ipset restore`, then each family's masquerade and filter rules ([`super::rules`]) with one
//! `iptables-restore --noflush`, a full one with the jumps from the built-in chains.
//!
//! Both are written only when they change, as far as the kernel is known to hold what was
//! written last. The sets are rewritten whole after a failed run; each family's rules, and its
//! jumps, on the same occasions as the iptables mode's full sync: the first time, after a
//! failure, once an hour, and when a canary chain is gone (someone flushed the tables).

use super::rules::{IpvsRules, JUMPS};
use super::sets::{IpSets, restore_script};
use crate::full_sync::FullSyncClock;
use crate::iptables::{self, Tools};
use crate::tool::{self, RunError, stderr_text};
use crate::{Families, IpFamily};
use std::process::ExitStatus;

/// Why the sets or the rules could not be written.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `ipset` could not run.
    #[error(transparent)]
    Run(#[from] RunError),
    /// `ipset restore` refused a line; the lines before it took effect.
    #[error("ipset restore failed ({status}): {stderr}")]
    Ipset {
        /// Its exit status.
        status: ExitStatus,
        /// What it printed (the failing line's number and why).
        stderr: String,
    },
    /// A family's rules or jumps could not be written.
    #[error("the {} iptables rules", family.name())]
    Iptables {
        /// The family.
        family: IpFamily,
        /// What failed.
        #[source]
        source: iptables::Error,
    },
}

/// What the kernel holds of the sets and rules, and how to write them.
#[derive(Debug)]
pub struct Netfilter {
    /// The `ipset` binary, with the iptables tools' command prefix put before it.
    ipset: String,
    /// The sets written by the last successful `ipset restore`, per family; `None` when the
    /// kernel's are unknown (first sync, or a run that failed half way).
    sets: Option<Vec<IpSets>>,
    /// Each family's rules.
    families: Vec<FamilyRules>,
}

/// One family's rules as last written.
#[derive(Debug)]
struct FamilyRules {
    tools: Tools,
    /// The payload last restored; `None` when the kernel's rules are unknown.
    written: Option<String>,
    full_syncs: FullSyncClock,
}

/// What one sync wrote of a family's rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// The family.
    pub family: IpFamily,
    /// Rules per table (`("nat", 12)`) now in place.
    pub totals: Vec<(String, u32)>,
    /// Whether they were written this sync (unchanged ones are not).
    pub written: bool,
    /// Whether it was a full sync (jumps checked).
    pub full: bool,
}

impl Netfilter {
    /// Writes with `ipset` and, per family of `families`, that family's iptables tools as
    /// `iptables` says (binaries, command prefix, lock wait).
    #[must_use]
    pub fn new(ipset: &str, iptables: &iptables::Config, families: &Families) -> Self {
        Self {
            ipset: ipset.to_owned(),
            sets: None,
            families: families
                .iter()
                .map(|&family| FamilyRules {
                    tools: Tools::new(iptables.clone().with_family(family)),
                    written: None,
                    full_syncs: FullSyncClock::default(),
                })
                .collect(),
        }
    }

    /// Makes the kernel hold `sets` and `rules` (one of each per family, in the order of the
    /// families given to [`Self::new`]): the sets first, so the rules never name a missing one.
    ///
    /// # Errors
    ///
    /// When `ipset` or a family's iptables tools fail; what failed is written whole next time.
    pub async fn sync(
        &mut self,
        sets: Vec<IpSets>,
        rules: &[IpvsRules],
    ) -> Result<Vec<Written>, Error> {
        self.write_sets(sets).await?;
        let mut written = Vec::new();
        for (family, rules) in self.families.iter_mut().zip(rules) {
            match family.sync(rules).await {
                Ok(family) => written.push(family),
                Err(source) => {
                    // The rules may have failed for a set someone destroyed (possible once
                    // they flushed the rules using it): the next sync writes every set again.
                    self.sets = None;
                    return Err(Error::Iptables {
                        family: family.tools.config().family,
                        source,
                    });
                }
            }
        }
        Ok(written)
    }

    /// Runs `ipset restore` with the changes from the sets last written to `sets`, if any.
    async fn write_sets(&mut self, sets: Vec<IpSets>) -> Result<(), Error> {
        let previous = self.sets.take();
        let script: String = sets
            .iter()
            .enumerate()
            .filter_map(|(index, desired)| {
                let previous = previous.as_ref().and_then(|previous| previous.get(index));
                restore_script(previous, desired)
            })
            .collect();
        if let Some(family) = self.families.first()
            && !script.is_empty()
        {
            // Under the iptables tools' command prefix (`ip netns exec …`), as they run.
            let (program, args) = family
                .tools
                .config()
                .command_line(&self.ipset, &["restore".to_owned()]);
            let ran = tool::run(&program, &args, Some(&[&script])).await?;
            if !ran.output.status.success() {
                return Err(Error::Ipset {
                    status: ran.output.status,
                    stderr: stderr_text(&ran.output.stderr),
                });
            }
            ran.written.map_err(|source| RunError {
                program: program.clone(),
                source,
            })?;
            tracing::debug!(lines = script.lines().count(), "restored ipsets");
        }
        self.sets = Some(sets);
        Ok(())
    }
}

#[cfg(test)]
mod tests;

impl FamilyRules {
    /// Writes `rules` when they changed or a full sync is due, with the jumps on a full one.
    async fn sync(&mut self, rules: &IpvsRules) -> Result<Written, iptables::Error> {
        let family = self.tools.config().family;
        let payload = format!("{}{}", rules.filter.payload, rules.nat.payload);
        // Cleared, so that a failure from here on makes the next sync full.
        let written = self.written.take();
        let full = self
            .tools
            .full_sync_reason(&self.full_syncs, written.is_some())
            .await?
            .is_some();
        let tables = [rules.filter.payload.as_str(), rules.nat.payload.as_str()];
        let write = full || written.as_deref() != Some(payload.as_str());
        if full {
            // With the canaries and the missing jumps; a partial sync must not recreate a
            // canary someone flushed before it is probed.
            let saved = self.tools.saved_for_full_sync().await?;
            self.tools
                .restore_full(&tables, &saved, &[], &JUMPS)
                .await?;
            self.tools.canaries_written();
            self.full_syncs.record();
        } else if write {
            self.tools.restore(&tables, false).await?;
        }
        self.written = Some(payload);
        Ok(Written {
            family,
            totals: vec![
                ("filter".to_owned(), rules.filter.rule_count),
                ("nat".to_owned(), rules.nat.rule_count),
            ],
            written: write,
            full,
        })
    }
}
