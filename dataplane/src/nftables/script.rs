//! Writing `nft -f -` commands for one family's `kube-proxy` table, straight into one `String`.

use super::render::{Container, Element};
use crate::IpFamily;

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

    /// Adds `elements`, one command per run of elements of the same set or map (sort them by
    /// container for the fewest): each command is one set lookup in the kernel, and fewer, longer
    /// commands are what `nft` parses fastest.
    pub(crate) fn add_elements<'e>(&mut self, elements: impl IntoIterator<Item = &'e Element>) {
        self.element_runs("add", elements, |text, element| {
            text.push_str(&element.key);
            if let Some(comment) = &element.comment {
                text.push_str(" comment \"");
                text.push_str(comment);
                text.push('"');
            }
            if let Some(value) = &element.value {
                text.push_str(" : ");
                text.push_str(value);
            }
        });
    }

    /// Deletes the elements of the keys of `elements` from their sets and maps, one command per
    /// run of the same container; each must be there.
    pub(crate) fn delete_elements<'e>(&mut self, elements: impl IntoIterator<Item = &'e Element>) {
        self.element_runs("delete", elements, |text, element| {
            text.push_str(&element.key);
        });
    }

    /// `{verb} element … { a , b , … }` per run of at most [`ELEMENTS_PER_COMMAND`] elements of
    /// one container, each written by `write`.
    fn element_runs<'e>(
        &mut self,
        verb: &str,
        elements: impl IntoIterator<Item = &'e Element>,
        write: impl Fn(&mut String, &Element),
    ) {
        let mut open: Option<(Container, usize)> = None;
        for element in elements {
            match &mut open {
                Some((container, count))
                    if *container == element.container && *count < ELEMENTS_PER_COMMAND =>
                {
                    self.text.push_str(" , ");
                    *count += 1;
                }
                _ => {
                    if open.is_some() {
                        self.text.push_str(" }\n");
                    }
                    self.start(verb, "element");
                    self.text.push(' ');
                    self.text.push_str(&element.container.name());
                    self.text.push_str(" { ");
                    open = Some((element.container, 1));
                }
            }
            write(&mut self.text, element);
        }
        if open.is_some() {
            self.text.push_str(" }\n");
        }
    }
}

/// The most elements one command adds or deletes: long enough that commands are few, short
/// enough that an error message quoting one stays readable.
const ELEMENTS_PER_COMMAND: usize = 1000;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn element(container: Container, key: String) -> Element {
        Element {
            container,
            key: key.into(),
            comment: None,
            value: None,
        }
    }

    #[test]
    fn elements_go_one_command_per_run_of_a_container_and_at_most_a_thousand_each() {
        let mut elements: Vec<Element> = (0..2500)
            .map(|i| {
                element(
                    Container::ClusterIps,
                    format!("10.96.{}.{}", i / 250, i % 250),
                )
            })
            .collect();
        elements.push(element(Container::NodePortIps, "192.168.0.2".into()));
        elements.push(element(Container::ClusterIps, "10.97.0.1".into()));
        let mut script = Script::new(IpFamily::V4);
        script.add_elements(&elements);
        let text = script.into_text();
        let commands: Vec<(&str, usize)> = text
            .lines()
            .map(|line| {
                let (head, list) = line.split_once(" { ").unwrap();
                (head, list.split(" , ").count())
            })
            .collect();
        assert_eq!(
            commands,
            [
                ("add element ip kube-proxy cluster-ips", 1000),
                ("add element ip kube-proxy cluster-ips", 1000),
                ("add element ip kube-proxy cluster-ips", 500),
                ("add element ip kube-proxy nodeport-ips", 1),
                ("add element ip kube-proxy cluster-ips", 1),
            ]
        );
        assert!(text.ends_with("10.97.0.1 }\n"), "{text}");
    }
}
