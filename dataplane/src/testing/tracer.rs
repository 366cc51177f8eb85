//! A packet tracer over an `iptables-restore` payload: where the kernel would send a new connection.
//!
//! [`Ruleset::parse`] reads the payload (`*table`, `:CHAIN POLICY [p:b]`, `-A CHAIN …`, `-X CHAIN`,
//! `COMMIT`) into tables, chains and rules; [`Ruleset::trace`] runs the first packet of a
//! [`Flow`] through them the way netfilter would, and says what happens as an [`Outcome`] that
//! compares with the shared flow table's [`Expected`].
//!
//! # The path a packet takes
//!
//! ```text
//! Pod, External: nat PREROUTING → dst local? ─ yes → filter INPUT
//!                                             └ no  → filter FORWARD → nat POSTROUTING
//! Node:          nat OUTPUT → filter OUTPUT → nat POSTROUTING → (dst local) filter INPUT
//! ```
//!
//! "dst local" is decided after nat, on the translated destination, and the filter chains see the
//! translated packet, as in the kernel and in upstream's tracer (`proxier_test.go`). kube-proxy's
//! filter REJECT rules still match Service addresses: they exist only for ports that have no DNAT.
//! The packet is always the first of its connection: conntrack state `NEW`, plus `DNAT` once it
//! was translated. Masquerading is what nat POSTROUTING decides (the `KUBE-POSTROUTING` mark test
//! and `MASQUERADE`), not merely whether `KUBE-MARK-MASQ` ran.
//!
//! # Hooks
//!
//! The executor installs the jumps from built-in chains with `iptables -I`, outside the payload.
//! The tracer hooks exactly those jumps (`crate::iptables::installed_jumps`), inserted the same way, each
//! only when the payload declares its target chain in that table; so a trace follows what a node
//! really gets, and a jump the executor forgets is a jump the trace does not take.
//!
//! # What it understands
//!
//! Matches: `-s`/`-d` address or CIDR, `-p tcp|udp|sctp`, `--dport` (with `-m tcp|udp|sctp` or
//! `-p`), `-m addrtype --src-type/--dst-type LOCAL` (the node's addresses and loopback; a
//! [`Origin::Node`] flow's source is local), `-m statistic --mode random --probability p`,
//! `-m mark --mark v[/mask]`, `-m conntrack --ctstate …`, `-m recent --name n` with `--set` or
//! `--rcheck [--seconds s] [--reap]` (and the source-address defaults `--mask 255.255.255.255`
//! or its IPv6 all-ones form,
//! `--rsource` that `iptables-save` prints), `-m comment` (ignored); `!` before any of them but
//! the comment and the `recent` options. Targets: user chains (jump, with RETURN), `ACCEPT`, `DROP`, `RETURN`,
//! `REJECT [--reject-with …]` (filter), `DNAT --to-destination ip[:port]` and
//! `MASQUERADE [--random-fully]` (nat), `MARK --or-mark/--xor-mark/--and-mark/--set-mark/--set-xmark`.
//! Anything else fails with [`TraceError::Unsupported`], so a renderer change the tracer does not
//! understand fails loudly instead of being traced wrong.
//!
//! # Random choices
//!
//! A `statistic` match with `0 < p < 1` is a branch: the tracer follows both the matched and the
//! unmatched packet and collects every verdict reachable ([`Ruleset::verdicts`]). `p = 1` always
//! matches and `p = 0` never does. The [`Outcome`] is the set of endpoints when every branch ends
//! in a DNAT, or the one verdict all branches agree on; anything else (a branch that falls through
//! a Service chain, one target masqueraded on one branch but not another) is
//! [`TraceError::Ambiguous`].
//!
//! A `recent --rcheck` match (session affinity: "has this client been sent to that endpoint
//! lately?") depends on earlier connections, which a first packet does not know, so it is a
//! branch too: the client may or may not be remembered. Affinity thus never changes the set of
//! reachable endpoints, only which one a returning client gets. `recent --set` records the client
//! and always matches.

#[cfg(test)]
mod tests;

use super::flow_table::{Expected, Flow, Origin};
use crate::Protocol;
use crate::iptables::save::words;
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::{IpAddr, SocketAddr},
};

/// How deep user chains may nest before the tracer assumes a loop.
const MAX_DEPTH: usize = 64;

/// What can go wrong while reading a payload or tracing a flow through it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TraceError {
    /// A line is not valid `iptables-restore` input (or uses restore commands beyond `-A`/`-X`).
    #[error("line {line}: {reason}: {text}")]
    Parse {
        /// The 1-based line number in the payload.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A rule uses a match, option or target the tracer does not understand.
    #[error("unsupported {what} in rule: {rule}")]
    Unsupported {
        /// The rule, as written (`-A CHAIN …`).
        rule: String,
        /// The part the tracer does not understand.
        what: String,
    },
    /// Jumps nest deeper than the tracer follows, which means the chains loop.
    #[error("jumps nest deeper than {MAX_DEPTH} chains at {table} {chain}; do the chains loop?")]
    TooDeep {
        /// The table.
        table: String,
        /// The chain reached too deep.
        chain: String,
    },
    /// The branches of a random choice end differently in a way no [`Outcome`] describes.
    #[error("branches end differently: {}", list(.verdicts))]
    Ambiguous {
        /// Every verdict reached, sorted.
        verdicts: Vec<Verdict>,
    },
}

/// The result type of this module.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;

/// What happens to a traced flow: compare it with the flow table's [`Expected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Translated to one of these endpoints, with whether it is masqueraded when that one is chosen.
    Endpoints(BTreeMap<SocketAddr, bool>),
    /// Refused by a `REJECT` rule.
    Reject,
    /// Dropped by a `DROP` rule or a built-in chain's policy.
    Drop,
    /// Neither translated, masqueraded, nor refused.
    Pass,
}

impl PartialEq<Expected> for Outcome {
    fn eq(&self, expected: &Expected) -> bool {
        match (self, expected) {
            (Self::Endpoints(actual), Expected::Endpoints { targets }) => actual == targets,
            (Self::Reject, Expected::Reject)
            | (Self::Drop, Expected::Drop)
            | (Self::Pass, Expected::Pass) => true,
            _ => false,
        }
    }
}

/// Where one branch of a trace ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict {
    /// Translated to `target` and let through.
    Endpoint {
        /// The translated destination.
        target: SocketAddr,
        /// Whether nat POSTROUTING masquerades it.
        masquerade: bool,
    },
    /// Let through untranslated.
    Pass {
        /// Whether nat POSTROUTING masquerades it.
        masquerade: bool,
    },
    /// Refused by a `REJECT` rule.
    Reject,
    /// Dropped by a `DROP` rule or a built-in chain's policy.
    Drop,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let masq = |masquerade: bool| if masquerade { " (masqueraded)" } else { "" };
        match self {
            Self::Endpoint { target, masquerade } => {
                write!(f, "DNAT {target}{}", masq(*masquerade))
            }
            Self::Pass { masquerade } => write!(f, "pass{}", masq(*masquerade)),
            Self::Reject => f.write_str("REJECT"),
            Self::Drop => f.write_str("DROP"),
        }
    }
}

fn list(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A parsed `iptables-restore` payload: its tables, chains and rules, with the executor's hooks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Ruleset {
    tables: BTreeMap<String, Table>,
}

#[derive(Debug, Clone, Default, PartialEq)]
struct Table {
    chains: BTreeMap<String, Chain>,
}

#[derive(Debug, Clone, PartialEq)]
struct Chain {
    /// What happens to a packet that falls off the end: `None` for user chains (return to the
    /// caller), the policy for built-in chains.
    policy: Option<Policy>,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Accept,
    Drop,
}

#[derive(Debug, Clone, PartialEq)]
struct Rule {
    /// The rule as written, for errors.
    text: String,
    matches: Vec<Match>,
    target: Target,
}

#[derive(Debug, Clone, PartialEq)]
enum Match {
    Source {
        net: Cidr,
        negated: bool,
    },
    Destination {
        net: Cidr,
        negated: bool,
    },
    Protocol {
        protocol: Protocol,
        negated: bool,
    },
    DestinationPort {
        port: u16,
        negated: bool,
    },
    SourceLocal {
        negated: bool,
    },
    DestinationLocal {
        negated: bool,
    },
    Random {
        probability: f64,
    },
    Mark {
        value: u32,
        mask: u32,
        negated: bool,
    },
    CtState {
        states: BTreeSet<CtState>,
        negated: bool,
    },
    /// `-m recent --rcheck`: whether the source is on a list, which depends on history.
    RecentCheck,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum CtState {
    New,
    Established,
    Related,
    Invalid,
    Untracked,
    Snat,
    Dnat,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// No `-j`: a rule that only counts (or, as kube-proxy's comment rules, only documents).
    Continue,
    Jump(String),
    Accept,
    Drop,
    Return,
    Reject,
    Dnat {
        ip: IpAddr,
        port: Option<u16>,
    },
    Masquerade,
    Mark(MarkOp),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkOp {
    Or(u32),
    Xor(u32),
    And(u32),
    /// `--set-xmark value/mask`: zero the mask bits, then XOR the value.
    SetXmark {
        value: u32,
        mask: u32,
    },
    /// `--set-mark value/mask`: zero the mask bits, then OR the value.
    Set {
        value: u32,
        mask: u32,
    },
}

impl MarkOp {
    fn apply(self, mark: u32) -> u32 {
        match self {
            Self::Or(value) => mark | value,
            Self::Xor(value) => mark ^ value,
            Self::And(value) => mark & value,
            Self::SetXmark { value, mask } => (mark & !mask) ^ value,
            Self::Set { value, mask } => (mark & !mask) | value,
        }
    }
}

/// An address with a prefix length (`/32` or `/128` when written without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    address: IpAddr,
    prefix: u8,
}

impl Cidr {
    fn parse(text: &str) -> Option<Self> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address.parse().ok()?, Some(prefix.parse().ok()?)),
            None => (text.parse().ok()?, None),
        };
        let bits = match address {
            IpAddr::V4(_) => 32,
            IpAddr::V6(_) => 128,
        };
        let prefix = prefix.unwrap_or(bits);
        (prefix <= bits).then_some(Self { address, prefix })
    }

    fn contains(self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// The tables the tracer runs; rules in any other table are unsupported.
const TRACED_TABLES: [&str; 2] = ["nat", "filter"];

/// The built-in chains of a table.
fn builtin_chains(table: &str) -> &'static [&'static str] {
    match table {
        "nat" => &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"],
        "filter" => &["INPUT", "FORWARD", "OUTPUT"],
        "mangle" => &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
        "raw" => &["PREROUTING", "OUTPUT"],
        _ => &[],
    }
}

/// Parses `payload` and traces `flow` through it; see [`Ruleset::parse`] and [`Ruleset::trace`].
///
/// # Errors
///
/// Returns an error when the payload is malformed or uses something the tracer does not
/// understand, or when the flow's branches end in ways no [`Outcome`] describes.
pub fn trace(payload: &str, flow: &Flow, node_ips: &[IpAddr]) -> Result<Outcome> {
    Ruleset::parse(payload)?.trace(flow, node_ips)
}

impl Ruleset {
    /// Reads an `iptables-restore` payload, adding the hooks of the module documentation.
    ///
    /// # Errors
    ///
    /// Returns [`TraceError::Parse`] for malformed input (a rule outside a table, a missing
    /// `COMMIT`, a rule for a chain the payload does not declare, a restore command other than
    /// `-A` and `-X`), and [`TraceError::Unsupported`] for matches, options and targets the tracer
    /// does not understand, including jumps to chains the table does not declare.
    pub fn parse(payload: &str) -> Result<Self> {
        let mut ruleset = Self::default();
        let mut open: Option<(String, Table)> = None;
        for (index, raw) in payload.lines().enumerate() {
            let line = raw.trim();
            let error = |reason| TraceError::Parse {
                line: index + 1,
                text: line.to_owned(),
                reason,
            };
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                if open.is_some() {
                    return Err(error("table starts before the previous one's COMMIT"));
                }
                if ruleset.tables.contains_key(name) {
                    return Err(error("table appears twice"));
                }
                open = Some((name.to_owned(), Table::default()));
                continue;
            }
            let Some((table_name, table)) = open.as_mut() else {
                return Err(error("line outside a table"));
            };
            if line == "COMMIT" {
                if let Some((name, table)) = open.take() {
                    let table = table.commit(&name)?;
                    ruleset.tables.insert(name, table);
                }
                continue;
            }
            let words = words(line).ok_or_else(|| error("unbalanced quotes"))?;
            match words.first().map(String::as_str) {
                Some(declaration) if declaration.starts_with(':') => {
                    let name = declaration.trim_start_matches(':');
                    let builtin = builtin_chains(table_name).contains(&name);
                    let policy = match (builtin, words.get(1).map(String::as_str)) {
                        (false, Some("-")) => None,
                        (true, Some("ACCEPT" | "-")) => Some(Policy::Accept),
                        (true, Some("DROP")) => Some(Policy::Drop),
                        _ => return Err(error("chain declaration with an invalid policy")),
                    };
                    if name.is_empty() {
                        return Err(error("chain declaration without a name"));
                    }
                    // Declaring a chain flushes it, as iptables-restore does.
                    table.chains.insert(
                        name.to_owned(),
                        Chain {
                            policy,
                            rules: Vec::new(),
                        },
                    );
                }
                Some("-A" | "--append") => {
                    let chain = words.get(1).ok_or_else(|| error("rule without a chain"))?;
                    let rule = parse_rule(table_name, line, &words[2..])?;
                    let builtin = builtin_chains(table_name).contains(&chain.as_str());
                    if builtin && !table.chains.contains_key(chain) {
                        table.chains.insert(
                            chain.clone(),
                            Chain {
                                policy: Some(Policy::Accept),
                                rules: Vec::new(),
                            },
                        );
                    }
                    let chain = table
                        .chains
                        .get_mut(chain)
                        .ok_or_else(|| error("rule for a chain the payload does not declare"))?;
                    chain.rules.push(rule);
                }
                Some("-X" | "--delete-chain") => {
                    let chain = words.get(1).ok_or_else(|| error("-X without a chain"))?;
                    if builtin_chains(table_name).contains(&chain.as_str()) {
                        return Err(error("deletes a built-in chain"));
                    }
                    table.chains.remove(chain);
                }
                _ => return Err(error("not a chain declaration, -A or -X")),
            }
        }
        if let Some((name, _)) = open {
            return Err(TraceError::Parse {
                line: payload.lines().count(),
                text: format!("*{name}"),
                reason: "table without COMMIT",
            });
        }
        Ok(ruleset)
    }

    /// What happens to the first packet of `flow`, on a node whose local addresses are `node_ips`.
    ///
    /// # Errors
    ///
    /// Returns [`TraceError::Ambiguous`] when the branches of random choices end in ways no
    /// [`Outcome`] describes, [`TraceError::TooDeep`] when the chains loop, and
    /// [`TraceError::Unsupported`] for a DNAT or MASQUERADE reached from a hook where the kernel
    /// would not allow it.
    pub fn trace(&self, flow: &Flow, node_ips: &[IpAddr]) -> Result<Outcome> {
        outcome(self.verdicts(flow, node_ips)?)
    }

    /// Where every branch of `flow`'s first packet ends, for debugging a trace.
    ///
    /// # Errors
    ///
    /// As [`trace`](Self::trace), except that branches may disagree.
    pub fn verdicts(&self, flow: &Flow, node_ips: &[IpAddr]) -> Result<BTreeSet<Verdict>> {
        let tracer = Tracer {
            ruleset: self,
            node_ips,
        };
        tracer.verdicts(flow)
    }
}

impl Table {
    /// Finishes a table at `COMMIT`: puts the hooks in front and checks that every jump lands.
    fn commit(mut self, name: &str) -> Result<Self> {
        // The executor inserts each jump as its chain's first rule, in this order.
        for (table, builtin, rule) in crate::iptables::installed_jumps() {
            let target = rule.rsplit(' ').next().unwrap_or_default();
            if table != name || !self.chains.contains_key(target) {
                continue;
            }
            let text = format!("-A {builtin} {rule}");
            let words = words(&rule).unwrap_or_default();
            let rule = parse_rule(name, &text, &words)?;
            self.chains
                .entry(builtin.to_owned())
                .or_insert(Chain {
                    policy: Some(Policy::Accept),
                    rules: Vec::new(),
                })
                .rules
                .insert(0, rule);
        }
        for chain in self.chains.values() {
            for rule in &chain.rules {
                if let Target::Jump(target) = &rule.target {
                    let user_chain = self
                        .chains
                        .get(target)
                        .is_some_and(|chain| chain.policy.is_none());
                    if !user_chain {
                        return Err(TraceError::Unsupported {
                            rule: rule.text.clone(),
                            what: format!(
                                "target {target} (neither a target the tracer knows nor a chain the {name} table declares)"
                            ),
                        });
                    }
                }
            }
        }
        Ok(self)
    }
}

/// The match modules the tracer understands.
const MODULES: [&str; 9] = [
    "comment",
    "tcp",
    "udp",
    "sctp",
    "addrtype",
    "statistic",
    "mark",
    "conntrack",
    "recent",
];

/// Parses the words of a rule after `-A CHAIN`; `text` is the whole rule, for errors.
fn parse_rule(table: &str, text: &str, words: &[String]) -> Result<Rule> {
    let unsupported = |what: String| TraceError::Unsupported {
        rule: text.to_owned(),
        what,
    };
    if !TRACED_TABLES.contains(&table) {
        return Err(unsupported(format!("table {table}")));
    }
    let mut modules = BTreeSet::new();
    let mut protocol = None;
    let mut matches = Vec::new();
    let mut negated = false;
    let mut recent = Recent::default();
    let mut words = words.iter().map(String::as_str);
    while let Some(option) = words.next() {
        if option == "!" {
            if negated {
                return Err(unsupported("double negation".to_owned()));
            }
            negated = true;
            continue;
        }
        let mut value = || {
            words
                .next()
                .ok_or_else(|| unsupported(format!("{option} without a value")))
        };
        let require = |module: &str| {
            if modules.contains(module) {
                Ok(())
            } else {
                Err(unsupported(format!("{option} without -m {module}")))
            }
        };
        let negatable = match option {
            "-m" | "--match" => {
                let module = value()?;
                if !MODULES.contains(&module) {
                    return Err(unsupported(format!("match module {module}")));
                }
                modules.insert(module);
                false
            }
            "--comment" => {
                require("comment")?;
                value()?;
                false
            }
            "-s" | "--source" | "-d" | "--destination" => {
                let text = value()?;
                let net =
                    Cidr::parse(text).ok_or_else(|| unsupported(format!("address {text}")))?;
                matches.push(if matches!(option, "-s" | "--source") {
                    Match::Source { net, negated }
                } else {
                    Match::Destination { net, negated }
                });
                true
            }
            "-p" | "--protocol" => {
                let name = value()?;
                let parsed = match name {
                    "tcp" => Protocol::Tcp,
                    "udp" => Protocol::Udp,
                    "sctp" => Protocol::Sctp,
                    _ => return Err(unsupported(format!("protocol {name}"))),
                };
                protocol = Some(parsed);
                matches.push(Match::Protocol {
                    protocol: parsed,
                    negated,
                });
                true
            }
            "--dport" | "--destination-port" => {
                let port_module = ["tcp", "udp", "sctp"]
                    .iter()
                    .any(|module| modules.contains(module));
                if !port_module && protocol.is_none() {
                    return Err(unsupported(format!(
                        "{option} without -p or -m tcp|udp|sctp"
                    )));
                }
                let text = value()?;
                let port = text
                    .parse()
                    .map_err(|_| unsupported(format!("port {text}")))?;
                matches.push(Match::DestinationPort { port, negated });
                true
            }
            "--src-type" | "--dst-type" => {
                require("addrtype")?;
                let kind = value()?;
                if kind != "LOCAL" {
                    return Err(unsupported(format!("address type {kind}")));
                }
                matches.push(if option == "--src-type" {
                    Match::SourceLocal { negated }
                } else {
                    Match::DestinationLocal { negated }
                });
                true
            }
            "--mode" => {
                require("statistic")?;
                let mode = value()?;
                if mode != "random" {
                    return Err(unsupported(format!("statistic mode {mode}")));
                }
                false
            }
            "--probability" => {
                require("statistic")?;
                let text = value()?;
                let probability = text
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=1.0).contains(p))
                    .ok_or_else(|| unsupported(format!("probability {text}")))?;
                if negated {
                    return Err(unsupported("negated probability".to_owned()));
                }
                matches.push(Match::Random { probability });
                false
            }
            "--mark" => {
                require("mark")?;
                let text = value()?;
                let (value, mask) =
                    mark_and_mask(text).ok_or_else(|| unsupported(format!("mark {text}")))?;
                matches.push(Match::Mark {
                    value,
                    mask,
                    negated,
                });
                true
            }
            "--ctstate" => {
                require("conntrack")?;
                let text = value()?;
                let states = text
                    .split(',')
                    .map(|state| {
                        Ok(match state {
                            "NEW" => CtState::New,
                            "ESTABLISHED" => CtState::Established,
                            "RELATED" => CtState::Related,
                            "INVALID" => CtState::Invalid,
                            "UNTRACKED" => CtState::Untracked,
                            "SNAT" => CtState::Snat,
                            "DNAT" => CtState::Dnat,
                            _ => return Err(unsupported(format!("conntrack state {state}"))),
                        })
                    })
                    .collect::<Result<_>>()?;
                matches.push(Match::CtState { states, negated });
                true
            }
            "--name" => {
                require("recent")?;
                recent.name = Some(value()?.to_owned());
                false
            }
            "--set" | "--rcheck" => {
                require("recent")?;
                if recent.command.replace(option).is_some() {
                    return Err(unsupported("two recent commands".to_owned()));
                }
                false
            }
            "--seconds" => {
                require("recent")?;
                let text = value()?;
                text.parse::<u32>()
                    .map_err(|_| unsupported(format!("seconds {text}")))?;
                recent.seconds = true;
                false
            }
            "--reap" => {
                require("recent")?;
                recent.reap = true;
                false
            }
            "--mask" => {
                require("recent")?;
                let text = value()?;
                // The whole source address, as `iptables-save` and `ip6tables-save` print it.
                if text != "255.255.255.255" && text != "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff" {
                    return Err(unsupported(format!("recent mask {text}")));
                }
                false
            }
            "--rsource" => {
                require("recent")?;
                false
            }
            "-j" | "--jump" => {
                if negated {
                    return Err(unsupported("negated -j".to_owned()));
                }
                if let Some(check) = recent.finish().map_err(unsupported)? {
                    matches.push(check);
                }
                let name = value()?;
                let options: Vec<&str> = words.collect();
                let target = parse_target(table, name, &options).map_err(unsupported)?;
                return Ok(Rule {
                    text: text.to_owned(),
                    matches,
                    target,
                });
            }
            _ => return Err(unsupported(format!("option {option}"))),
        };
        if negated && !negatable {
            return Err(unsupported(format!("negated {option}")));
        }
        negated = false;
    }
    Ok(Rule {
        text: text.to_owned(),
        matches,
        target: Target::Continue,
    })
}

/// The options of a `-m recent` match, collected while a rule is parsed.
#[derive(Debug, Default)]
struct Recent<'a> {
    name: Option<String>,
    /// `--set` or `--rcheck`.
    command: Option<&'a str>,
    seconds: bool,
    reap: bool,
}

impl Recent<'_> {
    /// The match these options make, if any (`--set` always matches, so it makes none); the
    /// error says what is unsupported.
    fn finish(self) -> Result<Option<Match>, String> {
        match (self.command, self.name.is_some()) {
            (None, false) if !self.seconds && !self.reap => Ok(None),
            (None, _) => Err("recent without --set or --rcheck".to_owned()),
            (Some(_), false) => Err("recent without --name".to_owned()),
            (Some("--set"), true) if !self.seconds && !self.reap => Ok(None),
            (Some("--set"), true) => Err("recent --set with --seconds or --reap".to_owned()),
            (Some(_), true) if self.reap && !self.seconds => {
                Err("recent --reap without --seconds".to_owned())
            }
            (Some(_), true) => Ok(Some(Match::RecentCheck)),
        }
    }
}

/// Parses a target and its options; the error says what is unsupported.
fn parse_target(table: &str, name: &str, options: &[&str]) -> Result<Target, String> {
    let only_in = |wanted: &str| {
        if table == wanted {
            Ok(())
        } else {
            Err(format!("{name} in the {table} table"))
        }
    };
    let target = match (name, options) {
        ("ACCEPT", []) => Target::Accept,
        ("DROP", []) => Target::Drop,
        ("RETURN", []) => Target::Return,
        ("REJECT", [] | ["--reject-with", _]) => {
            only_in("filter")?;
            Target::Reject
        }
        ("DNAT", ["--to-destination", destination]) => {
            only_in("nat")?;
            if let Ok(address) = destination.parse::<SocketAddr>() {
                Target::Dnat {
                    ip: address.ip(),
                    port: Some(address.port()),
                }
            } else if let Ok(ip) = destination.parse::<IpAddr>() {
                Target::Dnat { ip, port: None }
            } else {
                return Err(format!("DNAT destination {destination}"));
            }
        }
        ("MASQUERADE", [] | ["--random-fully" | "--random"]) => {
            only_in("nat")?;
            Target::Masquerade
        }
        ("MARK", [operation, value]) => {
            let bad = || format!("MARK value {value}");
            let single = || parse_u32(value).ok_or_else(bad);
            Target::Mark(match *operation {
                "--or-mark" => MarkOp::Or(single()?),
                "--xor-mark" => MarkOp::Xor(single()?),
                "--and-mark" => MarkOp::And(single()?),
                "--set-mark" | "--set-xmark" => {
                    let (value, mask) = mark_and_mask(value).ok_or_else(bad)?;
                    if *operation == "--set-mark" {
                        MarkOp::Set { value, mask }
                    } else {
                        MarkOp::SetXmark { value, mask }
                    }
                }
                _ => return Err(format!("MARK option {operation}")),
            })
        }
        (chain, []) => Target::Jump(chain.to_owned()),
        (_, options) => return Err(format!("{name} options {}", options.join(" "))),
    };
    Ok(target)
}

/// `value[/mask]`, the mask defaulting to all ones.
fn mark_and_mask(text: &str) -> Option<(u32, u32)> {
    match text.split_once('/') {
        Some((value, mask)) => Some((parse_u32(value)?, parse_u32(mask)?)),
        None => Some((parse_u32(text)?, u32::MAX)),
    }
}

/// A number as iptables prints it: `0x…` hexadecimal or decimal.
fn parse_u32(text: &str) -> Option<u32> {
    match text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => text.parse().ok(),
    }
}

/// The first packet of a flow, as the rules see it so far.
#[derive(Debug, Clone)]
struct Packet {
    source: IpAddr,
    destination: IpAddr,
    protocol: Protocol,
    port: u16,
    /// Generated by the node itself (its source counts as local).
    from_node: bool,
    mark: u32,
    translated: bool,
    masquerade: bool,
}

/// How a rule's matches turn out for a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Eval {
    No,
    Yes,
    /// A random choice: both outcomes happen.
    Maybe,
}

/// Where a packet leaves a chain.
#[derive(Debug)]
enum Exit<'a> {
    /// Fell off the end or hit RETURN.
    Return,
    /// Hit a terminating target (the rule holding it).
    Verdict(&'a Rule),
}

/// A packet and where it left a chain: one branch.
#[derive(Debug)]
struct End<'a> {
    packet: Packet,
    exit: Exit<'a>,
}

/// What a hook (a built-in chain) did with one branch.
#[derive(Debug)]
enum Step {
    /// Let through, possibly changed.
    Continue(Packet),
    /// Stopped for good.
    Stop(Verdict),
}

struct Tracer<'a> {
    ruleset: &'a Ruleset,
    node_ips: &'a [IpAddr],
}

impl<'a> Tracer<'a> {
    fn verdicts(&self, flow: &Flow) -> Result<BTreeSet<Verdict>> {
        let from_node = flow.origin == Origin::Node;
        let packet = Packet {
            source: flow.source,
            destination: flow.destination,
            protocol: flow.protocol,
            port: flow.port,
            from_node,
            mark: 0,
            translated: false,
            masquerade: false,
        };
        let mut verdicts = BTreeSet::new();
        let nat_hook = if from_node { "OUTPUT" } else { "PREROUTING" };
        for packet in self.hook("nat", nat_hook, vec![packet], &mut verdicts)? {
            let local = self.is_local(packet.destination);
            let packets = if from_node {
                let packets = self.hook("filter", "OUTPUT", vec![packet], &mut verdicts)?;
                let packets = self.hook("nat", "POSTROUTING", packets, &mut verdicts)?;
                if local {
                    self.hook("filter", "INPUT", packets, &mut verdicts)?
                } else {
                    packets
                }
            } else if local {
                self.hook("filter", "INPUT", vec![packet], &mut verdicts)?
            } else {
                let packets = self.hook("filter", "FORWARD", vec![packet], &mut verdicts)?;
                self.hook("nat", "POSTROUTING", packets, &mut verdicts)?
            };
            for packet in packets {
                verdicts.insert(if packet.translated {
                    Verdict::Endpoint {
                        target: SocketAddr::new(packet.destination, packet.port),
                        masquerade: packet.masquerade,
                    }
                } else {
                    Verdict::Pass {
                        masquerade: packet.masquerade,
                    }
                });
            }
        }
        Ok(verdicts)
    }

    /// Runs `packets` through a built-in chain; returns those let through and records the others'
    /// verdicts.
    fn hook(
        &self,
        table_name: &str,
        hook: &str,
        packets: Vec<Packet>,
        verdicts: &mut BTreeSet<Verdict>,
    ) -> Result<Vec<Packet>> {
        let Some(table) = self.ruleset.tables.get(table_name) else {
            return Ok(packets);
        };
        let Some(chain) = table.chains.get(hook) else {
            return Ok(packets);
        };
        let mut through = Vec::new();
        for packet in packets {
            for end in self.run(table_name, table, &chain.rules, 0, packet, 0)? {
                match self.step(table_name, hook, chain.policy, end)? {
                    Step::Continue(packet) => through.push(packet),
                    Step::Stop(verdict) => {
                        verdicts.insert(verdict);
                    }
                }
            }
        }
        Ok(through)
    }

    /// What the end of one branch in a built-in chain means.
    fn step(&self, table: &str, hook: &str, policy: Option<Policy>, end: End<'_>) -> Result<Step> {
        let End { mut packet, exit } = end;
        let rule = match exit {
            Exit::Return => {
                return Ok(match policy {
                    Some(Policy::Drop) => Step::Stop(Verdict::Drop),
                    Some(Policy::Accept) | None => Step::Continue(packet),
                });
            }
            Exit::Verdict(rule) => rule,
        };
        let misplaced = || TraceError::Unsupported {
            rule: rule.text.clone(),
            what: format!("target reached from {table} {hook}"),
        };
        Ok(match &rule.target {
            Target::Accept => Step::Continue(packet),
            Target::Drop => Step::Stop(Verdict::Drop),
            Target::Reject => Step::Stop(Verdict::Reject),
            Target::Dnat { ip, port } => {
                if hook != "PREROUTING" && hook != "OUTPUT" {
                    return Err(misplaced());
                }
                packet.destination = *ip;
                packet.port = port.unwrap_or(packet.port);
                packet.translated = true;
                Step::Continue(packet)
            }
            Target::Masquerade => {
                if hook != "POSTROUTING" {
                    return Err(misplaced());
                }
                packet.masquerade = true;
                Step::Continue(packet)
            }
            // `run` handles the others and never ends a branch on them.
            Target::Jump(_) | Target::Return | Target::Mark(_) | Target::Continue => {
                Step::Continue(packet)
            }
        })
    }

    /// Runs `packet` through `rules[start..]` of `chain`, following jumps; returns every branch.
    fn run(
        &self,
        table_name: &str,
        table: &'a Table,
        rules: &'a [Rule],
        start: usize,
        packet: Packet,
        depth: usize,
    ) -> Result<Vec<End<'a>>> {
        let mut ends = Vec::new();
        for (index, rule) in rules.iter().enumerate().skip(start) {
            match self.evaluate(rule, &packet) {
                Eval::No => continue,
                Eval::Yes => {
                    ends.extend(self.apply(table_name, table, rules, index, packet, depth)?);
                    return Ok(ends);
                }
                Eval::Maybe => ends.extend(self.apply(
                    table_name,
                    table,
                    rules,
                    index,
                    packet.clone(),
                    depth,
                )?),
            }
        }
        ends.push(End {
            packet,
            exit: Exit::Return,
        });
        Ok(ends)
    }

    /// Applies the target of `rules[index]` to a packet that matched it.
    fn apply(
        &self,
        table_name: &str,
        table: &'a Table,
        rules: &'a [Rule],
        index: usize,
        mut packet: Packet,
        depth: usize,
    ) -> Result<Vec<End<'a>>> {
        let rule = &rules[index];
        match &rule.target {
            Target::Jump(target) => {
                if depth >= MAX_DEPTH {
                    return Err(TraceError::TooDeep {
                        table: table_name.to_owned(),
                        chain: target.clone(),
                    });
                }
                // `Table::commit` checked that every jump lands on a user chain.
                let Some(callee) = table.chains.get(target) else {
                    return Err(TraceError::Unsupported {
                        rule: rule.text.clone(),
                        what: format!("target {target}"),
                    });
                };
                let mut ends = Vec::new();
                for end in self.run(table_name, table, &callee.rules, 0, packet, depth + 1)? {
                    match end.exit {
                        Exit::Return => ends.extend(self.run(
                            table_name,
                            table,
                            rules,
                            index + 1,
                            end.packet,
                            depth,
                        )?),
                        Exit::Verdict(_) => ends.push(end),
                    }
                }
                Ok(ends)
            }
            Target::Mark(operation) => {
                packet.mark = operation.apply(packet.mark);
                self.run(table_name, table, rules, index + 1, packet, depth)
            }
            Target::Continue => self.run(table_name, table, rules, index + 1, packet, depth),
            Target::Return => Ok(vec![End {
                packet,
                exit: Exit::Return,
            }]),
            Target::Accept
            | Target::Drop
            | Target::Reject
            | Target::Dnat { .. }
            | Target::Masquerade => Ok(vec![End {
                packet,
                exit: Exit::Verdict(rule),
            }]),
        }
    }

    fn evaluate(&self, rule: &Rule, packet: &Packet) -> Eval {
        let mut result = Eval::Yes;
        for condition in &rule.matches {
            match self.matches(condition, packet) {
                Eval::No => return Eval::No,
                Eval::Maybe => result = Eval::Maybe,
                Eval::Yes => {}
            }
        }
        result
    }

    fn matches(&self, condition: &Match, packet: &Packet) -> Eval {
        let (matched, negated) = match condition {
            Match::Source { net, negated } => (net.contains(packet.source), *negated),
            Match::Destination { net, negated } => (net.contains(packet.destination), *negated),
            Match::Protocol { protocol, negated } => (packet.protocol == *protocol, *negated),
            Match::DestinationPort { port, negated } => (packet.port == *port, *negated),
            Match::SourceLocal { negated } => {
                (packet.from_node || self.is_local(packet.source), *negated)
            }
            Match::DestinationLocal { negated } => (self.is_local(packet.destination), *negated),
            Match::Random { probability } => {
                return if *probability >= 1.0 {
                    Eval::Yes
                } else if *probability <= 0.0 {
                    Eval::No
                } else {
                    Eval::Maybe
                };
            }
            Match::Mark {
                value,
                mask,
                negated,
            } => (packet.mark & mask == *value, *negated),
            Match::CtState { states, negated } => {
                let dnat = packet.translated && states.contains(&CtState::Dnat);
                (states.contains(&CtState::New) || dnat, *negated)
            }
            // The client may or may not have been here before.
            Match::RecentCheck => return Eval::Maybe,
        };
        if matched != negated {
            Eval::Yes
        } else {
            Eval::No
        }
    }

    /// `addrtype LOCAL`: one of the node's addresses, or loopback.
    fn is_local(&self, ip: IpAddr) -> bool {
        ip.is_loopback() || self.node_ips.contains(&ip)
    }
}

/// Folds the verdicts of every branch into one [`Outcome`].
fn outcome(verdicts: BTreeSet<Verdict>) -> Result<Outcome> {
    let ambiguous = |verdicts: &BTreeSet<Verdict>| TraceError::Ambiguous {
        verdicts: verdicts.iter().copied().collect(),
    };
    let mut targets = BTreeMap::new();
    for verdict in &verdicts {
        if let Verdict::Endpoint { target, masquerade } = verdict {
            // The same target both masqueraded and not: which one the kernel does is random.
            if targets.insert(*target, *masquerade).is_some() {
                return Err(ambiguous(&verdicts));
            }
        }
    }
    if !targets.is_empty() && targets.len() == verdicts.len() {
        return Ok(Outcome::Endpoints(targets));
    }
    let mut all = verdicts.iter();
    match (all.next(), all.next()) {
        (Some(Verdict::Reject), None) => Ok(Outcome::Reject),
        (Some(Verdict::Drop), None) => Ok(Outcome::Drop),
        (Some(Verdict::Pass { masquerade: false }), None) => Ok(Outcome::Pass),
        _ => Err(ambiguous(&verdicts)),
    }
}
