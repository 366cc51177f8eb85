//! Partial syncs (kube-proxy's KEP-3453): a restore rewrites the top-level chains every time, but
//! leaves out the per-Service chains (`KUBE-SVC-…`, `KUBE-SEP-…`, …) the kernel already holds
//! exactly as they are rendered now. `iptables-restore --noflush` leaves a chain the payload does
//! not name untouched, so what is left out stays as it is.
//!
//! The decision compares rendered text with the text of the last successful restore, so it needs
//! no change tracking and cannot miss a change: a Service whose rules come out the same is, by
//! definition, unchanged. Only full syncs read the kernel's chains (`iptables-save` is slow at
//! scale): a chain the kernel no longer has is written again by the next full one, which the
//! canaries force when the tables were flushed, as kube-proxy's.

use super::chain_names::OWNED_PREFIXES;
use std::collections::{BTreeMap, BTreeSet};

/// The per-Service chains of one sync, by table and name, with the rules each holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WrittenChains(BTreeMap<(String, String), Vec<String>>);

impl WrittenChains {
    /// The names of the chains written in `table`.
    #[must_use]
    pub fn chains_in(&self, table: &str) -> BTreeSet<String> {
        self.0
            .keys()
            .filter(|(t, _)| t == table)
            .map(|(_, chain)| chain.clone())
            .collect()
    }
}

/// A payload ready for `iptables-restore`, and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trimmed {
    /// The payload, without the unchanged per-Service chains.
    pub payload: String,
    /// Rules in the payload, per table, in payload order.
    pub rules_written: Vec<(String, u32)>,
    /// Rules the tables hold after the restore, per table: those written and those left in place.
    pub rules_total: Vec<(String, u32)>,
    /// Every per-Service chain rendered, for the next sync's comparison once this one succeeded.
    pub chains: WrittenChains,
}

/// Leaves out of `payload` every per-Service chain whose rules equal those in `previous` and that
/// `existing` (table, chain) still lists. With an empty `previous`, nothing is left out: a full
/// sync.
#[must_use]
pub fn trim(
    payload: &str,
    previous: &WrittenChains,
    existing: &BTreeSet<(String, String)>,
) -> Trimmed {
    let rendered = per_service_chains(payload);
    let unchanged: BTreeSet<&(String, String)> = rendered
        .0
        .iter()
        .filter(|(key, rules)| previous.0.get(*key) == Some(rules) && existing.contains(*key))
        .map(|(key, _)| key)
        .collect();

    let mut kept = String::with_capacity(payload.len());
    let mut written = Counts::default();
    let mut total = Counts::default();
    let mut table = "";
    for line in payload.lines() {
        let skip = match parse(line) {
            Line::Table(name) => {
                table = name;
                written.table(name);
                total.table(name);
                false
            }
            Line::Declare(chain) => unchanged.contains(&(table.to_owned(), chain.to_owned())),
            Line::Rule(chain) => {
                total.add(table);
                let skip = unchanged.contains(&(table.to_owned(), chain.to_owned()));
                if !skip {
                    written.add(table);
                }
                skip
            }
            Line::Delete(_) | Line::Other => false,
        };
        if !skip {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    Trimmed {
        payload: kept,
        rules_written: written.0,
        rules_total: total.0,
        chains: rendered,
    }
}

/// Rule counts per table, in the order tables first appear.
#[derive(Default)]
struct Counts(Vec<(String, u32)>);

impl Counts {
    fn table(&mut self, table: &str) {
        if !self.0.iter().any(|(name, _)| name == table) {
            self.0.push((table.to_owned(), 0));
        }
    }

    fn add(&mut self, table: &str) {
        if let Some((_, count)) = self.0.iter_mut().find(|(name, _)| name == table) {
            *count = count.saturating_add(1);
        }
    }
}

/// The per-Service chains `payload` declares, with their rules; not those it deletes, which
/// must stay declared (flushed) for their `-X` to succeed.
fn per_service_chains(payload: &str) -> WrittenChains {
    let mut chains: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut deleted = Vec::new();
    let mut table = "";
    for line in payload.lines() {
        match parse(line) {
            Line::Table(name) => table = name,
            Line::Declare(chain) if is_per_service(chain) => {
                chains
                    .entry((table.to_owned(), chain.to_owned()))
                    .or_default();
            }
            Line::Rule(chain) if is_per_service(chain) => chains
                .entry((table.to_owned(), chain.to_owned()))
                .or_default()
                .push(line.to_owned()),
            Line::Delete(chain) => deleted.push((table.to_owned(), chain.to_owned())),
            _ => {}
        }
    }
    for key in &deleted {
        chains.remove(key);
    }
    WrittenChains(chains)
}

fn is_per_service(chain: &str) -> bool {
    OWNED_PREFIXES
        .iter()
        .any(|prefix| chain.starts_with(prefix))
}

/// One line of an `iptables-restore` payload, as far as partial syncs care.
enum Line<'a> {
    /// `*table`.
    Table(&'a str),
    /// `:CHAIN POLICY [p:b]`.
    Declare(&'a str),
    /// `-A CHAIN …`.
    Rule(&'a str),
    /// `-X CHAIN`.
    Delete(&'a str),
    /// `COMMIT`, comments.
    Other,
}

fn parse(line: &str) -> Line<'_> {
    if let Some(table) = line.strip_prefix('*') {
        Line::Table(table.trim())
    } else if let Some(declaration) = line.strip_prefix(':') {
        declaration
            .split_whitespace()
            .next()
            .map_or(Line::Other, Line::Declare)
    } else if let Some(rule) = line.strip_prefix("-A ") {
        rule.split_whitespace()
            .next()
            .map_or(Line::Other, Line::Rule)
    } else if let Some(chain) = line.strip_prefix("-X ") {
        Line::Delete(chain.trim())
    } else {
        Line::Other
    }
}

#[cfg(test)]
mod tests;
