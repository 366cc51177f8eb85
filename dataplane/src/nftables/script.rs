//! Writing `nft -f -` commands for one family's `kube-proxy` table, straight into one `String`.

use super::render::{Container, Element};
use crate::conntrack::IpFamily;

/// The table every object lives in, one per family (`ip kube-proxy`, `ip6 kube-proxy`).
pub const TABLE: &str = "kube-proxy";

/// An `nft -f -` script being written: one command per line.
#[derive(Debug, Clone)]
pub(crate) struct Script {
    text: String,
    family: &'static str,
}

impl Script {
    /// An empty script for `family`'s table.
    pub(crate) fn new(family: IpFamily) -> Self {
        Self {
            text: String::new(),
            family: family_keyword(family),
        }
    }

    /// The script written so far.
    pub(crate) fn into_text(self) -> String {
        self.text
    }

    /// Appends `other`, written for the same family.
    pub(crate) fn push_script(&mut self, other: &str) {
        self.text.push_str(other);
    }

    /// `{verb} {kind} {family} kube-proxy`, the start of every command.
    fn start(&mut self, verb: &str, kind: &str) {
        self.text.push_str(verb);
        self.text.push(' ');
        self.text.push_str(kind);
        self.text.push(' ');
        self.text.push_str(self.family);
        self.text.push(' ');
        self.text.push_str(TABLE);
    }

    /// `{verb} {kind} {family} kube-proxy {name}{rest}`, a whole line.
    fn command(&mut self, verb: &str, kind: &str, name: &str, rest: &str) {
        self.start(verb, kind);
        self.text.push(' ');
        self.text.push_str(name);
        self.text.push_str(rest);
        self.text.push('\n');
    }

    /// Creates the table if it is missing (with kube-proxy's comment).
    pub(crate) fn add_table(&mut self) {
        self.start("add", "table");
        self.text
            .push_str(" { comment \"rules for kube-proxy\" ; }\n");
    }

    /// Empties every chain of the table (sets and maps keep their elements).
    pub(crate) fn flush_table(&mut self) {
        self.start("flush", "table");
        self.text.push('\n');
    }

    /// Creates chain `name` if it is missing; `spec` is empty or ` { … }`.
    pub(crate) fn add_chain(&mut self, name: &str, spec: &str) {
        self.command("add", "chain", name, spec);
    }

    /// Empties chain `name`, which must exist.
    pub(crate) fn flush_chain(&mut self, name: &str) {
        self.command("flush", "chain", name, "");
    }

    /// Deletes chain `name`, which must exist, be empty and unreferenced.
    pub(crate) fn delete_chain(&mut self, name: &str) {
        self.command("delete", "chain", name, "");
    }

    /// Creates set (`kind` `set`) or map (`map`) `name` if it is missing; `spec` is ` { … }`.
    pub(crate) fn add_set(&mut self, kind: &str, name: &str, spec: &str) {
        self.command("add", kind, name, spec);
    }

    /// Empties set or map `name`.
    pub(crate) fn flush_set(&mut self, kind: &str, name: &str) {
        self.command("flush", kind, name, "");
    }

    /// Deletes set or map `name`, which must exist and be unreferenced.
    pub(crate) fn delete_set(&mut self, kind: &str, name: &str) {
        self.command("delete", kind, name, "");
    }

    /// Appends `rule` to `chain`.
    pub(crate) fn add_rule(&mut self, chain: &str, rule: &str) {
        self.start("add", "rule");
        self.text.push(' ');
        self.text.push_str(chain);
        self.text.push(' ');
        self.text.push_str(rule);
        self.text.push('\n');
    }

    /// Adds `element` to its set or map.
    pub(crate) fn add_element(&mut self, element: &Element) {
        self.start("add", "element");
        self.text.push(' ');
        self.text.push_str(&element.container.name());
        self.text.push_str(" { ");
        self.text.push_str(&element.key);
        if let Some(comment) = &element.comment {
            self.text.push_str(" comment \"");
            self.text.push_str(comment);
            self.text.push('"');
        }
        if let Some(value) = &element.value {
            self.text.push_str(" : ");
            self.text.push_str(value);
        }
        self.text.push_str(" }\n");
    }

    /// Deletes the element of `key` from `container`; it must be there.
    pub(crate) fn delete_element(&mut self, container: Container, key: &str) {
        self.start("delete", "element");
        self.text.push(' ');
        self.text.push_str(&container.name());
        self.text.push_str(" { ");
        self.text.push_str(key);
        self.text.push_str(" }\n");
    }
}

/// The nftables family keyword of `family`'s table and of its address matches (`ip daddr`).
pub(crate) fn family_keyword(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ip",
        IpFamily::V6 => "ip6",
    }
}

/// The nftables type of one address of `family`.
pub(crate) fn address_type(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4_addr",
        IpFamily::V6 => "ipv6_addr",
    }
}
