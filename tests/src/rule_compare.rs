//! Compares two nodes' iptables rules as kube-proxy would have to agree on them: counters,
//! comments of the save format and the random-pick probabilities dropped; the chains whose
//! order upstream takes from Go map iteration (the Service dispatch chains, a Service's
//! endpoint spread, the firewall chains) compared as sets; every other chain in order.
//!
//! One known difference is left out: upstream's nfacct counters. Where the kernel has nfacct,
//! kube-proxy counts dropped INVALID packets (`-m nfacct` on that rule) and adds, per node
//! port, a rule counting accepted localhost node-port packets; splitproxy writes neither (see
//! `docs/kube-proxy-compatibility.md`).

use std::collections::BTreeMap;

/// Chains compared as sets of rules: upstream fills them from Go maps.
fn unordered(chain: &str) -> bool {
    matches!(
        chain,
        "KUBE-SERVICES" | "KUBE-NODEPORTS" | "KUBE-EXTERNAL-SERVICES" | "KUBE-PROXY-FIREWALL"
    ) || ["KUBE-SVC-", "KUBE-SVL-", "KUBE-FW-"]
        .iter()
        .any(|prefix| chain.starts_with(prefix))
}

/// A saved rule set in comparable form: `table → chain → rules` (declarations as chains with
/// their policy).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Rules(BTreeMap<(String, String), Vec<String>>);

impl Rules {
    /// Reads `iptables-save` output.
    #[must_use]
    pub fn parse(save: &str) -> Self {
        let mut rules: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        let mut table = String::new();
        for line in save.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line == "COMMIT" {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                name.clone_into(&mut table);
            } else if let Some(declaration) = line.strip_prefix(':') {
                let mut words = declaration.split_whitespace();
                let chain = words.next().unwrap_or_default().to_owned();
                let policy = words.next().unwrap_or("-");
                rules
                    .entry((table.clone(), chain))
                    .or_default()
                    .insert(0, format!("policy {policy}"));
            } else if line.contains("localhost_nps_accepted_pkts") {
                // The localhost node-port counter's own rule (see the module's comment).
            } else if let Some(rest) = line.strip_prefix("-A ") {
                let (chain, rule) = rest.split_once(' ').unwrap_or((rest, ""));
                rules
                    .entry((table.clone(), chain.to_owned()))
                    .or_default()
                    .push(normalise(rule));
            }
        }
        for ((_, chain), lines) in &mut rules {
            if unordered(chain) {
                // The policy line first, the node-port jump last (its NOTE says why), the
                // rest sorted.
                let last = lines
                    .iter()
                    .position(|rule| rule.contains("this must be the last rule"))
                    .map(|index| lines.remove(index));
                lines.sort();
                lines.extend(last);
            }
        }
        Self(rules)
    }

    /// What differs between `self` (kube-proxy's) and `other` (splitproxy's), one line per
    /// chain or rule, empty when they agree.
    #[must_use]
    pub fn differences(&self, other: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<&(String, String)> =
            self.0.keys().chain(other.0.keys()).collect();
        for key in keys {
            let (table, chain) = key;
            match (self.0.get(key), other.0.get(key)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    let before = out.len();
                    for rule in a.iter().filter(|rule| !b.contains(rule)) {
                        out.push(format!("{table} {chain}: only kube-proxy: {rule}"));
                    }
                    for rule in b.iter().filter(|rule| !a.contains(rule)) {
                        out.push(format!("{table} {chain}: only splitproxy: {rule}"));
                    }
                    if out.len() == before {
                        out.push(format!(
                            "{table} {chain}: order or count differs:\n  kube-proxy {a:?}\n  splitproxy {b:?}"
                        ));
                    }
                }
                (Some(_), None) => out.push(format!("{table} {chain}: only kube-proxy has it")),
                (None, Some(_)) => out.push(format!("{table} {chain}: only splitproxy has it")),
                (None, None) => {}
            }
        }
        out
    }
}

/// A rule without the parts two correct proxies may write differently: the random-pick
/// probability (it follows the endpoint order) and nfacct counters (kernel-dependent).
fn normalise(rule: &str) -> String {
    let mut words: Vec<&str> = Vec::new();
    let mut iter = rule.split_whitespace().peekable();
    while let Some(word) = iter.next() {
        match (word, iter.peek().copied()) {
            ("-m", Some("statistic" | "nfacct")) => {
                iter.next();
            }
            ("--mode" | "--probability" | "--nfacct-name", _) => {
                iter.next();
            }
            _ => words.push(word),
        }
    }
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn map_ordered_chains_compare_as_sets_and_others_in_order() {
        let a = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SEP-X - [1:2]\n-A KUBE-SERVICES -d 1 -j A\n\
                 -A KUBE-SERVICES -d 2 -j B\n-A KUBE-SERVICES -m comment --comment \"x; NOTE: this must be the last rule in this chain\" -j N\n\
                 -A KUBE-SEP-X -j 1\n-A KUBE-SEP-X -j 2\nCOMMIT\n";
        let b = "*nat\n:KUBE-SEP-X - [0:0]\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 2 -j B\n\
                 -A KUBE-SERVICES -m comment --comment \"x; NOTE: this must be the last rule in this chain\" -j N\n\
                 -A KUBE-SERVICES -d 1 -j A\n-A KUBE-SEP-X -j 1\n-A KUBE-SEP-X -j 2\nCOMMIT\n";
        assert_eq!(
            Rules::parse(a).differences(&Rules::parse(b)),
            Vec::<String>::new()
        );
        let swapped = b.replace(
            "-A KUBE-SEP-X -j 1\n-A KUBE-SEP-X -j 2",
            "-A KUBE-SEP-X -j 2\n-A KUBE-SEP-X -j 1",
        );
        assert_eq!(
            Rules::parse(a).differences(&Rules::parse(&swapped)).len(),
            1
        );
        let missing = b.replace("-A KUBE-SERVICES -d 1 -j A\n", "");
        assert_eq!(
            Rules::parse(a).differences(&Rules::parse(&missing)),
            ["nat KUBE-SERVICES: only kube-proxy: -d 1 -j A"]
        );
    }

    #[test]
    fn probabilities_and_nfacct_are_left_out() {
        assert_eq!(
            normalise("-m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-A"),
            "-j KUBE-SEP-A"
        );
        assert_eq!(
            normalise(
                "-m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP"
            ),
            "-m conntrack --ctstate INVALID -j DROP"
        );
    }
}
