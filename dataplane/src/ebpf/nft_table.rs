//! The ebpf mode's nftables table, for what the packet programs leave to the kernel: the
//! masquerade of the connections they mark, and the refusal of new connections from outside to
//! a Service address and port without endpoints, which the programs let through untranslated
//! (kube-proxy's REJECT answers those; the node would route them on, or drop them).
//!
//! The node's own connections never reach these rules translated or refused here: the socket
//! programs connect them to an endpoint, or refuse them at `connect()`.

use super::error::Error;
use crate::Protocol;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::process::{Command, Stdio};

/// The table.
pub const TABLE: &str = "inet splitproxy-ebpf";

/// The sets of Service addresses and ports without endpoints, per family.
const REFUSED: [(&str, &str); 2] = [
    ("no-endpoints-v4", "ipv4_addr"),
    ("no-endpoints-v6", "ipv6_addr"),
];

/// A Service address, protocol and port that refuses new connections from outside.
pub type Refused = (IpAddr, Protocol, u16);

/// Writes the table whole, its sets of refused Services empty: a changed `mark` replaces the
/// old masquerade rule.
///
/// # Errors
///
/// Returns what nft said when it refuses.
pub fn install(mark: u32) -> Result<(), Error> {
    nft(&table_script(mark)).map_err(table_error)
}

/// Makes `refused` the Service addresses and ports the table refuses, in one transaction.
///
/// # Errors
///
/// Returns what nft said when it refuses.
pub fn refuse(refused: &BTreeSet<Refused>) -> Result<(), Error> {
    nft(&refusal_script(refused)).map_err(table_error)
}

/// Removes the table; whether it was there. A node without `nft` has none.
///
/// # Errors
///
/// Returns an error when `nft` fails otherwise.
pub fn remove() -> Result<bool, Error> {
    let listing = match Command::new("nft").args(["list", "tables"]).output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(err) => return Err(table_error(format!("running nft: {err}"))),
    };
    let present = listing
        .lines()
        .any(|line| line.trim() == format!("table {TABLE}"));
    if present {
        nft(&format!("delete table {TABLE}\n")).map_err(table_error)?;
    }
    Ok(present)
}

/// The table: a connection the packet programs marked leaves with the node's address as its
/// source (the kernel's connection tracking undoes it for the replies) and the mark is cleared,
/// as kube-proxy's own masquerade rule does; a new connection arriving for, or routed through
/// the node to, a refused Service address and port is rejected (port unreachable, a TCP reset).
fn table_script(mark: u32) -> String {
    let mut script = format!("table {TABLE}\ndelete table {TABLE}\ntable {TABLE} {{\n");
    for (set, address) in REFUSED {
        let _ = writeln!(
            script,
            "\tset {set} {{\n\t\ttype {address} . inet_proto . inet_service\n\t}}"
        );
    }
    let _ = write!(
        script,
        "\tchain refuse {{\n\
         \t\tip daddr . meta l4proto . th dport @{} reject\n\
         \t\tip6 daddr . meta l4proto . th dport @{} reject\n\
         \t}}\n",
        REFUSED[0].0, REFUSED[1].0
    );
    for hook in ["input", "forward"] {
        let _ = writeln!(
            script,
            "\tchain {hook} {{\n\
             \t\ttype filter hook {hook} priority filter; policy accept;\n\
             \t\tct state new jump refuse\n\
             \t}}"
        );
    }
    let _ = write!(
        script,
        "\tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark & {mark:#x} == {mark:#x} meta mark set meta mark ^ {mark:#x} masquerade fully-random\n\
         \t}}\n\
         }}\n"
    );
    script
}

/// Empties both sets and fills them with `refused`.
fn refusal_script(refused: &BTreeSet<Refused>) -> String {
    let mut script = String::new();
    for (index, (set, _)) in REFUSED.iter().enumerate() {
        let _ = writeln!(script, "flush set {TABLE} {set}");
        let elements: Vec<String> = refused
            .iter()
            .filter(|(address, _, _)| usize::from(address.is_ipv6()) == index)
            .map(|(address, protocol, port)| format!("{address} . {protocol} . {port}"))
            .collect();
        if !elements.is_empty() {
            let _ = writeln!(
                script,
                "add element {TABLE} {set} {{ {} }}",
                elements.join(", ")
            );
        }
    }
    script
}

fn table_error(reason: String) -> Error {
    Error::Table(format!("{TABLE}: {reason}"))
}

/// Runs `script` with `nft -f -`; the error is what nft said.
fn nft(script: &str) -> Result<(), String> {
    let mut nft = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("running nft: {err}"))?;
    nft.stdin
        .take()
        .ok_or_else(|| "nft has no stdin".to_owned())?
        .write_all(script.as_bytes())
        .map_err(|err| format!("writing to nft: {err}"))?;
    let output = nft
        .wait_with_output()
        .map_err(|err| format!("waiting for nft: {err}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(crate::tool::stderr_text(&output.stderr))
    }
}

#[cfg(test)]
mod tests;
