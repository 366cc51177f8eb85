//! Compares two nodes' `kube-proxy` nftables tables (as `nft list table` prints them) as
//! kube-proxy would have to agree on them.
//!
//! * splitproxy's shared endpoint maps are resolved: a chain's `numgen random mod N offset K
//!   map @endpoints-…` becomes the anonymous map upstream writes, holding the map's elements
//!   `K … K+N-1`, and the shared maps themselves are left out;
//! * the numbers of an endpoint map are dropped and its endpoints sorted: upstream numbers
//!   endpoints in the order of their `ip:port` text, splitproxy by address (the choice is as
//!   random either way);
//! * a `service-…` or `local-…` chain's affinity rules (one per endpoint, in endpoint order) are
//!   compared as a set, as are the elements of every set and map and of anonymous sets in rules;
//! * a Service's chain without rules is left out: upstream flushes a chain that went stale and
//!   deletes it at its next sync (a second later at the earliest, which may be an hour away when
//!   nothing changes); an empty chain nothing jumps to does nothing;
//! * everything else is compared line for line, in order.

use anyhow::{Context, Result, bail};
use std::collections::{BTreeMap, BTreeSet};

/// What an object of a table is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Chain,
    Set,
    Map,
}

/// `(family, kind, name)` of a table's object.
type Key = (String, Kind, String);

/// One object: its declaration lines (type, flags, comment, policy) and its rules (chains) or
/// elements (sets and maps).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Object {
    declaration: Vec<String>,
    body: Vec<String>,
}

/// A listed ruleset in comparable form.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Ruleset(BTreeMap<Key, Object>);

impl Ruleset {
    /// Reads `nft list table` output (one or more tables).
    ///
    /// # Errors
    ///
    /// If the listing is not in the form `nft` prints.
    pub fn parse(listing: &str) -> Result<Self> {
        let mut objects = BTreeMap::new();
        let mut family = String::new();
        let mut current: Option<(Key, Object)> = None;
        let mut lines = listing
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty());
        while let Some(line) = lines.next() {
            if let Some(rest) = line.strip_prefix("table ") {
                family = rest
                    .split_whitespace()
                    .next()
                    .context("a table without a family")?
                    .to_owned();
                continue;
            }
            let Some((key, object)) = current.as_mut() else {
                if line == "}" || line.starts_with("comment ") {
                    continue; // the table's end or its comment
                }
                let (kind, name) = object_header(line)?;
                current = Some(((family.clone(), kind, name), Object::default()));
                continue;
            };
            if line == "}" {
                let (key, object) = current.take().context("an object")?;
                objects.insert(key, object);
                continue;
            }
            if key.1 == Kind::Chain {
                if line.starts_with("type ") || line.starts_with("comment ") {
                    object.declaration.push(line.to_owned());
                } else {
                    object.body.push(normalise_rule(line));
                }
                continue;
            }
            if let Some(first) = line.strip_prefix("elements = ") {
                // Elements may span lines: read up to the brace that closes them.
                let mut text = first.to_owned();
                while depth(&text) > 0 {
                    let next = lines
                        .next()
                        .context("elements without their closing brace")?;
                    text.push(' ');
                    text.push_str(next);
                }
                let inner = text
                    .strip_prefix('{')
                    .and_then(|text| text.strip_suffix('}'))
                    .context("elements not in braces")?;
                object.body = split_top_level(inner);
            } else {
                object.declaration.push(line.to_owned());
            }
        }
        if current.is_some() {
            bail!("the listing ends inside an object");
        }
        let mut ruleset = Self(objects);
        ruleset.0.retain(|(_, kind, name), object| {
            !(*kind == Kind::Chain && object.body.is_empty() && per_service(name))
        });
        ruleset.resolve_shared_endpoint_maps()?;
        for ((_, kind, name), object) in &mut ruleset.0 {
            if *kind != Kind::Chain || name.starts_with("service-") || name.starts_with("local-") {
                object.body.sort();
            }
        }
        Ok(ruleset)
    }

    /// Replaces each pick from a shared endpoint map by the anonymous map of its elements, and
    /// drops the shared maps.
    fn resolve_shared_endpoint_maps(&mut self) -> Result<()> {
        let shared: BTreeMap<(String, String), BTreeMap<u64, String>> = self
            .0
            .iter()
            .filter(|((_, kind, name), _)| *kind == Kind::Map && name.starts_with("endpoints-"))
            .map(|((family, _, name), object)| {
                let numbered = object
                    .body
                    .iter()
                    .map(|element| {
                        let (number, value) = element.split_once(" : ").context("a map element")?;
                        Ok((number.trim().parse()?, value.trim().to_owned()))
                    })
                    .collect::<Result<_>>()?;
                Ok(((family.clone(), name.clone()), numbered))
            })
            .collect::<Result<_>>()?;
        self.0
            .retain(|(family, _, name), _| !shared.contains_key(&(family.clone(), name.clone())));
        for ((family, kind, _), object) in &mut self.0 {
            if *kind != Kind::Chain {
                continue;
            }
            for rule in &mut object.body {
                let Some((head, pick)) = rule.split_once("numgen random mod ") else {
                    continue;
                };
                // `nft` leaves out `offset 0`.
                let mut words = pick.split_whitespace().peekable();
                let count = words.next().unwrap_or_default();
                let offset = if words.next_if_eq(&"offset").is_some() {
                    words.next().unwrap_or_default()
                } else {
                    "0"
                };
                let (Some("map"), Some(map)) = (words.next(), words.next()) else {
                    continue;
                };
                if !map.starts_with('@') {
                    continue;
                }
                let map = map.trim_start_matches('@');
                let elements = shared
                    .get(&(family.clone(), map.to_owned()))
                    .with_context(|| format!("no shared endpoint map {map}"))?;
                let (count, offset): (u64, u64) = (count.parse()?, offset.parse()?);
                let mut values = Vec::new();
                for number in offset..offset + count {
                    let value = elements
                        .get(&number)
                        .with_context(|| format!("{map} has no element {number}"))?;
                    values.push(value.clone());
                }
                values.sort();
                let rest: Vec<&str> = words.collect();
                *rule = format!(
                    "{head}numgen random mod {count} map {{ {} }}{}",
                    values.join(", "),
                    if rest.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", rest.join(" "))
                    }
                );
            }
        }
        Ok(())
    }

    /// What differs between `self` (kube-proxy's) and `other` (splitproxy's), one line per
    /// object, rule or element; empty when they agree.
    #[must_use]
    pub fn differences(&self, other: &Self) -> Vec<String> {
        let mut out = Vec::new();
        let keys: BTreeSet<&Key> = self.0.keys().chain(other.0.keys()).collect();
        for key in keys {
            let (family, kind, name) = key;
            let what = format!("{family} {kind:?} {name}");
            match (self.0.get(key), other.0.get(key)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    let before = out.len();
                    for (side, x, y) in [("kube-proxy", a, b), ("splitproxy", b, a)] {
                        for line in x.declaration.iter().filter(|l| !y.declaration.contains(l)) {
                            out.push(format!("{what}: only {side}: {line}"));
                        }
                        for line in x.body.iter().filter(|l| !y.body.contains(l)) {
                            out.push(format!("{what}: only {side}: {line}"));
                        }
                    }
                    if out.len() == before {
                        out.push(format!(
                            "{what}: order or count differs:\n  kube-proxy {a:?}\n  splitproxy {b:?}"
                        ));
                    }
                }
                (Some(_), None) => out.push(format!("{what}: only kube-proxy has it")),
                (None, Some(_)) => out.push(format!("{what}: only splitproxy has it")),
                (None, None) => {}
            }
        }
        out
    }
}

/// Whether `chain` is one of a Service's own chains.
fn per_service(chain: &str) -> bool {
    ["service-", "local-", "external-", "firewall-", "endpoint-"]
        .iter()
        .any(|prefix| chain.starts_with(prefix))
}

/// `chain NAME {`, `set NAME {` or `map NAME {` → its kind and name.
fn object_header(line: &str) -> Result<(Kind, String)> {
    let mut words = line.split_whitespace();
    let kind = match words.next() {
        Some("chain") => Kind::Chain,
        Some("set") => Kind::Set,
        Some("map") => Kind::Map,
        _ => bail!("unexpected line in a table: {line}"),
    };
    let name = words.next().context("an object without a name")?;
    Ok((kind, name.trim_matches('"').to_owned()))
}

/// How many more braces `text` opens than it closes, outside quoted strings.
fn depth(text: &str) -> i64 {
    let mut quoted = false;
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            _ => {}
        }
    }
    depth
}

/// `text` split at the commas outside braces and quoted strings, each part trimmed.
fn split_top_level(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut quoted, mut depth, mut part) = (false, 0, String::new());
    for c in text.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth -= 1,
            ',' if !quoted && depth == 0 => {
                parts.push(part.trim().to_owned());
                part.clear();
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    if !part.trim().is_empty() {
        parts.push(part.trim().to_owned());
    }
    parts
}

/// A rule with its anonymous sets and maps in a fixed order: elements sorted, and an endpoint
/// map's numbers dropped (`numgen random mod 2 map { 0 : a, 1 : b }` → `… map { a, b }`).
fn normalise_rule(rule: &str) -> String {
    let mut out = String::new();
    let mut rest = rule;
    while let Some(open) = rest.find('{') {
        let (before, from) = rest.split_at(open);
        out.push_str(before);
        let close = matching_brace(from).unwrap_or(from.len() - 1);
        let inner = &from[1..close];
        let numbered = before.contains("numgen random mod ");
        let mut elements: Vec<String> = split_top_level(inner)
            .into_iter()
            .map(|element| match element.split_once(" : ") {
                Some((_, value)) if numbered => value.trim().to_owned(),
                _ => element,
            })
            .collect();
        elements.sort();
        out.push_str(&format!("{{ {} }}", elements.join(", ")));
        rest = &from[close + 1..];
    }
    out.push_str(rest);
    out
}

/// The index of the brace that closes the one `text` starts with.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0;
    let mut quoted = false;
    for (index, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => {
                depth -= 1;
                if depth == 0 {
                    return Some(index);
                }
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: &str = "table ip kube-proxy {
	comment \"rules for kube-proxy\"
	set cluster-ips {
		type ipv4_addr
		comment \"Active ClusterIPs\"
		elements = { 10.96.0.2, 10.96.0.1 }
	}
	chain service-AAAA-ns/svc/tcp/p80 {
		ip daddr 10.96.0.1 jump mark-for-masquerade
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.0.0.10 . 80, 1 : 10.0.0.9 . 80 }
	}
	chain cluster-ips-check {
		ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"
		ip daddr { 10.96.0.0/16, 10.97.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"
	}
}
";

    const SPLITPROXY: &str = "table ip kube-proxy {
	comment \"rules for kube-proxy\"
	set cluster-ips {
		type ipv4_addr
		comment \"Active ClusterIPs\"
		elements = { 10.96.0.1,
			     10.96.0.2 }
	}
	map endpoints-tcp-AA {
		typeof numgen random mod 1 : ip daddr . tcp dport
		elements = { 0 : 10.0.0.1 . 80, 1 : 10.0.0.9 . 80,
			     2 : 10.0.0.10 . 80 }
	}
	chain service-AAAA-ns/svc/tcp/p80 {
		ip daddr 10.96.0.1 jump mark-for-masquerade
		meta l4proto tcp dnat ip to numgen random mod 2 offset 1 map @endpoints-tcp-AA
	}
	chain cluster-ips-check {
		ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"
		ip daddr { 10.97.0.0/16, 10.96.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"
	}
}
";

    #[test]
    fn shared_endpoint_maps_resolve_to_what_upstream_writes_in_the_chain() -> Result<()> {
        let upstream = Ruleset::parse(UPSTREAM)?;
        assert_eq!(
            upstream.differences(&Ruleset::parse(SPLITPROXY)?),
            Vec::<String>::new()
        );
        // Another range of the map is other endpoints.
        let shifted = SPLITPROXY.replace("offset 1", "");
        assert_eq!(
            upstream.differences(&Ruleset::parse(&shifted)?),
            [
                "ip Chain service-AAAA-ns/svc/tcp/p80: only kube-proxy: meta l4proto tcp dnat ip \
                 to numgen random mod 2 map { 10.0.0.10 . 80, 10.0.0.9 . 80 }",
                "ip Chain service-AAAA-ns/svc/tcp/p80: only splitproxy: meta l4proto tcp dnat ip \
                 to numgen random mod 2 map { 10.0.0.1 . 80, 10.0.0.9 . 80 }",
            ]
        );
        Ok(())
    }

    #[test]
    fn a_missing_rule_or_element_is_a_difference() -> Result<()> {
        let upstream = Ruleset::parse(UPSTREAM)?;
        let no_drop = SPLITPROXY.replace(
            "\t\tip daddr { 10.97.0.0/16, 10.96.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"\n",
            "",
        );
        assert_eq!(
            upstream.differences(&Ruleset::parse(&no_drop)?),
            [
                "ip Chain cluster-ips-check: only kube-proxy: ip daddr { 10.96.0.0/16, 10.97.0.0/16 } \
              drop comment \"Drop traffic to unallocated ClusterIPs\""
            ]
        );
        let one_ip = SPLITPROXY.replace("10.96.0.1,\n", "");
        assert_eq!(
            upstream.differences(&Ruleset::parse(&one_ip)?),
            ["ip Set cluster-ips: only kube-proxy: 10.96.0.1"]
        );
        Ok(())
    }

    #[test]
    fn an_empty_service_chain_is_left_out_but_not_an_empty_base_chain() -> Result<()> {
        let flushed = UPSTREAM.replace(
            "\tchain cluster-ips-check {",
            "\tchain external-BBBB-ns/old/tcp/p80 {\n\t}\n\tchain cluster-ips-check {",
        );
        assert_eq!(
            Ruleset::parse(&flushed)?.differences(&Ruleset::parse(SPLITPROXY)?),
            Vec::<String>::new()
        );
        let empty_base = UPSTREAM.replace(
            "\tchain cluster-ips-check {",
            "\tchain nat-output {\n\t}\n\tchain cluster-ips-check {",
        );
        assert_eq!(
            Ruleset::parse(&empty_base)?.differences(&Ruleset::parse(SPLITPROXY)?),
            ["ip Chain nat-output: only kube-proxy has it"]
        );
        Ok(())
    }

    #[test]
    fn a_pick_from_a_map_that_does_not_hold_it_is_an_error() {
        let short = SPLITPROXY.replace("mod 2 offset 1", "mod 3 offset 1");
        assert!(Ruleset::parse(&short).is_err());
    }
}
