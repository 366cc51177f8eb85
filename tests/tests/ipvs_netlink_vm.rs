//! The dataplane's IPVS generic netlink client (`splitproxy_dataplane::ipvs::Ipvs`) against a
//! real IPVS kernel, in the qemu VM of `tests/vm/build-vm.sh`: every operation, driven through
//! `sp-ipvs`, shows up in `ipvsadm -Ln`; the client's listing matches ipvsadm's, connection
//! counts included, after real traffic from a client pod through the virtual servers, TCP over
//! IPv4 and UDP over IPv6; a real server at weight 0 takes no new connections; deleting what is not
//! there fails naming the kernel's errno; the client has the kernel load `ip_vs` when it can, and
//! says to load it when it cannot. Needs root; one VM boot.
//!
//! Without qemu or the kernel package this test says so and stops, except under `CI=true`, where
//! that is a failure.
//!
//! Addresses (`splitproxy_e2e::vm::ipvs_node`): node 1 with pods `client` (10.244.1.10,
//! fd00:244::10) and `server` (10.244.1.20 serving TCP on 8080, fd00:244::20 serving UDP on
//! 5353); the virtual servers are the ClusterIPs 10.96.0.10:80 (TCP) and [fd00:96::10]:53 (UDP),
//! both on `kube-ipvs0`.

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_dataplane::ipvs::service_flags;
use splitproxy_e2e::vm::ipvs_node::{self, Sections, hit_report, section};
use splitproxy_e2e::workspace_binary;
use std::collections::BTreeMap;

/// Runs after the node and its pods; each step prints a section the test reads.
const SCRIPT: &str = r#"
# IPv6 for the same pods: a /128 each, routed by the node, gateway the fixed link-local fe80::1.
sysctl -qw net.ipv6.conf.all.forwarding=1
pod6() {
    ip addr add fe80::1/64 dev "cali-$1" nodad
    ip route add "$2/128" dev "cali-$1"
    ip -n "$1" addr add "$2/128" dev eth0 nodad
    ip -n "$1" route add default via fe80::1 dev eth0
}
pod6 client fd00:244::10
pod6 server fd00:244::20
ip netns exec server sp-testpod serve --udp --name server-pod-v6 --listen [::]:5353 &
tries=0
until ip netns exec client sp-testpod hit --udp --url 'udp://[fd00:244::20]:5353' --count 1 \
        --timeout-ms 500 | grep -q '"server-pod-v6"'; do
    tries=$((tries + 1))
    [ "$tries" -lt 50 ] || { echo "the UDP server never answered its pod address"; exit 1; }
    sleep 0.1
done

ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0
ip addr add fd00:96::10/128 dev kube-ipvs0 nodad

sp-ipvs add-service tcp 10.96.0.10:80 rr --persistent 10800
sp-ipvs add-real tcp 10.96.0.10:80 10.244.1.20:8080 1
sp-ipvs add-service udp [fd00:96::10]:53 wrr
sp-ipvs add-real udp [fd00:96::10]:53 [fd00:244::20]:5353 3
echo "== added"
ipvsadm -Ln
echo "== added, listed"
sp-ipvs list

echo "== ipv6 traffic"
ip netns exec client sp-testpod hit --udp --url 'udp://[fd00:96::10]:53' --count 3 \
    --timeout-ms 5000
echo "== traffic"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 5 --timeout-ms 5000
# Two connections the client holds open: the real server's active connections.
for _ in 1 2; do
    ip netns exec client bash -c 'exec 3<>/dev/tcp/10.96.0.10/80; sleep 600' &
done
tries=0
until ipvsadm -Ln | grep -Eq -- '-> 10.244.1.20:8080 +Masq +1 +2 '; do
    tries=$((tries + 1))
    [ "$tries" -lt 100 ] || break
    sleep 0.1
done
echo "== connections"
ipvsadm -Ln
echo "== connections, listed"
sp-ipvs list

# Without persistence, so the client's persistence template no longer picks the server.
sp-ipvs set-service tcp 10.96.0.10:80 wlc
sp-ipvs set-weight tcp 10.96.0.10:80 10.244.1.20:8080 0
echo "== weight 0"
ipvsadm -Ln
echo "== weight 0, traffic"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 2000
sp-ipvs set-weight tcp 10.96.0.10:80 10.244.1.20:8080 1
echo "== weight 1 again, traffic"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/source --count 3 --timeout-ms 5000

sp-ipvs delete-real tcp 10.96.0.10:80 10.244.1.20:8080
echo "== real server deleted"
ipvsadm -Ln
echo "== missing real server"
sp-ipvs delete-real tcp 10.96.0.10:80 10.244.1.20:8080 2>&1 || echo "exit $?"
sp-ipvs delete-service tcp 10.96.0.10:80
echo "== service deleted"
ipvsadm -Ln
echo "== missing service"
sp-ipvs delete-service tcp 10.96.0.10:80 2>&1 || echo "exit $?"

# The family lookup makes the kernel load ip_vs (its alias net-pf-16-proto-16-family-IPVS), unless
# it cannot run modprobe.
ip_vs_loaded() { grep -q '^ip_vs ' /proc/modules; }
sp-ipvs delete-service udp [fd00:96::10]:53
rmmod ip_vs_wlc ip_vs_wrr ip_vs_rr ip_vs
if ip_vs_loaded; then echo "rmmod left ip_vs loaded"; exit 1; fi
echo "== ip_vs removed, then listed"
sp-ipvs list
ip_vs_loaded && echo "ip_vs loaded"
rmmod ip_vs
echo /nonexistent >/proc/sys/kernel/modprobe
echo "== without ip_vs"
sp-ipvs list 2>&1 || echo "exit $?"
"#;

#[test]
fn the_netlink_client_programs_and_reads_ipvs_as_ipvsadm_sees_it_in_a_vm() -> Result<()> {
    let sp_ipvs = workspace_binary("sp-ipvs")?;
    let Some(sections) = ipvs_node::run(SCRIPT, |vm| {
        vm.with_file(sp_ipvs, "/usr/local/bin/sp-ipvs")
            .with_modules(["ip_vs_wrr", "ip_vs_wlc"])
    })?
    else {
        return Ok(());
    };

    // Added: ipvsadm shows both virtual servers as the client created them.
    let added = ipvsadm(&sections, "added")?;
    let expected = BTreeMap::from([
        (
            "TCP 10.96.0.10:80 rr persistent 10800".to_owned(),
            vec![real("10.244.1.20:8080", 1, 0, 0)],
        ),
        (
            "UDP [fd00:96::10]:53 wrr".to_owned(),
            vec![real("[fd00:244::20]:5353", 3, 0, 0)],
        ),
    ]);
    ensure!(added == expected, "after adding, ipvsadm shows {added:#?}");
    let listed = listing(&sections, "added, listed")?;
    ensure!(
        listed == added,
        "the client lists {listed:#?}\nbut ipvsadm shows {added:#?}"
    );

    // Traffic through the virtual server reaches the real server, and both count it alike.
    let traffic = hit_report(&sections, "traffic")?;
    ensure!(
        traffic.answers == BTreeMap::from([("server-pod 10.244.1.10".to_owned(), 5)]),
        "10.96.0.10:80 through the real server: {traffic:?}"
    );
    let counted = ipvsadm(&sections, "connections")?;
    let listed = listing(&sections, "connections, listed")?;
    ensure!(
        listed == counted,
        "the client lists {listed:#?}\nbut ipvsadm shows {counted:#?}"
    );
    let server = &counted["TCP 10.96.0.10:80 rr persistent 10800"][0];
    println!("real server after traffic (address, weight, active, inactive): {server:?}");
    ensure!(
        server.2 == 2 && server.3 == 5,
        "expected 2 active connections (held open) and 5 inactive (closed), ipvsadm shows \
         {server:?}"
    );
    let ipv6 = hit_report(&sections, "ipv6 traffic")?;
    ensure!(
        ipv6.answers == BTreeMap::from([("server-pod-v6".to_owned(), 3)]),
        "[fd00:96::10]:53 through its real server: {ipv6:?}"
    );
    let server = &counted["UDP [fd00:96::10]:53 wrr"][0];
    ensure!(
        server.3 == 3,
        "expected 3 inactive connections (UDP flows) to {server:?}"
    );

    // Weight 0: the service is updated too, and no new connection reaches the real server.
    let drained = ipvsadm(&sections, "weight 0")?;
    let tcp = drained
        .iter()
        .find(|(service, _)| service.starts_with("TCP "))
        .context("the TCP virtual server is gone")?;
    ensure!(
        tcp.0 == "TCP 10.96.0.10:80 wlc" && tcp.1[0].1 == 0,
        "after set-service and set-weight 0, ipvsadm shows {tcp:?}"
    );
    let refused = hit_report(&sections, "weight 0, traffic")?;
    ensure!(
        refused.answered() == 0 && refused.failures == 3,
        "a real server at weight 0 answered new connections: {refused:?}"
    );
    let again = hit_report(&sections, "weight 1 again, traffic")?;
    ensure!(
        again.answered() == 3,
        "back at weight 1 the real server must answer: {again:?}"
    );

    // Deletes, and deleting what is gone.
    let without_real = ipvsadm(&sections, "real server deleted")?;
    ensure!(
        without_real.get("TCP 10.96.0.10:80 wlc") == Some(&Vec::new()),
        "after delete-real, ipvsadm shows {without_real:#?}"
    );
    let deleted = ipvsadm(&sections, "service deleted")?;
    ensure!(
        deleted.keys().collect::<Vec<_>>() == ["UDP [fd00:96::10]:53 wrr"],
        "after delete-service, ipvsadm shows {deleted:#?}"
    );
    let autoloaded = section(&sections, "ip_vs removed, then listed")?;
    ensure!(
        autoloaded.contains("[]\nip_vs loaded"),
        "the client's family lookup must have the kernel load ip_vs:\n{autoloaded}"
    );
    for (name, expected) in [
        (
            "missing real server",
            "deleting real server 10.244.1.20:8080 of tcp 10.96.0.10:80: no such real server \
             (ENOENT, errno 2)",
        ),
        (
            "missing service",
            "deleting virtual server tcp 10.96.0.10:80: no such virtual server (ESRCH, errno 3)",
        ),
        (
            "without ip_vs",
            "the kernel has no IPVS generic netlink family and could not load it: load the ip_vs \
             module",
        ),
    ] {
        let text = section(&sections, name)?;
        ensure!(
            text.contains(expected) && text.contains("exit 1"),
            "{name}: expected the error {expected:?}, got:\n{text}"
        );
    }
    Ok(())
}

/// A real server as both listings show it: `ADDRESS:PORT`, weight, active and inactive
/// connections.
type Real = (String, u32, u32, u32);

/// Virtual servers as `ipvsadm -Ln` writes their line (`TCP 10.96.0.10:80 rr persistent 10800`),
/// each with its real servers.
type Table = BTreeMap<String, Vec<Real>>;

fn real(address: &str, weight: u32, active: u32, inactive: u32) -> Real {
    (address.to_owned(), weight, active, inactive)
}

/// The `ipvsadm -Ln` output in section `name`, as a [`Table`].
fn ipvsadm(sections: &Sections, name: &str) -> Result<Table> {
    let text = section(sections, name)?;
    let mut table = Table::new();
    let mut current = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["TCP" | "UDP" | "SCTP", ..] => {
                let service = fields.join(" ");
                table.insert(service.clone(), Vec::new());
                current = Some(service);
            }
            ["->", address, "Masq", weight, active, inactive] => {
                let service = current
                    .as_ref()
                    .with_context(|| format!("a real server before any service in {name}"))?;
                let parse = |n: &str| {
                    n.parse::<u32>()
                        .with_context(|| format!("{n:?} in {line:?}"))
                };
                let entry = real(address, parse(weight)?, parse(active)?, parse(inactive)?);
                table.entry(service.clone()).or_default().push(entry);
            }
            _ => {}
        }
    }
    Ok(table)
}

/// The `sp-ipvs list` JSON in section `name`, written as ipvsadm would: the same [`Table`].
fn listing(sections: &Sections, name: &str) -> Result<Table> {
    let text = section(sections, name)?;
    let services: Vec<Value> = serde_json::from_str(text.trim())
        .with_context(|| format!("parsing sp-ipvs list in {name}:\n{text}"))?;
    let mut table = Table::new();
    for service in services {
        let field = |key: &str| {
            service
                .get(key)
                .with_context(|| format!("no {key} in {service}"))
        };
        let id = field("service")?.as_str().context("service")?;
        let (protocol, address) = id.split_once(' ').context("service")?;
        let mut line = format!(
            "{} {address} {}",
            protocol.to_uppercase(),
            field("scheduler")?.as_str().context("scheduler")?
        );
        if field("flags")?.as_u64() == Some(u64::from(service_flags::PERSISTENT)) {
            line.push_str(&format!(" persistent {}", field("timeout")?));
        }
        let mut reals = Vec::new();
        for listed in field("real_servers")?.as_array().context("real_servers")? {
            let number = |key: &str| -> Result<u32> {
                let value = listed.get(key).and_then(Value::as_u64);
                Ok(u32::try_from(
                    value.with_context(|| format!("no {key} in {listed}"))?,
                )?)
            };
            reals.push(real(
                listed["address"].as_str().context("address")?,
                number("weight")?,
                number("active")?,
                number("inactive")?,
            ));
        }
        table.insert(line, reals);
    }
    Ok(table)
}
