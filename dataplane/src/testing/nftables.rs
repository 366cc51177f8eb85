//! Test helpers: fixtures, an in-memory model of what the kernel does with a `nft -f -` script
//! (strict where the kernel is), and a throwaway network namespace to run the real `nft` in.
//!
//! Test addresses: the unit tests' plan ([`super::fixtures`]).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::fixtures::{ip, ready};
use crate::IpFamily;
use crate::NodeOptions;
use crate::nftables::names::ENDPOINTS_PREFIX;
use crate::nftables::render::Options;
use crate::{Endpoint, Protocol, ServicePort};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Terminating but still serving.
pub(crate) fn draining(address: &str, port: u16, is_local: bool) -> Endpoint {
    Endpoint {
        ready: false,
        terminating: true,
        is_local,
        ..ready(address, port)
    }
}

pub(crate) fn tcp(
    name: &str,
    port: u16,
    node_port: Option<u16>,
    endpoints: Vec<Endpoint>,
) -> ServicePort {
    ServicePort::new(name, Protocol::Tcp, port, node_port, endpoints)
}

/// Upstream's test proxier for IPv4: pod CIDR `10.0.0.0/8`, node ports on `192.168.0.2` only,
/// service CIDR `172.30.0.0/16`.
pub(crate) fn options_v4() -> Options {
    Options::new(
        IpFamily::V4,
        &NodeOptions::default()
            .with_cluster_cidrs(["10.0.0.0/8".parse().unwrap()])
            .with_node_ips([ip("192.168.0.2")])
            .with_node_port_addresses(Some(vec![ip("192.168.0.2"), ip("2001:db8::1")])),
    )
    .with_service_cidrs([
        "172.30.0.0/16".parse().unwrap(),
        "fd00:172:30::/112".parse().unwrap(),
    ])
}

/// The same for IPv6.
pub(crate) fn options_v6() -> Options {
    Options::new(
        IpFamily::V6,
        &NodeOptions::default()
            .with_cluster_cidrs(["fd00:10::/48".parse().unwrap()])
            .with_node_ips([ip("2001:db8::1")])
            .with_node_port_addresses(Some(vec![ip("192.168.0.2"), ip("2001:db8::1")])),
    )
    .with_service_cidrs(["fd00:172:30::/112".parse().unwrap()])
}

/// One family's `kube-proxy` table as the model holds it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Table {
    /// Chains: what followed the name when created (`{ type … }` of a base chain), and rules.
    pub chains: BTreeMap<String, (String, Vec<String>)>,
    /// Sets and maps: `set` or `map`, type, and elements (key → comment and value as written).
    pub sets: BTreeMap<String, (String, String, BTreeMap<String, String>)>,
}

/// The kernel as far as `nft -f -` scripts go: one table, changed atomically per script, with
/// the kernel's refusals (a missing object, an element key holding another value, a base chain's
/// hook changed in place, a referenced set deleted) and one stricter than recent kernels: a chain
/// referenced when the script starts cannot be deleted by it, as on kernels before 6.2.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Model {
    pub table: Option<Table>,
}

impl Model {
    /// Applies `script`, all of it or (on the first refusal, returned) nothing.
    pub(crate) fn apply(&mut self, script: &str) -> Result<(), String> {
        let referenced_at_start = self.table.as_ref().map(references).unwrap_or_default();
        let mut table = self.table.clone();
        for (number, line) in script.lines().enumerate() {
            command(&mut table, line, &referenced_at_start)
                .map_err(|why| format!("line {}: {why}: {line}", number + 1))?;
        }
        self.table = table;
        Ok(())
    }
}

/// Chains referenced by a rule (`goto`, `jump`) or a map element, and sets used by a rule.
fn references(table: &Table) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (_, rules) in table.chains.values() {
        for rule in rules {
            names.extend(rule_references(rule).0);
            names.extend(rule_references(rule).1);
        }
    }
    for (_, _, elements) in table.sets.values() {
        for data in elements.values() {
            if let Some(chain) = data.split(" : goto ").nth(1) {
                names.insert(chain.to_owned());
            }
        }
    }
    names
}

/// The chains (`goto X`, `jump X`) and sets (`@X`) a rule names, outside its comment.
fn rule_references(rule: &str) -> (Vec<String>, Vec<String>) {
    let rule = rule.split(" comment \"").next().unwrap_or(rule);
    let words: Vec<&str> = rule.split_whitespace().collect();
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    for (i, word) in words.iter().enumerate() {
        if (*word == "goto" || *word == "jump") && i + 1 < words.len() {
            chains.push(words[i + 1].to_owned());
        }
        if let Some(set) = word.strip_prefix('@') {
            sets.push(set.to_owned());
        }
    }
    (chains, sets)
}

fn command(
    table: &mut Option<Table>,
    line: &str,
    referenced_at_start: &BTreeSet<String>,
) -> Result<(), String> {
    let mut words = line.splitn(4, ' ');
    let (verb, kind) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let _family = words.next();
    let rest = words.next().unwrap_or("");
    let (table_name, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    if table_name != "kube-proxy" {
        return Err("not our table".into());
    }
    if kind == "table" {
        match verb {
            "add" => {
                table.get_or_insert_with(Table::default);
            }
            "flush" => {
                let table = table.as_mut().ok_or("no table")?;
                for (_, rules) in table.chains.values_mut() {
                    rules.clear();
                }
            }
            "delete" => {
                table.take().ok_or("no table")?;
            }
            _ => return Err("unknown verb".into()),
        }
        return Ok(());
    }
    let table = table.as_mut().ok_or("no table")?;
    let (name, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    match (verb, kind) {
        ("add", "chain") => match table.chains.get(name) {
            Some((spec, _)) => {
                let hooked = rest.contains(" hook ");
                if hooked && spec != rest {
                    return Err("cannot change a chain's hook or priority".into());
                }
            }
            None => {
                table
                    .chains
                    .insert(name.to_owned(), (rest.to_owned(), Vec::new()));
            }
        },
        ("flush", "chain") => {
            table.chains.get_mut(name).ok_or("no such chain")?.1.clear();
        }
        ("delete", "chain") => {
            let (_, rules) = table.chains.get(name).ok_or("no such chain")?;
            if !rules.is_empty() {
                return Err("chain not empty".into());
            }
            if references(table).contains(name) {
                return Err("chain in use".into());
            }
            if referenced_at_start.contains(name) {
                return Err("chain in use when the transaction started (kernel < 6.2)".into());
            }
            table.chains.remove(name);
        }
        ("add", "set" | "map") => {
            let type_of = |spec: &str| spec.split(';').next().unwrap_or("").trim().to_owned();
            match table.sets.get(name) {
                Some((existing_kind, existing_type, _)) => {
                    if existing_kind != kind || *existing_type != type_of(rest) {
                        return Err("set exists with another type".into());
                    }
                }
                None => {
                    table.sets.insert(
                        name.to_owned(),
                        (kind.to_owned(), type_of(rest), BTreeMap::new()),
                    );
                }
            }
        }
        ("flush", "set" | "map") => {
            table.sets.get_mut(name).ok_or("no such set")?.2.clear();
        }
        ("delete", "set" | "map") => {
            table.sets.get(name).ok_or("no such set")?;
            let used = table
                .chains
                .values()
                .flat_map(|(_, rules)| rules)
                .any(|rule| rule_references(rule).1.iter().any(|set| set == name));
            if used {
                return Err("set in use".into());
            }
            table.sets.remove(name);
        }
        ("add", "rule") => {
            let (chains, sets) = rule_references(rest);
            for chain in chains {
                if !table.chains.contains_key(&chain) {
                    return Err(format!("rule jumps to missing chain {chain}"));
                }
            }
            for set in sets {
                if !table.sets.contains_key(&set) {
                    return Err(format!("rule uses missing set {set}"));
                }
            }
            table
                .chains
                .get_mut(name)
                .ok_or("no such chain")?
                .1
                .push(rest.to_owned());
        }
        ("add" | "delete", "element") => {
            let inner = rest
                .strip_prefix("{ ")
                .and_then(|inner| inner.strip_suffix(" }"))
                .ok_or("element not in braces")?;
            // Keys, comments (`ns/name:port`) and values hold no ` , `.
            for element in inner.split(" , ") {
                element_command(table, verb, name, element)?;
            }
        }
        _ => return Err("unknown command".into()),
    }
    Ok(())
}

/// One element of an `add element` or `delete element` command on set `name`.
fn element_command(table: &mut Table, verb: &str, name: &str, inner: &str) -> Result<(), String> {
    let (key_part, value) = match inner.split_once(" : ") {
        Some((key, value)) => (key, Some(value)),
        None => (inner, None),
    };
    let (key, comment) = match key_part.split_once(" comment ") {
        Some((key, comment)) => (key, Some(comment)),
        None => (key_part, None),
    };
    let is_map = table.sets.get(name).ok_or("no such set")?.0 == "map";
    if verb == "delete" {
        let elements = &mut table.sets.get_mut(name).ok_or("no such set")?.2;
        elements.remove(key).ok_or("no such element")?;
        return Ok(());
    }
    if is_map != value.is_some() {
        return Err("element does not fit its set".into());
    }
    if let Some(chain) = value.and_then(|value| value.strip_prefix("goto "))
        && !table.chains.contains_key(chain)
    {
        return Err(format!("element goes to missing chain {chain}"));
    }
    let data = format!(
        "{}{}",
        comment.map(|c| format!("comment {c}")).unwrap_or_default(),
        value.map(|v| format!(" : {v}")).unwrap_or_default()
    );
    let elements = &mut table.sets.get_mut(name).ok_or("no such set")?.2;
    match elements.get(key) {
        // The kernel keeps the first comment and refuses another value.
        Some(existing) => {
            let value_of = |data: &str| data.split(" : ").nth(1).map(str::to_owned);
            if value_of(existing) != value_of(&data) {
                return Err("element exists with another value".into());
            }
        }
        None => {
            elements.insert(key.to_owned(), data);
        }
    }
    Ok(())
}

/// Whether this process may create network namespaces and run `nft` in them; says why not.
fn can_use_namespaces() -> bool {
    let root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Uid:"))
                .map(|uids| uids.split_whitespace().next() == Some("0"))
        })
        .unwrap_or(false);
    if !root {
        eprintln!("skipped: not root, so no network namespace for the real nft");
        return false;
    }
    for tool in ["ip", "nft"] {
        let found = Command::new(tool)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok();
        if !found {
            eprintln!("skipped: {tool} is not installed");
            return false;
        }
    }
    true
}

/// A network namespace of its own, deleted when dropped (also when the test fails).
pub(crate) struct Netns {
    name: String,
}

impl Netns {
    /// A fresh namespace; `None` (with a message) when this host cannot give one.
    pub(crate) fn new() -> Option<Self> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        if !can_use_namespaces() {
            return None;
        }
        let name = format!(
            "sp-nft-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let status = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("ip netns add");
        assert!(status.success(), "ip netns add {name} failed");
        Some(Self { name })
    }

    /// Runs `nft -f -` with `script` inside the namespace; the error is nft's message.
    pub(crate) fn nft(&self, script: &str) -> Result<(), String> {
        use std::io::Write as _;
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run nft");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(script.as_bytes())
            .expect("write the script");
        let output = child.wait_with_output().expect("wait for nft");
        if output.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }

    /// `nft list table <family> kube-proxy` inside the namespace.
    pub(crate) fn list(&self, family: &str) -> String {
        let output = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.name,
                "nft",
                "list",
                "table",
                family,
                "kube-proxy",
            ])
            .output()
            .expect("nft list");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// `nft list table` output as comparable data: each object's header line → its lines, with the
/// elements of a set or map sorted (their listing order depends on the kernel's hashing, not on
/// what they hold), leaving out the chains named in `skip`.
pub(crate) fn normalize(listing: &str, skip: &BTreeSet<String>) -> BTreeMap<String, Vec<String>> {
    let mut objects = BTreeMap::new();
    let mut lines = listing.lines().map(str::trim).peekable();
    let mut current: Option<(String, Vec<String>)> = None;
    while let Some(line) = lines.next() {
        if line.ends_with('{')
            && (line.starts_with("chain ") || line.starts_with("set ") || line.starts_with("map "))
        {
            current = Some((line.to_owned(), Vec::new()));
            continue;
        }
        let Some((_, body)) = current.as_mut() else {
            continue;
        };
        if line == "}" {
            let (header, body) = current.take().unwrap();
            let name = header.split_whitespace().nth(1).unwrap_or("");
            if !(header.starts_with("chain ") && skip.contains(name)) {
                objects.insert(header, body);
            }
            continue;
        }
        if let Some(first) = line.strip_prefix("elements = {") {
            let mut text = first.to_owned();
            while !text.trim_end().ends_with('}') {
                text.push(' ');
                text.push_str(lines.next().unwrap_or("}"));
            }
            let text = text.trim_end().trim_end_matches('}');
            let mut elements: Vec<String> = text
                .split(',')
                .map(|element| element.trim().to_owned())
                .filter(|element| !element.is_empty())
                .collect();
            elements.sort();
            body.push(format!("elements = {}", elements.join(", ")));
            continue;
        }
        body.push(line.to_owned());
    }
    objects
}

/// Endpoint maps' elements: map name → number → the endpoint as written (`10.180.0.3 . 8080`).
type EndpointNumbers = BTreeMap<String, BTreeMap<u32, String>>;

/// `rule` with its pick from an endpoint map (`… numgen random mod N offset K map @endpoints-XX`)
/// written as the endpoints it reaches (`… numgen random mod N → [a, b]`), taken out of
/// `numbers`; a number no element holds reads `missing`. `None` for a rule that picks nothing.
fn resolve_pick(rule: &str, numbers: &mut EndpointNumbers) -> Option<String> {
    let (pick, map) = rule.split_once(" map @")?;
    if !map.starts_with(ENDPOINTS_PREFIX) {
        return None;
    }
    // nft lists `offset 0` as no offset at all.
    let (head, offset) = pick.split_once(" offset ").unwrap_or((pick, "0"));
    let count: u32 = head.rsplit(' ').next()?.parse().ok()?;
    let offset: u32 = offset.parse().ok()?;
    let elements = numbers.entry(map.to_owned()).or_default();
    let picked: Vec<String> = (offset..offset + count)
        .map(|number| elements.remove(&number).unwrap_or_else(|| "missing".into()))
        .collect();
    Some(format!("{head} → [{}]", picked.join(", ")))
}

/// `model` with each pick from an endpoint map written as the endpoints it reaches and those
/// taken out of the map: tables that pick the same endpoints compare equal however their
/// numbers were handed out, and an endpoint map keeps only what no chain picks (a leak).
pub(crate) fn resolved(model: &Model) -> Model {
    let mut model = model.clone();
    let Some(table) = &mut model.table else {
        return model;
    };
    let mut numbers: EndpointNumbers = BTreeMap::new();
    for (name, (_, _, elements)) in &table.sets {
        if name.starts_with(ENDPOINTS_PREFIX) {
            let parsed = elements.iter().map(|(number, data)| {
                let data = data.trim_start().trim_start_matches(": ");
                (number.parse().unwrap(), data.to_owned())
            });
            numbers.insert(name.clone(), parsed.collect());
        }
    }
    for (_, rules) in table.chains.values_mut() {
        for rule in rules {
            if let Some(resolved) = resolve_pick(rule, &mut numbers) {
                *rule = resolved;
            }
        }
    }
    for (name, left) in numbers {
        if let Some((_, _, elements)) = table.sets.get_mut(&name) {
            *elements = left
                .into_iter()
                .map(|(number, data)| (number.to_string(), format!(" : {data}")))
                .collect();
        }
    }
    model
}

/// [`normalize`]d listing objects resolved as [`resolved`] resolves a model.
pub(crate) fn resolve_listing(
    objects: BTreeMap<String, Vec<String>>,
) -> BTreeMap<String, Vec<String>> {
    let mut objects = objects;
    let mut numbers: EndpointNumbers = BTreeMap::new();
    for (header, body) in &objects {
        let Some(name) = header
            .strip_prefix("map ")
            .and_then(|rest| rest.split_whitespace().next())
            .filter(|name| name.starts_with(ENDPOINTS_PREFIX))
        else {
            continue;
        };
        let elements = numbers.entry(name.to_owned()).or_default();
        for line in body {
            let Some(listed) = line.strip_prefix("elements = ") else {
                continue;
            };
            for element in listed.split(", ") {
                let (number, data) = element.split_once(" : ").unwrap();
                elements.insert(number.parse().unwrap(), data.to_owned());
            }
        }
    }
    for (header, body) in &mut objects {
        if header.starts_with("chain ") {
            for line in body.iter_mut() {
                if let Some(resolved) = resolve_pick(line, &mut numbers) {
                    *line = resolved;
                }
            }
        }
    }
    for (header, body) in &mut objects {
        let name = header.split_whitespace().nth(1).unwrap_or("");
        if let Some(left) = numbers.get(name).filter(|_| header.starts_with("map ")) {
            body.retain(|line| !line.starts_with("elements = "));
            if !left.is_empty() {
                let listed: Vec<String> = left
                    .iter()
                    .map(|(number, data)| format!("{number} : {data}"))
                    .collect();
                body.push(format!("elements = {}", listed.join(", ")));
            }
        }
    }
    objects
}

/// Checks that no two chains of `rendered` share a number of an endpoint map, and that each
/// chain's elements are exactly its numbers.
#[track_caller]
pub(crate) fn assert_numbers_apart(rendered: &crate::nftables::Rendered) {
    let mut taken: BTreeMap<String, BTreeMap<u32, String>> = BTreeMap::new();
    for (_, rules) in rendered.service_rules() {
        for slot in &rules.slots {
            let numbers = taken.entry(slot.map.name()).or_default();
            for number in slot.offset..slot.offset + slot.len {
                if let Some(other) = numbers.insert(number, slot.chain.clone()) {
                    panic!("{} and {other} share {number} of {}", slot.chain, slot.map);
                }
            }
        }
        let mut numbered: Vec<u32> = rules
            .elements
            .iter()
            .filter(|element| matches!(element.container, crate::nftables::Container::Endpoints(_)))
            .map(|element| element.key.parse().unwrap())
            .collect();
        numbered.sort_unstable();
        let mut owned: Vec<u32> = rules
            .slots
            .iter()
            .flat_map(|slot| slot.offset..slot.offset + slot.len)
            .collect();
        owned.sort_unstable();
        assert_eq!(numbered, owned, "elements outside the Service's numbers");
    }
}
