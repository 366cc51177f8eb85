//! The transaction builder: what the kernel holds and what it should hold in, one `nft -f -`
//! script out, which the kernel applies atomically or not at all.
//!
//! **Full** (nothing known about the kernel: the first sync, after a failure, or when the
//! options changed): the table is created if missing and `flush table` empties every chain in it,
//! the Services' included, so no chain refers to another chain or to a set any more. The fixed
//! part is then written again (base chains deleted and created again, so a changed hook or
//! priority applies; every fixed set and map flushed and refilled), then every Service's affinity
//! sets, endpoint maps, chains, rules and elements. Affinity sets keep the clients they hold.
//!
//! **Incremental** (the kernel holds `previous`, applied by a successful transaction): only the
//! Services that differ are looked at. A chain whose rules changed is flushed and written again,
//! a new one created, one no longer wanted flushed; elements are added and deleted one by one,
//! where the table's copy of them changed; affinity sets follow their endpoints, and endpoint
//! maps the chains that pick from them.
//!
//! **Stale chains.** A chain is never deleted in the transaction that drops the last reference
//! to it: kernels before 6.2 notice only a little later that a verdict map element no longer
//! points at it, and refuse the deletion (as upstream, which waits a second). So a chain no
//! longer wanted is flushed and reported in [`Transaction::stale_chains`]; the caller passes it
//! back in [`Leftovers::chains`] to a later transaction, which deletes it (`add chain` first, so a
//! chain someone else deleted meanwhile does not fail the transaction). Affinity sets are only
//! referenced by rules, which the kernel forgets at once, so they are deleted in the same
//! transaction, after the chains using them are flushed. So are endpoint maps no chain picks from
//! any more.
//!
//! Order inside a script: sets before the rules using them; chains created before the rules and
//! elements that jump to them; chains flushed before the sets they used are deleted; elements
//! deleted before their replacements are added; leftovers deleted last.
//!
//! A caller's loop, per family:
//!
//! ```text
//! next = rendered.update(state, options)
//! tx = transaction(in_kernel.then_some(&rendered), &next, &leftovers)
//! run `nft -f -` with tx.script (skip when tx.is_empty())
//!   ok  → rendered = next, in_kernel = true, leftovers = Leftovers { chains: tx.stale_chains, .. }
//!   err → in_kernel = false, leftovers += Leftovers::of(&rendered) (the kernel still holds it)
//! ```
//!
//! On the first sync, `leftovers` may hold what `nft list chains` and `nft list sets` find in
//! the table (a previous run's objects): those no longer wanted are flushed, reported stale and
//! deleted by the next sync. Upstream's one-second grace before a deletion is the caller's to
//! keep, by holding back chains in [`Leftovers::chains`] until they are old enough: a chain is
//! never deleted while `previous` or `next` has it, so holding one back is always safe.

#[cfg(test)]
mod tests;

use super::names::{AFFINITY_PREFIX, EndpointMap};
use super::render::skeleton::{definition, is_fixed_chain};
use super::render::{AffinitySet, Chain, Container, Element, ElementId, Rendered, ServiceRules};
use super::script::{Script, TABLE, address_type, family_keyword};
use crate::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Objects the kernel's table may hold that no render the kernel holds names: chains flushed by
/// an earlier transaction ([`Transaction::stale_chains`]), or what a listing of the table found.
/// Each one the next render does not want is deleted (chains only once they can no longer be
/// referenced, see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Chain names. In an incremental transaction each must be empty and unreferenced (it was
    /// flushed and its references removed by an earlier, successful transaction).
    pub chains: BTreeSet<String>,
    /// Set and map names; only affinity sets (`affinity-…`) and endpoint maps (`endpoints-…`)
    /// are deleted, the fixed sets and maps are the table's own.
    pub sets: BTreeSet<String>,
}

impl Leftovers {
    /// Every chain, affinity set and endpoint map of `rendered`: what the kernel holds after the
    /// transaction that applied it, to pass to a full transaction once that state is no longer
    /// trusted.
    #[must_use]
    pub fn of(rendered: &Rendered) -> Self {
        let maps = rendered.endpoint_maps().map(EndpointMap::name);
        Self {
            chains: rendered.chain_names().map(str::to_owned).collect(),
            sets: rendered
                .set_names()
                .map(str::to_owned)
                .chain(maps)
                .collect(),
        }
    }

    /// The chains and sets of `family`'s `kube-proxy` table found in the output of `nft list`
    /// commands (`nft list chains ip`, `nft --terse list sets ip`, or `nft --terse list table ip
    /// kube-proxy`; several outputs may be concatenated): what a full transaction needs to take
    /// over a table left by an earlier run. Other tables' objects are skipped.
    #[must_use]
    pub fn from_listing(family: IpFamily, listing: &str) -> Self {
        let ours = format!("table {} {} {{", family_keyword(family), TABLE);
        let mut leftovers = Self::default();
        let mut in_ours = false;
        for line in listing.lines() {
            if let Some(header) = line.strip_prefix("table ") {
                in_ours = format!("table {header}") == ours;
                continue;
            }
            // Object headers are indented once; their contents deeper.
            let Some(object) = line.strip_prefix('\t').filter(|_| in_ours) else {
                continue;
            };
            let mut words = object.split(' ');
            let (Some(kind), Some(name), Some("{")) = (words.next(), words.next(), words.next())
            else {
                continue;
            };
            match kind {
                "chain" => {
                    leftovers.chains.insert(name.to_owned());
                }
                "set" | "map" => {
                    leftovers.sets.insert(name.to_owned());
                }
                _ => {}
            }
        }
        leftovers
    }

    /// Adds `other`'s names.
    pub fn extend(&mut self, other: Self) {
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
    }

    /// Whether there is nothing left over.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty() && self.sets.is_empty()
    }
}

/// What a transaction does, for metrics and logs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Chains created or written again (fixed ones included in a full transaction).
    pub chains_written: usize,
    /// Rules written into them.
    pub rules_written: usize,
    /// Chains flushed because no Service wants them any more (now stale).
    pub chains_flushed: usize,
    /// Stale chains deleted.
    pub chains_deleted: usize,
    /// Affinity sets and endpoint maps created or created again.
    pub sets_written: usize,
    /// Affinity sets and endpoint maps deleted.
    pub sets_deleted: usize,
    /// Elements added to the shared sets and maps.
    pub elements_added: usize,
    /// Elements deleted from them (one whose value changed counts as deleted and added).
    pub elements_deleted: usize,
}

/// One `nft -f -` script and what it leaves behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transaction {
    /// The script, one command per line; empty when the kernel already holds `next`.
    pub script: String,
    /// The whole table is reset and written (the fixed part and every Service).
    pub full: bool,
    /// Chains the script flushes and leaves unreferenced, to delete in a later transaction (pass
    /// them in [`Leftovers::chains`] once this one has succeeded).
    pub stale_chains: BTreeSet<String>,
    /// What the script does.
    pub counts: Counts,
}

impl Transaction {
    /// Whether there is nothing to run.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.script.is_empty()
    }
}

/// The transaction that makes the kernel hold `next`.
///
/// `previous` is what the kernel holds, applied by the last successful transaction; `None` when
/// that is unknown (the first sync, or after a failure), which makes the transaction full, as
/// does a change of options or of the endpoint maps' numbering between `previous` and `next`.
/// `leftovers` are the chains and sets the table may hold besides (see [`Leftovers`]).
#[must_use]
pub fn transaction(
    previous: Option<&Rendered>,
    next: &Rendered,
    leftovers: &Leftovers,
) -> Transaction {
    match previous {
        Some(previous) if previous.comparable(next) => incremental(previous, next, leftovers),
        _ => full(previous, next, leftovers),
    }
}

/// The script deleting `family`'s whole table, whether or not it exists (what kube-proxy's
/// `--cleanup` does).
#[must_use]
pub fn delete_table(family: IpFamily) -> String {
    let mut script = Script::new(family);
    script.add_table();
    script.push_script(&format!(
        "delete table {} {TABLE}\n",
        family_keyword(family)
    ));
    script.into_text()
}

/// A transaction resetting the whole table to `next`; `previous`, when known, is what the
/// kernel held (its objects are leftovers too).
fn full(previous: Option<&Rendered>, next: &Rendered, leftovers: &Leftovers) -> Transaction {
    let family = next.family();
    let skeleton = next.skeleton();
    let mut counts = Counts {
        chains_written: skeleton.chains,
        rules_written: skeleton.rules,
        elements_added: skeleton.elements,
        ..Counts::default()
    };
    let mut script = Script::new(family);
    script.push_script(&skeleton.script);

    // `flush table` left no rule using a set, so affinity sets no longer wanted go now.
    let previous_sets = previous.into_iter().flat_map(Rendered::set_names);
    let stale_sets: BTreeSet<&str> = leftovers
        .sets
        .iter()
        .map(String::as_str)
        .chain(previous_sets)
        .filter(|set| set.starts_with(AFFINITY_PREFIX) && !next.has_set(set))
        .collect();
    for set in stale_sets {
        delete_affinity_set(&mut script, family, set);
        counts.sets_deleted += 1;
    }
    let previous_maps = previous.into_iter().flat_map(Rendered::endpoint_maps);
    let stale_maps: BTreeSet<EndpointMap> = leftovers
        .sets
        .iter()
        .filter_map(|name| EndpointMap::from_name(name))
        .chain(previous_maps)
        .filter(|map| !next.has_endpoint_map(*map))
        .collect();
    for map in stale_maps {
        delete_endpoint_map(&mut script, family, map);
        counts.sets_deleted += 1;
    }
    // Emptied, as the fixed maps: a number may now belong to another chain.
    for map in next.endpoint_maps() {
        add_endpoint_map(&mut script, family, map);
        script.flush_set("map", &map.name());
        counts.sets_written += 1;
    }

    let mut elements = Vec::new();
    for (key, rules) in next.service_rules() {
        for set in &rules.sets {
            add_affinity_set(&mut script, family, set);
            counts.sets_written += 1;
        }
        for chain in &rules.chains {
            script.add_chain(&chain.name, "");
        }
        counts.chains_written += rules.chains.len();
        write_rules(&mut script, &rules.chains, &mut counts);
        elements.extend(rules.elements.iter().filter(|e| next.holds(key, e)));
    }
    // Last, a command per container: the kernel checks a map's elements against the rules using
    // it when either is added, which costs least while the maps are still empty.
    elements.sort_by_key(|element| element.container);
    counts.elements_added += elements.len();
    script.add_elements(elements);

    // Flushed by `flush table`; deleted by a later transaction.
    let previous_chains = previous.into_iter().flat_map(Rendered::chain_names);
    let stale_chains: BTreeSet<String> = leftovers
        .chains
        .iter()
        .map(String::as_str)
        .chain(previous_chains)
        .filter(|chain| !is_fixed_chain(chain) && !next.has_chain(chain))
        .map(str::to_owned)
        .collect();
    counts.chains_flushed = stale_chains.len();
    Transaction {
        script: script.into_text(),
        full: true,
        stale_chains,
        counts,
    }
}

/// A transaction from `previous`, which the kernel holds, to `next`, rendered with the same
/// options.
fn incremental(previous: &Rendered, next: &Rendered, leftovers: &Leftovers) -> Transaction {
    let family = next.family();
    let mut script = Script::new(family);
    let mut counts = Counts::default();
    let mut stale_chains = BTreeSet::new();
    let mut written: Vec<&Chain> = Vec::new();
    let mut touched: BTreeSet<ElementId> = BTreeSet::new();
    let mut deletions = Vec::new();
    let mut additions = Vec::new();
    let empty = ServiceRules::default();

    // Before the rules that pick from them.
    for map in next.endpoint_maps() {
        if !previous.has_endpoint_map(map) {
            add_endpoint_map(&mut script, family, map);
            counts.sets_written += 1;
        }
    }

    for key in crate::changed_keys(previous.services(), next.services()) {
        let old = previous.service(key).unwrap_or(&empty);
        let new = next.service(key).unwrap_or(&empty);
        if old == new {
            continue;
        }
        let old_chains: BTreeMap<&str, &[String]> = old
            .chains
            .iter()
            .map(|chain| (chain.name.as_str(), chain.rules.as_slice()))
            .collect();
        let old_sets: BTreeMap<&str, &AffinitySet> = old
            .sets
            .iter()
            .map(|set| (set.name.as_str(), set))
            .collect();
        // A set whose timeout changed is created again, so every chain using it (all the
        // Service's) is flushed first and written again after.
        let timeout_changed = new.sets.iter().any(|set| {
            old_sets
                .get(set.name.as_str())
                .is_some_and(|old| old.timeout_seconds != set.timeout_seconds)
        });

        for chain in &new.chains {
            match old_chains.get(chain.name.as_str()) {
                None => script.add_chain(&chain.name, ""),
                Some(rules) if *rules != chain.rules.as_slice() || timeout_changed => {
                    script.add_chain(&chain.name, "");
                    script.flush_chain(&chain.name);
                }
                Some(_) => continue,
            }
            written.push(chain);
        }
        for chain in &old.chains {
            if !new.chains.iter().any(|c| c.name == chain.name) {
                script.flush_chain(&chain.name);
                stale_chains.insert(chain.name.clone());
            }
        }

        for set in &old.sets {
            if !new.sets.iter().any(|s| s.name == set.name) {
                script.delete_set("set", &set.name);
                counts.sets_deleted += 1;
            }
        }
        for set in &new.sets {
            match old_sets.get(set.name.as_str()) {
                Some(old) if old.timeout_seconds == set.timeout_seconds => continue,
                Some(_) => {
                    script.delete_set("set", &set.name);
                    counts.sets_deleted += 1;
                }
                None => {}
            }
            add_affinity_set(&mut script, family, set);
            counts.sets_written += 1;
        }

        for element in old.elements.iter().chain(&new.elements) {
            if !element.container.is_endpoint_map() {
                touched.insert((element.container, Arc::clone(&element.key)));
            }
        }
        endpoint_changes(old, new, next, &mut deletions, &mut additions);
    }
    counts.chains_written = written.len();
    counts.chains_flushed = stale_chains.len();
    for chain in written {
        write_rules(&mut script, std::slice::from_ref(chain), &mut counts);
    }

    // The table holds each shared element's first holder's copy; only where that copy changed
    // does the kernel's element change.
    for id in &touched {
        let before = previous.element(id);
        let after = next.element(id);
        match (before, after) {
            (Some(before), Some(after)) if before.same_data(after) => {}
            (Some(before), after) => {
                deletions.push(before);
                additions.extend(after);
            }
            (None, after) => additions.extend(after),
        }
    }
    // One command per container.
    deletions.sort_by_key(|element| element.container);
    additions.sort_by_key(|element| element.container);
    counts.elements_deleted = deletions.len();
    counts.elements_added = additions.len();
    script.delete_elements(deletions);
    script.add_elements(additions);

    // After the chains that picked from them were flushed or written again.
    for map in previous.endpoint_maps() {
        if !next.has_endpoint_map(map) {
            script.delete_set("map", &map.name());
            counts.sets_deleted += 1;
        }
    }
    for set in &leftovers.sets {
        if set.starts_with(AFFINITY_PREFIX) && !previous.has_set(set) && !next.has_set(set) {
            delete_affinity_set(&mut script, family, set);
            counts.sets_deleted += 1;
        }
        let stale_map = EndpointMap::from_name(set)
            .filter(|map| !previous.has_endpoint_map(*map) && !next.has_endpoint_map(*map));
        if let Some(map) = stale_map {
            delete_endpoint_map(&mut script, family, map);
            counts.sets_deleted += 1;
        }
    }
    for chain in &leftovers.chains {
        // One the kernel still refers to (the previous render's) or that is wanted again
        // stays; the others were flushed and unreferenced by an earlier transaction.
        if !previous.has_chain(chain) && !next.has_chain(chain) && !is_fixed_chain(chain) {
            script.add_chain(chain, "");
            script.delete_chain(chain);
            counts.chains_deleted += 1;
        }
    }

    Transaction {
        script: script.into_text(),
        full: false,
        stale_chains,
        counts,
    }
}

/// The endpoint-map elements one Service's change from `old` to `new` deletes and adds: each is
/// the Service's own, so they are compared within it. Those of a map `next` no longer has go
/// with the map.
fn endpoint_changes<'r>(
    old: &'r ServiceRules,
    new: &'r ServiceRules,
    next: &Rendered,
    deletions: &mut Vec<&'r Element>,
    additions: &mut Vec<&'r Element>,
) {
    let own = |rules: &'r ServiceRules| {
        rules
            .elements
            .iter()
            .filter(|element| element.container.is_endpoint_map())
            .map(|element| ((element.container, &*element.key), element))
            .collect::<BTreeMap<_, _>>()
    };
    let (before, after) = (own(old), own(new));
    for (id, element) in &before {
        let kept = after.get(id).is_some_and(|now| now.same_data(element));
        let map_stays =
            matches!(element.container, Container::Endpoints(map) if next.has_endpoint_map(map));
        if !kept && map_stays {
            deletions.push(element);
        }
    }
    for (id, element) in &after {
        if !before.get(id).is_some_and(|then| then.same_data(element)) {
            additions.push(element);
        }
    }
}

/// Appends the rules of `chains`.
fn write_rules(script: &mut Script, chains: &[Chain], counts: &mut Counts) {
    for chain in chains {
        for rule in &chain.rules {
            script.add_rule(&chain.name, rule);
        }
        counts.rules_written += chain.rules.len();
    }
}

/// Creates affinity set `set` (or updates its timeout, on kernels that allow it).
fn add_affinity_set(script: &mut Script, family: IpFamily, set: &AffinitySet) {
    script.add_set(
        "set",
        &set.name,
        &format!(
            " {{ type {} ; flags dynamic,timeout ; timeout {}s ; }}",
            address_type(family),
            set.timeout_seconds
        ),
    );
}

/// Creates endpoint map `map` if it is missing.
fn add_endpoint_map(script: &mut Script, family: IpFamily, map: EndpointMap) {
    let container = Container::Endpoints(map);
    script.add_set("map", &map.name(), &definition(container, family));
}

/// Deletes endpoint map `map` whether or not it exists.
fn delete_endpoint_map(script: &mut Script, family: IpFamily, map: EndpointMap) {
    add_endpoint_map(script, family, map);
    script.delete_set("map", &map.name());
}

/// Deletes affinity set `name` whether or not it exists.
fn delete_affinity_set(script: &mut Script, family: IpFamily, name: &str) {
    script.add_set(
        "set",
        name,
        &format!(
            " {{ type {} ; flags dynamic,timeout ; }}",
            address_type(family)
        ),
    );
    script.delete_set("set", name);
}
