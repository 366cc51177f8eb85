//! The agent in IPVS mode (`--proxy-mode ipvs`) on a real IPVS kernel, in the qemu VM
//! (`tests/vm/build-vm.sh`), fed by a controller on the manifests source in the same VM: what a
//! user of kube-proxy's IPVS mode sees, with real traffic. Needs root.
//!
//! Addresses (`splitproxy_e2e::vm::ipvs_node`): the VM is node 1 (198.18.0.11) with pods `client`
//! (10.244.1.10), `server` (10.244.1.20, `server-pod`) and `server2` (10.244.1.21, `server-2`),
//! each serving on 8080, and `ext` (203.0.113.7), a client outside the cluster routed like a pod.
//! The Service `demo/web` has cluster IP 10.96.0.10, port 80 and node port 30080; the agent binds
//! the cluster IP to `kube-ipvs0` itself. The UDP Service `demo/dns` (10.96.0.30:53) has the same
//! pods, answering on 5353.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    pki::{ControllerTls, random_token},
    vm::ipvs_node::{self, Sections, hit_report, section},
    workspace_binary,
};
use std::{net::Ipv4Addr, path::Path, time::Duration};

/// Where the test's files are in the VM.
const GUEST_DIR: &str = "/cluster";

/// The cluster before and after `server-2` goes: Node, the web and dns Services and their
/// EndpointSlices.
fn manifests(endpoints: &[&str]) -> String {
    let mut yaml = String::from(
        "apiVersion: v1
kind: Node
metadata:
  name: node-1
status:
  addresses:
  - type: InternalIP
    address: 198.18.0.11
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
spec:
  type: NodePort
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10]
  ports:
  - name: http
    protocol: TCP
    port: 80
    targetPort: 8080
    nodePort: 30080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-x7k2p
  namespace: demo
  labels:
    kubernetes.io/service-name: web
addressType: IPv4
ports:
- name: http
  protocol: TCP
  port: 8080
endpoints:
",
    );
    let listed: String = endpoints
        .iter()
        .map(|address| {
            format!("- addresses: [{address}]\n  conditions: {{ready: true}}\n  nodeName: node-1\n")
        })
        .collect();
    yaml.push_str(&listed);
    yaml.push_str(
        "---
apiVersion: v1
kind: Service
metadata:
  name: dns
  namespace: demo
spec:
  clusterIP: 10.96.0.30
  clusterIPs: [10.96.0.30]
  ports:
  - name: dns
    protocol: UDP
    port: 53
    targetPort: 5353
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-4fq8z
  namespace: demo
  labels:
    kubernetes.io/service-name: dns
addressType: IPv4
ports:
- name: dns
  protocol: UDP
  port: 5353
endpoints:
",
    );
    yaml.push_str(&listed);
    yaml
}

const SCRIPT: &str = r#"
pod server2 10.244.1.21
ip netns exec server2 sp-testpod serve --name server-2 --listen 0.0.0.0:8080 &
ip netns exec server sp-testpod serve --udp --name server-pod --listen 0.0.0.0:5353 &
ip netns exec server2 sp-testpod serve --udp --name server-2 --listen 0.0.0.0:5353 &
pod ext 203.0.113.7

trap 'echo "== controller log"; cat /tmp/controller.log; echo "== agent log"; cat /tmp/agent.log' EXIT
mkdir -p /tmp/manifests
cp /cluster/both.yaml /tmp/manifests/cluster.yaml
splitproxy-controller --manifests /tmp/manifests --listen 127.0.0.1:10660 \
    --agent-tokens-file /cluster/tokens.csv \
    --tls-cert-file /cluster/controller.crt --tls-private-key-file /cluster/controller.key \
    >/tmp/controller.log 2>&1 &
splitproxy-agent --controller https://127.0.0.1:10660 --hostname-override node-1 \
    --proxy-mode ipvs --bind-address 198.18.0.11 --iptables-sync-period 2s \
    --ipvs-tcp-timeout 10m --ipvs-udp-timeout 90s \
    --token-file /cluster/node-1.token --controller-ca-file /cluster/controller-ca.crt \
    >/tmp/agent.log 2>&1 &
agent=$!

# Waits until `ipvsadm -Ln` matches the extended regex $1.
await_ipvs() {
    tries=0
    until ipvsadm -Ln | grep -Eq -- "$1"; do
        tries=$((tries + 1))
        [ "$tries" -lt 600 ] || { echo "IPVS never matched $1:"; ipvsadm -Ln; exit 1; }
        sleep 0.2
    done
}
await_ipvs '-> 10.244.1.21:8080 +Masq'
await_ipvs '-> 10.244.1.21:5353 +Masq'

echo "== programmed after $(cut -d. -f1 /proc/uptime) s of uptime"
echo "== proxy mode"
wget -qO- http://127.0.0.1:10249/proxyMode
echo
echo "== listed"
ipvsadm -Ln
echo "== timeouts"
ipvsadm -L --timeout
echo "== bound"
ip -o addr show dev kube-ipvs0
echo "== sets"
ipset list KUBE-CLUSTER-IP
ipset list KUBE-NODE-PORT-TCP
echo "== nat rules"
iptables -t nat -S KUBE-SERVICES
iptables -t nat -S KUBE-NODE-PORT
echo "== cluster ip"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/ --count 20 --timeout-ms 5000
echo "== node port"
ip netns exec ext sp-testpod hit --url http://198.18.0.11:30080/source --count 20 --timeout-ms 5000
# A UDP client that keeps its source port, as a resolver does: one whose flow lands on server-2.
port=40053
until ip netns exec client sp-testpod hit --udp --url udp://10.96.0.30:53 --source-port "$port" \
        --count 1 | grep -q '"server-2"'; do
    port=$((port + 1))
    [ "$port" -lt 40073 ] || { echo "no UDP flow landed on server-2"; exit 1; }
done
echo "== udp before"
ip netns exec client sp-testpod hit --udp --url udp://10.96.0.30:53 --source-port "$port" --count 5

cp /cluster/one.yaml /tmp/manifests/cluster.yaml.tmp
mv /tmp/manifests/cluster.yaml.tmp /tmp/manifests/cluster.yaml
# The removed endpoint's closed connections stay in IPVS's table for 2 minutes (TIME_WAIT): until
# then it drains at weight 0, taking no new connections.
tries=0
while ipvsadm -Ln | grep -Eq -- '-> 10.244.1.21:8080 +Masq +1 '; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "the removed endpoint stayed"; ipvsadm -Ln; exit 1; }
    sleep 0.2
done
echo "== drained"
ipvsadm -Ln
echo "== one endpoint"
ip netns exec client sp-testpod hit --url http://10.96.0.10:80/ --count 10 --timeout-ms 5000
# The flow's conntrack entry goes with the UDP endpoint: this kernel's IPVS expires a removed
# real server's connections itself (expire_nodest_conn=1, Linux 5.9 and later), and the agent
# deletes stale UDP flows as upstream does for older kernels (checked by hand: the flow moves
# without the agent's deletion too, so this test does not prove it).
tries=0
while conntrack -L -p udp --orig-src 10.244.1.10 --sport "$port" 2>/dev/null | grep -q 10.244.1.21; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "the stale UDP flow stayed"; conntrack -L -p udp; exit 1; }
    sleep 0.2
done
echo "== udp after"
ip netns exec client sp-testpod hit --udp --url udp://10.96.0.30:53 --source-port "$port" --count 5

# Someone flushes the tables and deletes their chains (a firewall reload), then the ipsets no
# rule uses any more: the next periodic sync finds the canary gone and writes the rules and
# jumps again, and the sets once the rules fail without them. The agent is paused meanwhile, so
# no sync of its comes in between.
kill -STOP "$agent"
for tool in iptables ip6tables; do
    "$tool" -t nat -F
    "$tool" -t nat -X
    "$tool" -F
    "$tool" -X
done
ipset destroy
kill -CONT "$agent"
tries=0
until iptables -t nat -S PREROUTING | grep -q 'KUBE-SERVICES'; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "the nat rules never came back"; exit 1; }
    sleep 0.2
done
echo "== after a flush"
iptables -t nat -S PREROUTING
iptables -t nat -S KUBE-NODE-PORT
ip netns exec ext sp-testpod hit --url http://198.18.0.11:30080/source --count 4 --timeout-ms 5000

cp /cluster/none.yaml /tmp/manifests/cluster.yaml.tmp
mv /tmp/manifests/cluster.yaml.tmp /tmp/manifests/cluster.yaml
tries=0
while ip -o addr show dev kube-ipvs0 | grep -q 10.96.0.10; do
    tries=$((tries + 1))
    [ "$tries" -lt 600 ] || { echo "the Service's address stayed bound"; exit 1; }
    sleep 0.2
done
echo "== service deleted"
ipvsadm -Ln
ip -o addr show dev kube-ipvs0
ipset list KUBE-CLUSTER-IP

# The Service back, then `--cleanup` with the agent stopped: every IPVS virtual server goes but
# another program's inside --ipvs-exclude-cidrs, with kube-ipvs0, the ipsets and the rules.
cp /cluster/one.yaml /tmp/manifests/cluster.yaml.tmp
mv /tmp/manifests/cluster.yaml.tmp /tmp/manifests/cluster.yaml
await_ipvs '-> 10.244.1.20:8080 +Masq'
kill "$agent"
wait "$agent" || true
ipvsadm -A -t 192.0.2.1:443 -s rr
echo "== before cleanup"
ipvsadm -Ln
splitproxy-agent --cleanup --ipvs-exclude-cidrs 192.0.2.0/24 >/tmp/cleanup.log 2>&1 \
    || { echo "cleanup failed"; cat /tmp/cleanup.log; exit 1; }
echo "== cleaned"
ipvsadm -Ln
ip -o link show
ipset list -n
iptables -t nat -S
trap - EXIT
"#;

/// Writes the controller's TLS, the node's token and both manifests to `dir`.
fn write_cluster_files(dir: &Path) -> Result<()> {
    ControllerTls::generate(dir, Ipv4Addr::LOCALHOST)?;
    let token = random_token()?;
    std::fs::write(dir.join("node-1.token"), &token)?;
    std::fs::write(dir.join("tokens.csv"), format!("{token},node-1\n"))?;
    std::fs::write(
        dir.join("both.yaml"),
        manifests(&["10.244.1.20", "10.244.1.21"]),
    )?;
    std::fs::write(dir.join("one.yaml"), manifests(&["10.244.1.20"]))?;
    let node_only = manifests(&[]);
    let node_only = node_only
        .split("---\n")
        .next()
        .context("the manifests start with the Node")?;
    std::fs::write(dir.join("none.yaml"), node_only)?;
    Ok(())
}

fn run_cluster(script: &str) -> Result<Option<Sections>> {
    let files = tempfile::tempdir().context("creating the cluster files' folder")?;
    write_cluster_files(files.path())?;
    let controller = workspace_binary("splitproxy-controller")?;
    let agent = workspace_binary("splitproxy-agent")?;
    ipvs_node::run(script, |mut vm| {
        for entry in std::fs::read_dir(files.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            vm = vm.with_file(entry.path(), Path::new(GUEST_DIR).join(entry.file_name()));
        }
        vm.with_file(controller, "/usr/local/bin/splitproxy-controller")
            .with_file(agent, "/usr/local/bin/splitproxy-agent")
            .with_host_files([
                "/usr/sbin/iptables-save",
                "/usr/sbin/ip6tables",
                "/usr/sbin/ip6tables-save",
                "/usr/sbin/ip6tables-restore",
                "/usr/sbin/conntrack",
            ])
            .with_timeout(Duration::from_secs(300))
    })
}

#[test]
fn the_agent_in_ipvs_mode_serves_cluster_ips_and_node_ports_in_a_vm() -> Result<()> {
    let Some(sections) = run_cluster(SCRIPT)? else {
        return Ok(());
    };
    let mode = section(&sections, "proxy mode")?;
    ensure!(mode.trim() == "ipvs", "/proxyMode said {mode:?}");
    let timeouts = section(&sections, "timeouts")?;
    ensure!(
        timeouts.contains("Timeout (tcp tcpfin udp): 600 120 90"),
        "--ipvs-tcp-timeout and --ipvs-udp-timeout set, the FIN timeout left: {timeouts}"
    );
    let bound = section(&sections, "bound")?;
    ensure!(
        bound.contains("kube-ipvs0") && bound.contains("inet 10.96.0.10/32"),
        "the agent binds the cluster IP to kube-ipvs0:\n{bound}"
    );
    let listed = section(&sections, "listed")?;
    ensure!(
        listed.contains("TCP  10.96.0.10:80 rr") && listed.contains("TCP  198.18.0.11:30080 rr"),
        "a virtual server for the cluster IP and one for the node port:\n{listed}"
    );

    let cluster_ip = hit_report(&sections, "cluster ip")?;
    ensure!(
        cluster_ip.answered() == 20
            && cluster_ip
                .answers
                .keys()
                .any(|who| who.starts_with("server-pod"))
            && cluster_ip
                .answers
                .keys()
                .any(|who| who.starts_with("server-2")),
        "a pod reaches both endpoints through the cluster IP: {cluster_ip:?}"
    );
    let sets = section(&sections, "sets")?;
    ensure!(
        sets.contains("10.96.0.10,tcp:80") && sets.contains("\n30080\n"),
        "the cluster IP and the node port are in kube-proxy's ipsets:\n{sets}"
    );
    let nat = section(&sections, "nat rules")?;
    ensure!(
        nat.contains("--match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ")
            && nat.contains("-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT"),
        "node-port traffic is marked for masquerading through the set:\n{nat}"
    );
    let node_port = hit_report(&sections, "node port")?;
    ensure!(
        node_port.answered() == 20
            && node_port
                .answers
                .keys()
                .all(|answer| answer.ends_with(" 198.18.0.11")),
        "a client outside the cluster reaches the node port, masqueraded to the node's \
         address: {node_port:?}"
    );
    let drained = section(&sections, "drained")?;
    ensure!(
        drained
            .lines()
            .filter(|line| line.contains("-> 10.244.1.21:8080"))
            .all(|line| line.split_whitespace().nth(3) == Some("0")),
        "the removed endpoint drains at weight 0 (graceful termination) or is gone:\n{drained}"
    );
    let one = hit_report(&sections, "one endpoint")?;
    ensure!(
        one.answered() == 10 && one.answers.keys().all(|who| who.starts_with("server-pod")),
        "once server-2 leaves the EndpointSlice, only server-pod answers: {one:?}"
    );
    let before = hit_report(&sections, "udp before")?;
    ensure!(
        before.answered_by("server-2") == 5,
        "a UDP client keeping its port sticks to server-2: {before:?}"
    );
    let after = hit_report(&sections, "udp after")?;
    ensure!(
        after.answered_by("server-pod") == 5 && after.failures == 0,
        "once server-2 goes, the same flow moves to server-pod without losing a request: \
         {after:?}"
    );
    let flushed = section(&sections, "after a flush")?;
    let masqueraded = hit_report(&sections, "after a flush")?;
    ensure!(
        flushed.contains("--match-set KUBE-NODE-PORT-TCP dst -j KUBE-MARK-MASQ")
            && masqueraded.answered() == 4
            && masqueraded
                .answers
                .keys()
                .all(|answer| answer.ends_with(" 198.18.0.11")),
        "after the tables were flushed and the sets destroyed behind its back the agent \
         restores them, and node-port traffic is masqueraded again:\n{flushed}"
    );
    let deleted = section(&sections, "service deleted")?;
    ensure!(
        !deleted.contains("10.96.0.10")
            && !deleted.contains(":30080")
            && !deleted.contains("10.96.0.30"),
        "once the Service is deleted, its virtual servers, address and set entries are \
         gone:\n{deleted}"
    );
    let before = section(&sections, "before cleanup")?;
    ensure!(
        before.contains("TCP  10.96.0.10:80 rr") && before.contains("TCP  192.0.2.1:443 rr"),
        "the Service's virtual servers and another program's before the cleanup:\n{before}"
    );
    let cleaned = section(&sections, "cleaned")?;
    ensure!(
        cleaned.contains("TCP  192.0.2.1:443 rr")
            && !cleaned.contains("10.96.0.")
            && !cleaned.contains(":30080")
            && !cleaned.contains("kube-ipvs0")
            && !cleaned.contains("KUBE-"),
        "--cleanup removes the virtual servers but the excluded one, kube-ipvs0, the ipsets and \
         the rules:\n{cleaned}"
    );
    Ok(())
}
