#![allow(clippy::unwrap_used)]

use super::super::{JUMPS, KUBELET_JUMPS, render::KUBE_FIREWALL};
use super::*;

const FILTER: &str = "*filter\n:KUBE-FORWARD - [0:0]\n-A KUBE-FORWARD -j ACCEPT\nCOMMIT\n";
const NAT: &str = "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
const CHAINS: [(&str, &str); 1] = [("filter", KUBE_FIREWALL)];

fn restored(hooks: &Hooks<'_>) -> String {
    hooks.restore_input(&[FILTER, NAT]).concat()
}

#[test]
fn on_empty_tables_every_jump_is_inserted_first_in_kube_proxys_order() {
    let hooks = Hooks::missing_from("", &CHAINS, JUMPS.iter().chain(&KUBELET_JUMPS));

    assert_eq!(hooks.inserted().len(), JUMPS.len() + KUBELET_JUMPS.len());
    assert_eq!(
        restored(&hooks),
        r#"*filter
:KUBE-FORWARD - [0:0]
-A KUBE-FORWARD -j ACCEPT
:KUBE-PROXY-CANARY - [0:0]
:KUBE-FIREWALL - [0:0]
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
-I INPUT 1 -m comment --comment "kubernetes health check service ports" -j KUBE-NODEPORTS
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I FORWARD 1 -m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I FORWARD 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes load balancer firewall" -j KUBE-PROXY-FIREWALL
-I INPUT 1 -j KUBE-FIREWALL
-I OUTPUT 1 -j KUBE-FIREWALL
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-PROXY-CANARY - [0:0]
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I OUTPUT 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-I POSTROUTING 1 -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
*mangle
:KUBE-PROXY-CANARY - [0:0]
COMMIT
"#
    );
}

#[test]
fn jumps_and_chains_already_there_are_left_alone() {
    let saved = r#"*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
COMMIT
*filter
:INPUT ACCEPT [0:0]
:KUBE-FIREWALL - [0:0]
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-FIREWALL
COMMIT
"#;
    let hooks = Hooks::missing_from(saved, &CHAINS, JUMPS.iter().chain(&KUBELET_JUMPS));

    let restored = restored(&hooks);
    assert!(!restored.contains(":KUBE-FIREWALL"), "{restored}");
    assert!(
        !restored.contains("-I INPUT 1 -j KUBE-FIREWALL"),
        "{restored}"
    );
    // The same target with other matches is not kube-proxy's jump.
    assert!(
        restored.contains("-I OUTPUT 1 -j KUBE-FIREWALL\n"),
        "{restored}"
    );
    assert!(!restored.contains("-I PREROUTING"), "{restored}");
    assert!(!restored.contains("-I POSTROUTING"), "{restored}");
    // A nat jump seen in filter's section does not count for filter.
    assert!(
        restored.contains(
            "-I OUTPUT 1 -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
        ),
        "{restored}"
    );
    let inserted: Vec<(&str, &str)> = hooks
        .inserted()
        .iter()
        .map(|jump| (jump.chain, jump.target))
        .collect();
    assert_eq!(inserted.len(), JUMPS.len() + KUBELET_JUMPS.len() - 4);
    assert!(inserted.contains(&("OUTPUT", KUBE_FIREWALL)));
    // The canaries are written every full sync.
    assert_eq!(restored.matches(":KUBE-PROXY-CANARY - [0:0]").count(), 3);
}

#[test]
fn a_table_without_a_section_gets_one_and_no_table_gets_two() {
    let hooks = Hooks::missing_from("", &[], JUMPS.iter());

    let restored = hooks.restore_input(&[NAT]).concat();

    for table in ["*filter", "*nat", "*mangle"] {
        assert_eq!(restored.matches(table).count(), 1, "{restored}");
    }
    assert!(restored.starts_with(NAT.strip_suffix("COMMIT\n").unwrap()));
    assert_eq!(restored.matches("COMMIT\n").count(), 3, "{restored}");
}
