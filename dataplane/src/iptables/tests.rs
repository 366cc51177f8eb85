//! Tests of the iptables backend: the rendered payloads (`render`, and the node's options in
//! `options`), the executor against fake tools (`executor`, `stale_flows`) and both families
//! (`dual_stack`). This module holds the fixtures they share.
//!
//! Test addresses: the unit tests' plan ([`crate::testing::fixtures`]).
#![allow(clippy::unwrap_used)]

mod dual_stack;
mod executor;
mod options;
mod render;
mod stale_flows;

use super::{Config, Dataplane, Error, FamilyExecutor, JUMPS, render_filter, render_nat};
use crate::NodeOptions;
use crate::local_traffic::PodInterfaces;
use crate::testing::fixtures::{local, ready, service, state};
use crate::testing::{rules::assert_rules_eq, scratch::Scratch};
use crate::{Endpoint, Protocol, ProxyState, Service, ServicePort, TrafficPolicy};
use std::{collections::BTreeSet, time::Duration};

// ---------------------------------------------------------------------------------------------
// Fixtures

/// Terminating but still serving: used only when no endpoint is ready.
fn terminating(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ready: false,
        terminating: true,
        ..ready(ip, port)
    }
}

/// Terminating and no longer serving: never used.
fn gone(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        serving: false,
        ..terminating(ip, port)
    }
}

/// Starting up: neither ready nor serving, never used.
fn starting(ip: &str, port: u16) -> Endpoint {
    Endpoint {
        ready: false,
        serving: false,
        ..ready(ip, port)
    }
}

fn ips(texts: &[&str]) -> Vec<std::net::IpAddr> {
    texts.iter().map(|ip| ip.parse().unwrap()).collect()
}

/// A full sync's restore input without what it adds to each rendered table (the lines from the
/// canary to the `COMMIT`: the jumps from built-in chains, kubelet's firewall chain), and the
/// jumps it inserts.
fn split_hooks(payload: &str) -> (String, Vec<&str>) {
    let mut added = false;
    let mut rendered = String::new();
    for line in payload.lines() {
        if line == "COMMIT" {
            added = false;
        } else if line == ":KUBE-PROXY-CANARY - [0:0]" {
            added = true;
        }
        if !added {
            rendered.push_str(line);
            rendered.push('\n');
        }
    }
    let jumps = payload
        .lines()
        .filter(|line| line.starts_with("-I "))
        .collect();
    (rendered, jumps)
}

fn chains(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

/// Every kind of Service at once, with stale chains: the render's structural checks and the
/// executor tests sync it.
fn everything() -> (ProxyState, BTreeSet<String>) {
    let state = state(vec![
        service(
            "ns1",
            "svc1",
            &["172.30.0.41"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3001),
                vec![ready("10.180.0.1", 80), ready("10.180.0.2", 80)],
            )],
        ),
        service(
            "ns3",
            "svc3",
            &["172.30.0.43"],
            vec![ServicePort::new(
                "p80",
                Protocol::Tcp,
                80,
                Some(3003),
                vec![],
            )],
        ),
        service(
            "ns5",
            "svc5",
            &["172.30.0.45", "fd00:172:30::45"],
            vec![ServicePort::new(
                "",
                Protocol::Udp,
                53,
                Some(3005),
                vec![ready("10.180.2.5", 53), terminating("10.180.2.6", 53)],
            )],
        ),
    ]);
    let existing = chains(&[
        "PREROUTING",
        "KUBE-SVC-GNZBNJ2PO5MGZ6GT",
        "KUBE-SEP-RS4RBKLTHTF2IUXJ",
    ]);
    (state, existing)
}

/// An executor whose tools are one `sh` script: `sh -c SCRIPT DIR TOOL ARGS...`. The script logs
/// each call to `DIR/calls`; `iptables-save` prints `DIR/saved` (initially `saved`),
/// `iptables-restore` copies its input to `DIR/payload` (and fails with `restore_exit` unless it
/// is 0), and `iptables -S` (the canary probe) succeeds when the chain is in `DIR/saved`. `conntrack`
/// answers as conntrack-tools does when nothing matches (exit 1, "0 flow entries"), or fails with
/// another message while `DIR/conntrack-fails` exists.
fn fake_tools(scratch: &Scratch, saved: &str, restore_exit: u8) -> FamilyExecutor {
    let script = format!(
        r#"dir=$0; tool=$1; shift
echo "$tool $*" >> "$dir/calls"
case "$tool" in
  iptables-save) cat "$dir/saved" ;;
  iptables-restore) cat > "$dir/payload"; [ -e "$dir/restore-fails" ] && {{ echo 'iptables-restore: line 9 failed' >&2; exit 2; }}; [ {restore_exit} = 0 ] || {{ echo 'iptables-restore: line 2 failed' >&2; exit {restore_exit}; }} ;;
  iptables) case "$*" in *" -S "*) grep -q ":$(echo "$*" | awk '{{print $NF}}') " "$dir/saved" || exit 1 ;; esac ;;
  conntrack) [ -e "$dir/conntrack-fails" ] && {{ echo 'conntrack v1.4.7 (conntrack-tools): Operation failed: such conntrack doesn'"'"'t exist' >&2; exit 1; }}
    echo 'conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.' >&2; exit 1 ;;
esac"#
    );
    std::fs::write(scratch.0.join("saved"), saved).unwrap();
    let dir = scratch.0.to_string_lossy().into_owned();
    FamilyExecutor::with_config(Config::default().with_command_prefix([
        "sh".to_owned(),
        "-c".to_owned(),
        script,
        dir,
    ]))
}

const SAVED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-GNZBNJ2PO5MGZ6GT - [0:0]\nCOMMIT\n";
