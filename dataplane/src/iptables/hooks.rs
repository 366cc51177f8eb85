//! What a full sync adds to its one `iptables-restore`: the jumps from the built-in chains, the
//! chains they need that are not ours, and the canaries, so that a single transaction per table
//! writes the rules and hooks them in.
//!
//! kube-proxy checks each jump with `iptables -C` and inserts a missing one with `iptables -I`.
//! Under iptables-legacy each of those calls reads the whole table from the kernel, and an insert
//! (like every extra `*table` section of a restore) writes it all back: measured here at 10,000
//! Services, a check took 0.15 s, an insert 0.47 s and a second `*nat` section 0.63 s, more than
//! restoring the rules themselves. What is missing is read instead from the `iptables-save` a
//! full sync makes anyway, and written in the same restore, with the same result.

use super::{CANARY_TABLES, KUBE_PROXY_CANARY, save};

/// A jump from a built-in chain to one of ours, kept as the first rule of that chain.
#[derive(Debug)]
pub(crate) struct Jump {
    /// The table (`nat`, `filter`).
    pub(crate) table: &'static str,
    /// The built-in chain jumped from.
    pub(crate) chain: &'static str,
    /// Only for the first packet of a connection (`-m conntrack --ctstate NEW`).
    pub(crate) new_only: bool,
    /// The rule's comment, which tools and operators match on; empty for none.
    pub(crate) comment: &'static str,
    /// Our chain.
    pub(crate) target: &'static str,
}

impl Jump {
    /// A jump in the nat table, for every packet.
    pub(crate) const fn nat(
        chain: &'static str,
        comment: &'static str,
        target: &'static str,
    ) -> Self {
        Self {
            table: "nat",
            chain,
            new_only: false,
            comment,
            target,
        }
    }

    /// A jump in the filter table, for new connections only when `new_only`.
    pub(crate) const fn filter(
        chain: &'static str,
        new_only: bool,
        comment: &'static str,
        target: &'static str,
    ) -> Self {
        Self {
            table: "filter",
            chain,
            new_only,
            comment,
            target,
        }
    }
}

impl Jump {
    /// The rule as `iptables-save` writes it after `-A <chain>`.
    pub(crate) fn rule_text(&self) -> String {
        let new_only = if self.new_only {
            "-m conntrack --ctstate NEW "
        } else {
            ""
        };
        let comment = if self.comment.is_empty() {
            String::new()
        } else {
            format!(
                "-m comment --comment {} ",
                super::render::comment(self.comment)
            )
        };
        format!("{new_only}{comment}-j {}", self.target)
    }
}

/// The lines a full sync adds to each table, found missing from the tables' saved state.
#[derive(Debug, Default)]
pub(crate) struct Hooks<'j> {
    /// Per table, in [`CANARY_TABLES`] order: the lines to write before its `COMMIT`.
    lines: Vec<(&'static str, String)>,
    /// The jumps those lines insert, to report once they are in.
    inserted: Vec<&'j Jump>,
}

impl<'j> Hooks<'j> {
    /// The hooks missing from `saved` (`iptables-save` output of the tables jumped in): every
    /// table's canary, each `(table, chain)` of `chains` not there (declaring one that is would
    /// flush it), then each jump of `jumps` not there, inserted first in its chain in the order
    /// given, so that the last one ends up first, as one `iptables -I <chain> 1` after the other
    /// leaves them.
    pub(crate) fn missing_from(
        saved: &str,
        chains: &[(&str, &str)],
        jumps: impl IntoIterator<Item = &'j Jump>,
    ) -> Self {
        let inserted: Vec<&Jump> = jumps
            .into_iter()
            .filter(|jump| {
                // The rule is our own text with balanced quotes (`render::comment`), so it
                // always splits.
                let rule = save::words(&jump.rule_text()).unwrap_or_default();
                !save::has_rule(saved, jump.table, jump.chain, &rule)
            })
            .collect();
        let lines = CANARY_TABLES
            .iter()
            .map(|&table| {
                let mut lines = format!(":{KUBE_PROXY_CANARY} - [0:0]\n");
                for (_, chain) in chains.iter().filter(|(of, chain)| {
                    *of == table && !save::chains(saved, table).contains(*chain)
                }) {
                    lines.push_str(&format!(":{chain} - [0:0]\n"));
                }
                for jump in inserted.iter().filter(|jump| jump.table == table) {
                    lines.push_str(&format!("-I {} 1 {}\n", jump.chain, jump.rule_text()));
                }
                (table, lines)
            })
            .collect();
        Self { lines, inserted }
    }

    /// The restore input: each of `sections` (`*table` to `COMMIT`, one per table) with this
    /// table's lines before its `COMMIT`, then a section for each table `sections` does not hold.
    pub(crate) fn restore_input<'a>(&'a self, sections: &[&'a str]) -> Vec<&'a str> {
        let mut input = Vec::with_capacity(3 * self.lines.len());
        let mut written = Vec::new();
        for &section in sections {
            let table = section
                .lines()
                .next()
                .and_then(|first| first.strip_prefix('*'));
            let lines = self.lines.iter().find(|(of, _)| Some(*of) == table);
            match (lines, section.strip_suffix(COMMIT)) {
                (Some((table, lines)), Some(body)) => {
                    input.extend([body, lines.as_str(), COMMIT]);
                    written.push(*table);
                }
                _ => input.push(section),
            }
        }
        for (table, lines) in self.lines.iter().filter(|(t, _)| !written.contains(t)) {
            input.extend([TABLE_START, table, "\n", lines.as_str(), COMMIT]);
        }
        input
    }

    /// The jumps the restore inserted.
    pub(crate) fn inserted(&self) -> &[&'j Jump] {
        &self.inserted
    }
}

const TABLE_START: &str = "*";
const COMMIT: &str = "COMMIT\n";

#[cfg(test)]
mod tests;
