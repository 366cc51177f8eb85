//! A lab of network namespaces standing in for a cluster's hosts, nodes and pods, removed on drop.
//!
//! ```text
//!        host "client"        node "node1"                  node "node2"
//!        eth0 198.18.0.3      eth0 198.18.0.11              eth0 198.18.0.12
//!            |                  |      \ c3-pod-a (proxy_arp) |      \ c4-pod-b
//!            |                  |       pod-a 10.244.1.10/32  |       pod-b 10.244.2.10/32
//!     =======+==================+=====================+=======+====  br0 in namespace "lan"
//! ```
//!
//! Every host, node and pod is dual-stack: each address has the IPv6 twin
//! [`addresses`](crate::addresses) documents (`fd00:198:18::11` for `198.18.0.11`, and so on), set
//! up the same way (pods route IPv6 through the link-local gateway `fe80::ecee:eeff:feee:eeee`).
//! Duplicate address detection is off in every namespace, so IPv6 addresses work at once.
//!
//! Every host and node hangs off one bridge in the `lan` namespace. Nodes forward, route each other's
//! pod CIDRs through each other's LAN address, and route the Service CIDR out of `eth0` so that
//! connections from the node itself reach the proxy's `OUTPUT` rules. Pods are wired as Calico does:
//! a `/32` on `eth0`, a default route through the link-local gateway `169.254.1.1`, and a point-to-point
//! veth to the node (no bridge), so even pod-to-pod traffic on one node crosses the node's routing
//! and NAT. Hosts that are not nodes have only the LAN: they cannot reach pods without the proxy.
//!
//! Containment: nothing is ever created in, moved to, or routed towards the host's own namespace.
//! Veth pairs are created inside the lab's namespaces, and commands only run in namespaces this lab
//! made. Namespaces are named `sp<pid><tag>-<name>`; [`Lab::new`] removes those left behind by runs
//! whose process is gone, and dropping the lab (also while a test panics) kills every process it
//! started and deletes every namespace it made.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use anyhow::{Context, Result, anyhow, bail, ensure};

use crate::addresses::{
    CLUSTER_POD_CIDR, Ipv4Net, Ipv6Net, LAN, LAN6_PREFIX, POD_GATEWAY, POD_GATEWAY6, SERVICE_CIDR,
    SERVICE_CIDR6, lan_ip6, pod_cidr6, pod_ip6,
};

/// The MAC address of every node-side pod veth, as Calico uses; pods reach their gateway through it.
const POD_GATEWAY_MAC: &str = "ee:ee:ee:ee:ee:ee";

/// The longest interface name Linux accepts (`IFNAMSIZ - 1`).
const MAX_IFACE_NAME: usize = 15;

/// Something living in one of the lab's namespaces.
pub trait HasNamespace {
    /// The full name of the network namespace, as `ip netns` knows it.
    fn ns_name(&self) -> &str;
}

impl HasNamespace for str {
    fn ns_name(&self) -> &str {
        self
    }
}

impl HasNamespace for String {
    fn ns_name(&self) -> &str {
        self
    }
}

/// A plain host on the LAN (a control plane or an external client): no forwarding, no pod routes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    name: String,
    ns: String,
    ip: Ipv4Addr,
    ip6: Ipv6Addr,
}

impl Host {
    /// The short name given to [`Lab::add_host`].
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's LAN address.
    #[must_use]
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The host's IPv6 LAN address.
    #[must_use]
    pub fn ip6(&self) -> Ipv6Addr {
        self.ip6
    }
}

impl HasNamespace for Host {
    fn ns_name(&self) -> &str {
        &self.ns
    }
}

/// A node: a LAN host that forwards, routes the other nodes' pod CIDRs and holds its own pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    name: String,
    ns: String,
    ip: Ipv4Addr,
    ip6: Ipv6Addr,
    pod_cidr: Ipv4Net,
    pod_cidr6: Ipv6Net,
}

impl Node {
    /// The short name given to [`Lab::add_node`] (use it as the Kubernetes node name).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's LAN address.
    #[must_use]
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The node's IPv6 LAN address.
    #[must_use]
    pub fn ip6(&self) -> Ipv6Addr {
        self.ip6
    }

    /// The CIDR this node's pods are addressed from.
    #[must_use]
    pub fn pod_cidr(&self) -> Ipv4Net {
        self.pod_cidr
    }

    /// The IPv6 CIDR this node's pods are addressed from.
    #[must_use]
    pub fn pod_cidr6(&self) -> Ipv6Net {
        self.pod_cidr6
    }
}

impl HasNamespace for Node {
    fn ns_name(&self) -> &str {
        &self.ns
    }
}

/// A pod: its own namespace, one address, wired to its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pod {
    name: String,
    ns: String,
    ip: Ipv4Addr,
    ip6: Ipv6Addr,
    node: String,
}

impl Pod {
    /// The short name given to [`Lab::add_pod`].
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pod's address.
    #[must_use]
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The pod's IPv6 address.
    #[must_use]
    pub fn ip6(&self) -> Ipv6Addr {
        self.ip6
    }

    /// The short name of the node the pod runs on.
    #[must_use]
    pub fn node_name(&self) -> &str {
        &self.node
    }
}

impl HasNamespace for Pod {
    fn ns_name(&self) -> &str {
        &self.ns
    }
}

/// A process the lab started with [`Lab::spawn`]; it is killed when the lab is dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Process {
    id: usize,
    pid: u32,
    ns: String,
    log_path: PathBuf,
}

impl Process {
    /// The process id (of the program itself: `ip netns exec` replaces itself with it).
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The file holding the process's stdout and stderr (kept after the lab if a test panics).
    #[must_use]
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The log so far, or a note saying why it cannot be read; handy in failure messages.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log_path.display()))
    }

    /// The last `lines` lines of the log under a `--- <path>` heading, for failure messages.
    #[must_use]
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        let mut text = format!("--- {} (last lines)\n", self.log_path.display());
        for line in tail.into_iter().rev() {
            text.push_str(line);
            text.push('\n');
        }
        text
    }
}

impl HasNamespace for Process {
    fn ns_name(&self) -> &str {
        &self.ns
    }
}

/// A running process and its handle.
struct Running {
    handle: Process,
    child: Child,
}

/// A topology of network namespaces (LAN, hosts, nodes, pods) that removes itself on drop.
pub struct Lab {
    /// `sp<pid><tag>-`: the start of every namespace name this lab makes.
    prefix: String,
    /// The namespace holding the LAN bridge.
    lan_ns: String,
    /// Namespaces this lab created, in creation order; only these are ever deleted.
    namespaces: Vec<String>,
    /// Short names in use.
    names: BTreeSet<String>,
    /// Addresses in use (LAN and pod).
    ips: BTreeSet<Ipv4Addr>,
    nodes: Vec<Node>,
    /// Veth pairs made so far, numbering interface names.
    veths: usize,
    processes: Vec<Running>,
    /// Processes started so far, numbering handles and log files.
    spawned: usize,
    /// Holds the process logs; `None` once kept.
    logs: Option<tempfile::TempDir>,
    /// The node each pod namespace is on.
    pod_nodes: BTreeMap<String, String>,
    /// The cgroups made: nodes' ([`Lab::node_cgroup`]) by node name, namespaces'
    /// ([`Lab::namespace_cgroup`]) by namespace name.
    cgroups: BTreeMap<String, PathBuf>,
}

impl Lab {
    /// Creates an empty lab: a `lan` namespace with a bridge.
    ///
    /// `tag` (lowercase letters, may be empty) tells apart labs of one test process: tests in one
    /// binary run in parallel, so give each its own. Namespaces left by killed runs are removed first.
    ///
    /// # Errors
    ///
    /// If not running as root, if `tag` is not lowercase letters, or if `ip` fails.
    pub fn new(tag: &str) -> Result<Self> {
        ensure!(
            tag.len() <= 12 && tag.bytes().all(|b| b.is_ascii_lowercase()),
            "lab tag {tag:?} must be at most 12 lowercase letters"
        );
        require_root()?;
        remove_stale_namespaces()?;
        remove_stale_cgroups();
        let logs = tempfile::Builder::new()
            .prefix("splitproxy-lab-")
            .tempdir()
            .context("cannot create the lab's log directory")?;
        let prefix = format!("sp{}{tag}-", std::process::id());
        let mut lab = Lab {
            lan_ns: format!("{prefix}lan"),
            prefix,
            namespaces: Vec::new(),
            names: BTreeSet::new(),
            ips: BTreeSet::new(),
            nodes: Vec::new(),
            veths: 0,
            processes: Vec::new(),
            spawned: 0,
            logs: Some(logs),
            pod_nodes: BTreeMap::new(),
            cgroups: BTreeMap::new(),
        };
        // From here on, dropping `lab` on an error removes whatever was made.
        let lan = lab.add_namespace("lan")?;
        ip(&["-n", &lan, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &lan, "link", "set", "br0", "up"])?;
        Ok(lab)
    }

    /// `sp<pid><tag>-`: the start of every namespace name this lab makes, which
    /// [`Lab::new`] also removes when their process is gone.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The namespace holding the LAN bridge `br0` (for packet captures).
    #[must_use]
    pub fn lan_ns(&self) -> &str {
        &self.lan_ns
    }

    /// Every namespace this lab has made, in creation order.
    #[must_use]
    pub fn namespaces(&self) -> &[String] {
        &self.namespaces
    }

    /// The directory holding process logs.
    #[must_use]
    pub fn log_dir(&self) -> Option<&Path> {
        self.logs.as_ref().map(tempfile::TempDir::path)
    }

    /// Adds a plain host with `eth0` at `lan_ip/24` (and its IPv6 twin `/64`) on the LAN and no
    /// other routes.
    ///
    /// # Errors
    ///
    /// If the name or address is taken or invalid, or if `ip` fails.
    pub fn add_host(&mut self, name: &str, lan_ip: Ipv4Addr) -> Result<Host> {
        self.claim_lan_ip(lan_ip)?;
        let ns = self.add_namespace(name)?;
        self.attach_to_lan(&ns, name, lan_ip)?;
        Ok(Host {
            name: name.to_owned(),
            ns,
            ip: lan_ip,
            ip6: lan_ip6(lan_ip),
        })
    }

    /// Adds `count` nodes `node-1`, `node-2`, … at their addresses of the test block
    /// ([`addresses::node_ip`](crate::addresses::node_ip) and
    /// [`addresses::pod_cidr`](crate::addresses::pod_cidr)), in that order.
    ///
    /// # Errors
    ///
    /// As [`Lab::add_node`].
    pub fn add_nodes(&mut self, count: u8) -> Result<Vec<Node>> {
        (1..=count)
            .map(|n| {
                self.add_node(
                    &format!("node-{n}"),
                    crate::addresses::node_ip(n),
                    crate::addresses::pod_cidr(n),
                )
            })
            .collect()
    }

    /// Adds a node at `lan_ip/24` whose pods are addressed from `pod_cidr`.
    ///
    /// The node forwards, routes the Service CIDR out of `eth0`, and routes every other node's pod
    /// CIDR through that node (and they route its CIDR through it); the same for IPv6, with the pod
    /// CIDR `fd00:10:244:n::/64` for `pod_cidr` `10.244.n.0/24`.
    ///
    /// # Errors
    ///
    /// If the name, address or CIDR is taken or invalid, or if `ip` or `sysctl` fails.
    pub fn add_node(&mut self, name: &str, lan_ip: Ipv4Addr, pod_cidr: Ipv4Net) -> Result<Node> {
        ensure!(
            CLUSTER_POD_CIDR.contains_net(&pod_cidr),
            "pod CIDR {pod_cidr} of node {name} is outside the cluster's {CLUSTER_POD_CIDR}"
        );
        if let Some(other) = self
            .nodes
            .iter()
            .find(|n| n.pod_cidr.contains_net(&pod_cidr) || pod_cidr.contains_net(&n.pod_cidr))
        {
            bail!(
                "pod CIDR {pod_cidr} of node {name} overlaps node {}'s {}",
                other.name,
                other.pod_cidr
            );
        }
        self.claim_lan_ip(lan_ip)?;
        let ns = self.add_namespace(name)?;
        // Before any interface exists, so that interfaces inherit the defaults.
        sysctl(&ns, "net.ipv4.ip_forward", "1")?;
        sysctl(&ns, "net.ipv4.conf.all.rp_filter", "0")?;
        sysctl(&ns, "net.ipv4.conf.default.rp_filter", "0")?;
        sysctl(&ns, "net.ipv6.conf.all.forwarding", "1")?;
        self.attach_to_lan(&ns, name, lan_ip)?;
        let (lan_ip6, pod_cidr6) = (lan_ip6(lan_ip), pod_cidr6(pod_cidr.addr().octets()[2]));
        for service_cidr in [SERVICE_CIDR.to_string(), SERVICE_CIDR6.to_string()] {
            add_route(&ns, &service_cidr, &["dev", "eth0"])?;
        }
        for other in &self.nodes {
            for (theirs, ours, their_ip, our_ip) in [
                (
                    other.pod_cidr.to_string(),
                    pod_cidr.to_string(),
                    other.ip.to_string(),
                    lan_ip.to_string(),
                ),
                (
                    other.pod_cidr6.to_string(),
                    pod_cidr6.to_string(),
                    other.ip6.to_string(),
                    lan_ip6.to_string(),
                ),
            ] {
                add_route(&ns, &theirs, &["via", &their_ip])?;
                add_route(&other.ns, &ours, &["via", &our_ip])?;
            }
        }
        let node = Node {
            name: name.to_owned(),
            ns,
            ip: lan_ip,
            ip6: lan_ip6,
            pod_cidr,
            pod_cidr6,
        };
        self.nodes.push(node.clone());
        Ok(node)
    }

    /// Adds a pod at `ip` on `node`, wired as Calico does.
    ///
    /// Pod side: `eth0` with `ip/32`, `169.254.1.1 dev eth0 scope link`, default via `169.254.1.1`.
    /// Node side: a veth with `proxy_arp=1` and a `/32` route to the pod.
    /// IPv6 (the twin of `ip`): `eth0` with `ip6/128` and a default route through the node veth's
    /// link-local address; the node routes the `/128` to the veth.
    ///
    /// # Errors
    ///
    /// If `node` is not in this lab, the name or address is taken, `ip` is outside the node's pod
    /// CIDR, or if `ip` or `sysctl` fails.
    pub fn add_pod(&mut self, node: &Node, name: &str, ip_addr: Ipv4Addr) -> Result<Pod> {
        ensure!(
            self.nodes.iter().any(|n| n.ns == node.ns),
            "node {} is not part of this lab",
            node.name
        );
        ensure!(
            node.pod_cidr.contains(ip_addr),
            "pod {name} address {ip_addr} is outside node {}'s pod CIDR {}",
            node.name,
            node.pod_cidr
        );
        ensure!(
            self.ips.insert(ip_addr),
            "address {ip_addr} is already in use in the lab"
        );
        let ns = self.add_namespace(name)?;
        let node_ns = &node.ns;
        let veth = self.next_veth_name('c', name);
        ip(&[
            "-n",
            node_ns,
            "link",
            "add",
            &veth,
            "address",
            POD_GATEWAY_MAC,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &ns,
        ])?;
        sysctl(node_ns, &format!("net.ipv4.conf.{veth}.proxy_arp"), "1")?;
        sysctl(node_ns, &format!("net.ipv4.conf.{veth}.rp_filter"), "0")?;
        sysctl(node_ns, &format!("net.ipv4.neigh.{veth}.proxy_delay"), "0")?;
        ip(&["-n", node_ns, "link", "set", &veth, "up"])?;
        ip(&[
            "-n",
            node_ns,
            "route",
            "add",
            &format!("{ip_addr}/32"),
            "dev",
            &veth,
        ])?;

        let gateway = POD_GATEWAY.to_string();
        ip(&[
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{ip_addr}/32"),
            "dev",
            "eth0",
        ])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&[
            "-n", &ns, "route", "add", &gateway, "dev", "eth0", "scope", "link",
        ])?;
        ip(&[
            "-n", &ns, "route", "add", "default", "via", &gateway, "dev", "eth0",
        ])?;
        // Proxy ARP only answers for addresses the node can route elsewhere, and lab nodes have no
        // default route (nothing may leave the lab), so the gateway's neighbour entry is static.
        pin_gateway(&ns, "-4", &gateway)?;
        let ip6 = pod_ip6(ip_addr);
        add_route(node_ns, &format!("{ip6}/128"), &["dev", &veth])?;
        ip(&[
            "-n",
            &ns,
            "-6",
            "addr",
            "add",
            &format!("{ip6}/128"),
            "dev",
            "eth0",
            "nodad",
        ])?;
        let gateway6 = POD_GATEWAY6.to_string();
        // Static, like the IPv4 gateway's entry: nothing to resolve before the first packet.
        pin_gateway(&ns, "-6", &gateway6)?;
        add_route(&ns, "default", &["via", &gateway6, "dev", "eth0"])?;
        self.pod_nodes.insert(ns.clone(), node.name.clone());
        Ok(Pod {
            name: name.to_owned(),
            ns,
            ip: ip_addr,
            ip6,
            node: node.name.clone(),
        })
    }

    /// Starts `program args…` in `ns`, its stdout and stderr going to a log file; it is killed
    /// (SIGKILL) when the lab is dropped, or earlier with [`Lab::kill`].
    ///
    /// # Errors
    ///
    /// If `ns` is not one of this lab's namespaces, or the log file or process cannot be created.
    pub fn spawn(
        &mut self,
        ns: &(impl HasNamespace + ?Sized),
        program: impl AsRef<OsStr>,
        args: &[&str],
    ) -> Result<Process> {
        self.spawn_with_env(ns, program, args, &[])
    }

    /// [`Lab::spawn`] with `env` (name, value) added to the inherited environment.
    ///
    /// # Errors
    ///
    /// As [`Lab::spawn`].
    pub fn spawn_with_env(
        &mut self,
        ns: &(impl HasNamespace + ?Sized),
        program: impl AsRef<OsStr>,
        args: &[&str],
        env: &[(String, String)],
    ) -> Result<Process> {
        let ns = self.owned_ns(ns)?.to_owned();
        let program = program.as_ref();
        let id = self.spawned;
        self.spawned += 1;
        let base = Path::new(program)
            .file_name()
            .unwrap_or(program)
            .to_string_lossy();
        let short = ns.strip_prefix(&self.prefix).unwrap_or(&ns);
        let log_dir = self.log_dir().context("the lab's logs were already kept")?;
        let log_path = log_dir.join(format!("{id:02}-{short}-{base}.log"));
        let mut log = File::create(&log_path)
            .with_context(|| format!("cannot create log file {}", log_path.display()))?;
        let mut command = self.command_in(&ns, program, args);
        command.envs(env.iter().map(|(k, v)| (k, v)));
        let env_text: String = env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        writeln!(log, "$ {env_text}{}", describe(&command)).context("cannot write log header")?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("cannot share the log file")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", describe(&command)))?;
        let handle = Process {
            id,
            pid: child.id(),
            ns,
            log_path,
        };
        self.processes.push(Running {
            handle: handle.clone(),
            child,
        });
        Ok(handle)
    }

    /// How a process this lab started ended; `None` while it runs.
    ///
    /// # Errors
    ///
    /// If the process is not from this lab (or was killed through it), or cannot be polled.
    pub fn exit_status(&mut self, process: &Process) -> Result<Option<std::process::ExitStatus>> {
        let running = self
            .processes
            .iter_mut()
            .find(|r| r.handle == *process)
            .ok_or_else(|| anyhow!("process {} is not running under this lab", process.pid))?;
        running
            .child
            .try_wait()
            .with_context(|| format!("cannot poll process {}", process.pid))
    }

    /// Kills (SIGKILL) and reaps a process this lab started.
    ///
    /// # Errors
    ///
    /// If the process was already killed or is not from this lab, or the kill fails.
    pub fn kill(&mut self, process: &Process) -> Result<()> {
        let index = self
            .processes
            .iter()
            .position(|r| r.handle == *process)
            .ok_or_else(|| anyhow!("process {} is not running under this lab", process.pid))?;
        let mut running = self.processes.swap_remove(index);
        running
            .child
            .kill()
            .with_context(|| format!("cannot kill process {}", process.pid))?;
        running
            .child
            .wait()
            .with_context(|| format!("cannot reap process {}", process.pid))?;
        Ok(())
    }

    /// Runs `program args…` in `ns` to completion and returns what it printed and its status.
    ///
    /// # Errors
    ///
    /// If `ns` is not one of this lab's namespaces or the program cannot be started; a non-zero
    /// exit is not an error here (see [`Lab::exec_ok`]).
    pub fn exec(
        &self,
        ns: &(impl HasNamespace + ?Sized),
        program: impl AsRef<OsStr>,
        args: &[&str],
    ) -> Result<Output> {
        let ns = self.owned_ns(ns)?;
        let mut command = self.command_in(ns, program.as_ref(), args);
        command
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("cannot run {}", describe(&command)))
    }

    /// Like [`Lab::exec`], but a non-zero exit is an error; returns stdout.
    ///
    /// # Errors
    ///
    /// As [`Lab::exec`], and when the program exits unsuccessfully (the error holds its stderr).
    pub fn exec_ok(
        &self,
        ns: &(impl HasNamespace + ?Sized),
        program: impl AsRef<OsStr>,
        args: &[&str],
    ) -> Result<String> {
        let program = program.as_ref();
        let output = self.exec(ns, program, args)?;
        ensure!(
            output.status.success(),
            "{} {} in {} exited with {}: {}",
            program.to_string_lossy(),
            args.join(" "),
            ns.ns_name(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// A cgroup v2 folder for `node`, made on the first call: from then on every process the lab
    /// starts in the node or in its pods runs inside it, as a kubelet puts a node's pods under
    /// its own cgroup root. The ebpf mode's programs attach there, never at the machine's root,
    /// which every lab and the machine itself are under.
    ///
    /// # Errors
    ///
    /// If `node` is not in this lab, no cgroup v2 hierarchy is mounted, or the folder cannot be
    /// made.
    pub fn node_cgroup(&mut self, node: &Node) -> Result<PathBuf> {
        ensure!(
            self.nodes.iter().any(|n| n.ns == node.ns),
            "node {} is not part of this lab",
            node.name
        );
        let (name, ns) = (node.name.clone(), node.ns.clone());
        self.cgroup(&name, &ns)
    }

    /// A cgroup v2 folder for the lab namespace `ns` (one [`add_namespace`](Self::add_namespace)
    /// made), for a caller that starts its processes there itself; removed with the lab.
    ///
    /// # Errors
    ///
    /// If `ns` is not this lab's, no cgroup v2 hierarchy is mounted, or the folder cannot be made.
    pub fn namespace_cgroup(&mut self, ns: &str) -> Result<PathBuf> {
        ensure!(
            self.namespaces.iter().any(|n| n == ns),
            "namespace {ns} is not part of this lab"
        );
        self.cgroup(ns, ns)
    }

    /// The cgroup folder `folder` under the lab's cgroup v2 mount, made on the first call and
    /// kept under `key`.
    fn cgroup(&mut self, key: &str, folder: &str) -> Result<PathBuf> {
        if let Some(folder) = self.cgroups.get(key) {
            return Ok(folder.clone());
        }
        let folder = cgroup2_mount()?.join(folder);
        std::fs::create_dir_all(&folder)
            .with_context(|| format!("cannot create cgroup {}", folder.display()))?;
        self.cgroups.insert(key.to_owned(), folder.clone());
        Ok(folder)
    }

    /// `program args…` in `ns`, inside its node's cgroup when the node has one.
    fn command_in(&self, ns: &str, program: &OsStr, args: &[&str]) -> Command {
        let node = self
            .nodes
            .iter()
            .find(|node| node.ns == ns)
            .map(|node| &node.name)
            .or_else(|| self.pod_nodes.get(ns));
        match node.and_then(|node| self.cgroups.get(node)) {
            Some(cgroup) => {
                let mut words = in_cgroup(cgroup);
                let mut command = Command::new(words.remove(0));
                command
                    .args(words)
                    .args(["ip", "netns", "exec", ns])
                    .arg(program)
                    .args(args);
                command
            }
            None => netns_exec(ns, program, args),
        }
    }

    /// The namespace's name if this lab made it.
    fn owned_ns<'a>(&self, ns: &'a (impl HasNamespace + ?Sized)) -> Result<&'a str> {
        let name = ns.ns_name();
        ensure!(
            self.namespaces.iter().any(|n| n == name),
            "namespace {name:?} is not part of this lab; commands only run inside the lab"
        );
        Ok(name)
    }

    /// Adds an empty namespace `<prefix><name>` with loopback up and duplicate address detection
    /// off, deleted with the lab; returns its full name.
    ///
    /// # Errors
    ///
    /// If the name is taken or invalid, or if `ip` fails.
    pub fn add_namespace(&mut self, name: &str) -> Result<String> {
        ensure!(
            !name.is_empty()
                && name.len() <= 24
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !name.starts_with('-'),
            "lab name {name:?} must be 1 to 24 lowercase letters, digits and dashes"
        );
        ensure!(
            self.names.insert(name.to_owned()),
            "lab name {name:?} is already in use"
        );
        let ns = format!("{}{name}", self.prefix);
        ip(&["netns", "add", &ns]).with_context(|| {
            format!(
                "cannot create namespace {ns} (is another lab in this process using the same tag?)"
            )
        })?;
        self.namespaces.push(ns.clone());
        // Before any interface exists, so every IPv6 address (link-local ones too) is usable at
        // once instead of after duplicate address detection.
        sysctl(&ns, "net.ipv6.conf.all.accept_dad", "0")?;
        sysctl(&ns, "net.ipv6.conf.default.accept_dad", "0")?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Checks `lan_ip` is a free host address of the LAN, and takes it.
    fn claim_lan_ip(&mut self, lan_ip: Ipv4Addr) -> Result<()> {
        let last = lan_ip.octets()[3];
        ensure!(
            LAN.contains(lan_ip) && last != 0 && last != 255,
            "LAN address {lan_ip} is not a host address in {LAN}"
        );
        ensure!(
            self.ips.insert(lan_ip),
            "address {lan_ip} is already in use in the lab"
        );
        Ok(())
    }

    /// Connects `ns` to the LAN bridge with `eth0` at `lan_ip` and its IPv6 twin.
    fn attach_to_lan(&mut self, ns: &str, name: &str, lan_ip: Ipv4Addr) -> Result<()> {
        let lan = self.lan_ns.clone();
        let port = self.next_veth_name('l', name);
        ip(&[
            "-n", &lan, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ])?;
        ip(&["-n", &lan, "link", "set", &port, "master", "br0", "up"])?;
        let cidr = format!("{lan_ip}/{}", LAN.prefix());
        ip(&["-n", ns, "addr", "add", &cidr, "dev", "eth0"])?;
        let cidr6 = format!("{}/{LAN6_PREFIX}", lan_ip6(lan_ip));
        ip(&[
            "-n", ns, "-6", "addr", "add", &cidr6, "dev", "eth0", "nodad",
        ])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        Ok(())
    }

    /// A fresh interface name such as `l3-node1` or `c4-pod-a`, at most 15 characters.
    fn next_veth_name(&mut self, kind: char, name: &str) -> String {
        let mut iface = format!("{kind}{}-{name}", self.veths);
        self.veths += 1;
        iface.truncate(MAX_IFACE_NAME);
        iface
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for mut running in self.processes.drain(..) {
            // Kill fails only if the process was already reaped, which `wait` then reports.
            let _ = running.child.kill();
            if let Err(e) = running.child.wait() {
                eprintln!("lab: cannot reap process {}: {e}", running.handle.pid);
            }
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = delete_namespace(ns) {
                eprintln!("lab: {e:#}");
            }
        }
        for folder in self.cgroups.values() {
            if let Err(e) = remove_cgroup(folder) {
                eprintln!("lab: {e:#}");
            }
        }
        if std::thread::panicking()
            && let Some(logs) = self.logs.take()
        {
            eprintln!("lab: process logs kept in {}", logs.keep().display());
        }
    }
}

/// Fails with a clear message unless the effective user is root.
fn require_root() -> Result<()> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .context("no Uid line in /proc/self/status")?;
    ensure!(
        euid == "0",
        "network-namespace tests need root (effective uid is {euid}); run them as root, e.g. sudo -E cargo test -p splitproxy-e2e"
    );
    Ok(())
}

/// Deletes namespaces `sp<pid>…-…` whose process no longer exists, with anything still running in them.
fn remove_stale_namespaces() -> Result<()> {
    let list = ip(&["netns", "list"])
        .context("cannot list network namespaces (is iproute2 installed?)")?;
    let names = list
        .lines()
        .filter_map(|line| line.split_whitespace().next());
    for ns in names {
        let Some(pid) = lab_owner(ns) else { continue };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Another run may be removing the same namespace; its failure is not ours.
        if let Err(e) = delete_namespace(ns) {
            eprintln!("lab: cannot remove stale namespace: {e:#}");
        }
    }
    Ok(())
}

/// Removes cgroups `sp<pid>…-…` whose process no longer exists (a lab's node cgroups).
fn remove_stale_cgroups() {
    if !lab_cgroup2_mounted().unwrap_or(false) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(LAB_CGROUP2) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = lab_owner(&name.to_string_lossy()) else {
            continue;
        };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && let Err(e) = remove_cgroup(&entry.path())
        {
            eprintln!("lab: cannot remove stale cgroup: {e:#}");
        }
    }
}

/// Removes an empty cgroup folder, waiting a little for killed processes to leave it.
fn remove_cgroup(folder: &Path) -> Result<()> {
    let mut attempts = 0;
    loop {
        match std::fs::remove_dir(folder) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) if attempts < 50 => {
                attempts += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot remove cgroup {}", folder.display()));
            }
        }
    }
}

/// Where the labs mount the cgroup v2 hierarchy: outside `/sys`, which `ip netns exec` hides, so
/// that a process in a lab namespace (an agent given `--cgroup-root`) sees the node cgroups.
const LAB_CGROUP2: &str = "/run/splitproxy-lab/cgroup2";

/// Whether the labs' cgroup v2 mount is there.
fn lab_cgroup2_mounted() -> Result<bool> {
    let mounts =
        std::fs::read_to_string("/proc/self/mountinfo").context("cannot read the mount table")?;
    Ok(mounts
        .lines()
        .any(|line| line.split(' ').nth(4) == Some(LAB_CGROUP2) && line.contains(" - cgroup2 ")))
}

/// The labs' cgroup v2 mount, mounted on first use.
fn cgroup2_mount() -> Result<PathBuf> {
    if !lab_cgroup2_mounted()? {
        std::fs::create_dir_all(LAB_CGROUP2)
            .with_context(|| format!("cannot create {LAB_CGROUP2}"))?;
        let status = Command::new("mount")
            .args(["-t", "cgroup2", "none", LAB_CGROUP2])
            .status()
            .context("cannot run mount")?;
        ensure!(
            status.success(),
            "cannot mount the cgroup v2 hierarchy at {LAB_CGROUP2}"
        );
    }
    Ok(PathBuf::from(LAB_CGROUP2))
}

/// The pid in a lab namespace name `sp<pid><tag>-<name>`, or `None` if `ns` is not one.
fn lab_owner(ns: &str) -> Option<u32> {
    let rest = ns.strip_prefix("sp")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (pid, rest) = rest.split_at(digits);
    let (tag, name) = rest.split_once('-')?;
    let well_formed = tag.bytes().all(|b| b.is_ascii_lowercase()) && !name.is_empty();
    if well_formed { pid.parse().ok() } else { None }
}

/// Kills whatever still runs in `ns`, then deletes it.
fn delete_namespace(ns: &str) -> Result<()> {
    // Processes started through `ip netns exec` by something other than the lab (or orphans of a
    // killed run) would otherwise keep the namespace alive after its name is gone.
    if let Ok(pids) = ip(&["netns", "pids", ns]) {
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-KILL", pid]).output();
        }
    }
    ip(&["netns", "del", ns]).with_context(|| format!("cannot delete namespace {ns}"))?;
    Ok(())
}

/// Makes `gateway` a permanent neighbour at the node veths' MAC on the pod's `eth0`, in the
/// family `family` (`-4` or `-6`) of pod namespace `ns`.
fn pin_gateway(ns: &str, family: &str, gateway: &str) -> Result<()> {
    ip(&[
        "-n",
        ns,
        family,
        "neigh",
        "replace",
        gateway,
        "lladdr",
        POD_GATEWAY_MAC,
        "dev",
        "eth0",
        "nud",
        "permanent",
    ])?;
    Ok(())
}

/// Adds the route to `destination` in `ns`, e.g. `via 198.18.0.12` or `dev eth0`; `ip` tells the
/// family from the addresses.
fn add_route(ns: &str, destination: &str, how: &[&str]) -> Result<()> {
    let mut args = vec!["-n", ns, "route", "add", destination];
    args.extend_from_slice(how);
    ip(&args)?;
    Ok(())
}

/// Sets a sysctl inside `ns`.
fn sysctl(ns: &str, key: &str, value: &str) -> Result<()> {
    let setting = format!("{key}={value}");
    let output = netns_exec(ns, OsStr::new("sysctl"), &["-qw", &setting])
        .output()
        .context("cannot run sysctl")?;
    ensure!(
        output.status.success(),
        "sysctl {setting} in {ns} failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(())
}

/// The words of a command line that joins `cgroup` and then runs the words that follow them
/// (which may start with `ip netns exec`: the process joins the cgroup first, since
/// `ip netns exec` remounts /sys and hides the cgroup tree).
pub fn in_cgroup(cgroup: &Path) -> Vec<String> {
    ["sh", "-c", r#"echo $$ > "$0/cgroup.procs" && exec "$@""#]
        .into_iter()
        .map(str::to_owned)
        .chain([cgroup.display().to_string()])
        .collect()
}

/// `ip netns exec <ns> <program> <args…>`.
fn netns_exec(ns: &str, program: &OsStr, args: &[&str]) -> Command {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", ns]).arg(program).args(args);
    command
}

/// Runs `ip args…` and returns its stdout.
fn ip(args: &[&str]) -> Result<String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .context("cannot run ip (is iproute2 installed?)")?;
    ensure!(
        output.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// A command line for messages.
fn describe(command: &Command) -> String {
    let mut words = vec![command.get_program().to_string_lossy().into_owned()];
    words.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_namespace_names_yield_their_owner_pid() {
        assert_eq!(lab_owner("sp1234-lan"), Some(1234));
        assert_eq!(lab_owner("sp1234self-node1"), Some(1234));
        assert_eq!(lab_owner("sp1234self-pod-a"), Some(1234));
    }

    #[test]
    fn other_namespace_names_are_left_alone() {
        assert_eq!(lab_owner("spare-lan"), None);
        assert_eq!(lab_owner("sp1234"), None);
        assert_eq!(lab_owner("sp1234-"), None);
        assert_eq!(lab_owner("sp12x4-lan"), None);
        assert_eq!(lab_owner("cni-1234"), None);
    }
}
