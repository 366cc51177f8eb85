//! Partial syncs (kube-proxy's KEP-3453): a restore rewrites the shared chains every time, but
//! leaves out the per-Service chains (`KUBE-SVC-…`, `KUBE-SEP-…`, …) the kernel already holds
//! exactly as they are rendered now. `iptables-restore --noflush` leaves a chain the payload does
//! not name untouched, so what is left out stays as it is.
//!
//! Each family keeps the rules it rendered per Service ([`Rendered`]), tied to the `Arc` of the
//! Service they came from: a Service the new state shares with the last one is not rendered
//! again, and its chains are known to be in the kernel unchanged. Only a changed Service's chains
//! are compared rule by rule with what was written for it, so moving one endpoint rewrites the
//! Service's spreading chain and the new endpoint's chain, and deletes the old endpoint's.
//!
//! Only full syncs read the kernel's chains (`iptables-save` is slow at scale): a chain the
//! kernel no longer has is written again by the next full one, which the canaries force when the
//! tables were flushed, as kube-proxy's.

use super::render::{
    AssembledNat, Chain, ServiceFilter, ServiceNat, ServiceRules, assemble_filter, assemble_nat,
    assemble_nat_full, render_service,
};
use crate::node_options::FamilyOptions;
use crate::{ProxyState, Service, ServiceKey};
use imbl::OrdMap;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

/// One family's rules for a state, per Service.
#[derive(Debug, Clone, Default)]
pub(crate) struct Rendered {
    /// The Services rendered, as the state held them.
    services: OrdMap<ServiceKey, Arc<Service>>,
    /// What each of them renders to.
    rules: OrdMap<ServiceKey, Arc<ServiceRules>>,
}

impl Rendered {
    /// The rules for `state`, rendering again only the Services that differ from those rendered
    /// here; returns them with the keys of the Services added, changed or removed, in key order.
    #[must_use]
    pub(crate) fn update(
        &self,
        state: &ProxyState,
        options: &FamilyOptions,
    ) -> (Self, Vec<ServiceKey>) {
        let changed: Vec<ServiceKey> = crate::changed_keys(&self.services, &state.services)
            .cloned()
            .collect();
        let mut rules = self.rules.clone();
        for key in &changed {
            match state.services.get(key) {
                Some(service) => {
                    rules.insert(key.clone(), Arc::new(render_service(service, options)));
                }
                None => {
                    rules.remove(key);
                }
            }
        }
        let rendered = Self {
            services: state.services.clone(),
            rules,
        };
        (rendered, changed)
    }

    /// Whether every Service of `changed` renders here as it did in `before`: then the change
    /// writes nothing this family holds, as an IPv4 endpoint's to the IPv6 rules.
    pub(crate) fn same_rules_as(&self, before: &Self, changed: &[ServiceKey]) -> bool {
        changed
            .iter()
            .all(|key| self.rules.get(key) == before.rules.get(key))
    }

    /// The nat chains of the Service of `key`; none when it is not rendered here.
    fn chains_of(&self, key: &ServiceKey) -> &[Chain] {
        self.rules.get(key).map_or(&[], |rules| &rules.nat.chains)
    }

    /// Every Service's nat rules, in key order.
    fn nat(&self) -> Vec<&ServiceNat> {
        self.rules.values().map(|rules| &rules.nat).collect()
    }
}

/// A payload ready for `iptables-restore`, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Payload {
    /// The filter table's restore input.
    pub filter: String,
    /// The nat table's, restored after the filter table's. The two stay apart, so that writing
    /// them copies neither: at tens of thousands of rules each copy is megabytes.
    pub nat: String,
    /// Rules in the payload, per table, in payload order.
    pub rules_written: Vec<(String, u32)>,
    /// Rules the tables hold after the restore, per table: those written and those left in place.
    pub rules_total: Vec<(String, u32)>,
}

/// The payload of a full sync: every chain of `rendered`; the owned nat chains in `existing`
/// that no Service writes any more are deleted.
#[must_use]
pub(crate) fn full(
    rendered: &Rendered,
    existing: &BTreeSet<String>,
    options: &FamilyOptions,
) -> Payload {
    payload(
        rendered,
        options,
        assemble_nat_full(rendered.nat().into_iter(), existing, options),
    )
}

/// The payload of a partial sync from `before`, which the kernel holds, to `after`: the shared
/// chains whole, and of the `changed` Services only the chains whose rules differ from those
/// written for them; their chains that are gone are deleted.
#[must_use]
pub(crate) fn partial(
    before: &Rendered,
    after: &Rendered,
    changed: &[ServiceKey],
    options: &FamilyOptions,
) -> Payload {
    let mut written: Vec<&Chain> = Vec::new();
    let mut stale: BTreeSet<&str> = BTreeSet::new();
    for key in changed {
        let (old, new) = (before.chains_of(key), after.chains_of(key));
        let old_rules: BTreeMap<&str, &[String]> = old
            .iter()
            .map(|chain| (chain.name.as_str(), chain.rules.as_slice()))
            .collect();
        let new_names: BTreeSet<&str> = new.iter().map(|chain| chain.name.as_str()).collect();
        written.extend(
            new.iter().filter(|chain| {
                old_rules.get(chain.name.as_str()) != Some(&chain.rules.as_slice())
            }),
        );
        stale.extend(
            old_rules
                .into_keys()
                .filter(|name| !new_names.contains(name)),
        );
    }
    let stale: Vec<&str> = stale.into_iter().collect();
    payload(
        after,
        options,
        assemble_nat(after.nat().into_iter(), &written, &stale, options),
    )
}

/// The filter table of `rendered` (always written whole) before `nat`.
fn payload(rendered: &Rendered, options: &FamilyOptions, nat: AssembledNat) -> Payload {
    let services: Vec<&ServiceFilter> =
        rendered.rules.values().map(|rules| &rules.filter).collect();
    let filter = assemble_filter(services.into_iter(), options);
    Payload {
        filter: filter.payload,
        nat: nat.payload,
        rules_written: vec![
            ("filter".to_owned(), filter.rule_count),
            ("nat".to_owned(), nat.written),
        ],
        rules_total: vec![
            ("filter".to_owned(), filter.rule_count),
            ("nat".to_owned(), nat.total),
        ],
    }
}

impl Payload {
    /// Both tables, in restore order.
    #[must_use]
    pub fn tables(&self) -> [&str; 2] {
        [&self.filter, &self.nat]
    }
}

#[cfg(test)]
mod tests;
