//! The proxies of one B3 phase, one per node namespace: upstream kube-proxies reading the API
//! server themselves, or splitproxy agents fed by splitproxy controller replicas. Also how the
//! bench checks what they programmed: the endpoint DNAT rules in each node's `nat` table.

use crate::{cluster::Shape, process, prometheus};
use anyhow::{Context as _, Result, ensure};
use serde::Serialize;
use splitproxy_e2e::{
    control_plane::{Binaries, CONTROLLER_PORT, ControlPlane},
    eventually,
    lab::{Lab, Node, Process},
};
use std::{
    collections::HashSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::Duration,
};

/// Which proxies a phase runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Upstream kube-proxy, iptables mode, one per node, each watching the API server.
    Upstream,
    /// splitproxy: controller replicas watch the API server, one agent per node follows them.
    Splitproxy,
}

/// How many splitproxy controller replicas run, as `deploy/` has them (DESIGN: 2).
pub const CONTROLLER_REPLICAS: u16 = 2;
/// Ports apart of two controller replicas on the control-plane host (each serves on `port`,
/// metrics on `port + 2`, inspection on `port + 3`).
const REPLICA_PORT_STEP: u16 = 10;

/// The running processes of one phase.
pub struct Fleet {
    /// One per node.
    proxies: Vec<Process>,
    /// splitproxy's controller replicas (none upstream) and their metrics ports.
    controllers: Vec<(Process, u16)>,
}

impl Fleet {
    /// Starts `phase`'s proxies on `nodes`; `tokens` are the agents' token files, one per node
    /// in the same order.
    ///
    /// # Errors
    ///
    /// If a process cannot start or a kubeconfig cannot be written.
    pub fn start(
        phase: Phase,
        lab: &mut Lab,
        control_plane: &ControlPlane,
        binaries: &Binaries,
        nodes: &[(Node, PathBuf)],
    ) -> Result<Self> {
        match phase {
            Phase::Upstream => {
                // The admin identity, for simplicity: what is measured is the watches and the
                // bytes, which do not depend on who the client is.
                let kubeconfig = control_plane.lan_admin_kubeconfig()?;
                let proxies = nodes
                    .iter()
                    .map(|(node, _)| start_kube_proxy(lab, binaries, &kubeconfig, node))
                    .collect::<Result<_>>()?;
                Ok(Self {
                    proxies,
                    controllers: Vec::new(),
                })
            }
            Phase::Splitproxy => {
                let mut controllers = Vec::new();
                let mut urls = Vec::new();
                for replica in 0..CONTROLLER_REPLICAS {
                    let port = CONTROLLER_PORT + replica * REPLICA_PORT_STEP;
                    let process = control_plane.start_controller_on(
                        lab,
                        &control_plane.admin_kubeconfig(),
                        port,
                    )?;
                    controllers.push((process, port + 2));
                    urls.push(control_plane.controller_url(port));
                }
                let proxies = nodes
                    .iter()
                    .map(|(node, token)| {
                        control_plane.start_agent_with_token(lab, node, &urls, token)
                    })
                    .collect::<Result<_>>()?;
                Ok(Self {
                    proxies,
                    controllers,
                })
            }
        }
    }

    /// Every process of the phase.
    fn processes(&self) -> impl Iterator<Item = &Process> {
        self.proxies
            .iter()
            .chain(self.controllers.iter().map(|(process, _)| process))
    }

    /// CPU time of every process of the phase together.
    #[must_use]
    pub fn cpu_s(&self) -> f64 {
        self.sum_of(process::cpu_time_of)
    }

    /// CPU time of the tools every process of the phase ran and waited for, together.
    #[must_use]
    pub fn tools_cpu_s(&self) -> f64 {
        self.sum_of(process::children_cpu_time_of)
    }

    /// `cpu` of every process of the phase, in seconds, summed.
    fn sum_of(&self, cpu: fn(u32) -> Option<std::time::Duration>) -> f64 {
        self.processes()
            .filter_map(|p| cpu(p.pid()))
            .map(|cpu| cpu.as_secs_f64())
            .sum()
    }

    /// Resident memory of every process of the phase together, in MiB.
    #[must_use]
    pub fn rss_mib(&self) -> f64 {
        let bytes: u64 = self
            .processes()
            .filter_map(|p| process::rss_bytes_of(p.pid()))
            .sum();
        #[allow(clippy::cast_precision_loss)] // far below 2^52
        let mib = bytes as f64 / (1024.0 * 1024.0);
        mib
    }

    /// The controllers' counter `name`, summed over the replicas; zero upstream.
    ///
    /// # Errors
    ///
    /// If a controller's metrics cannot be fetched.
    pub fn controller_counter(
        &self,
        lab: &Lab,
        control_plane: &ControlPlane,
        name: &str,
    ) -> Result<f64> {
        let mut total = 0.0;
        for (_, port) in &self.controllers {
            let text = lab.exec_ok(
                control_plane.host(),
                "curl",
                &[
                    "-sf",
                    "-m",
                    "5",
                    &format!("http://127.0.0.1:{port}/metrics"),
                ],
            )?;
            total += prometheus::sum(&text, name, &[]);
        }
        Ok(total)
    }

    /// Fails, with the log's end, if a process of the phase has exited.
    ///
    /// # Errors
    ///
    /// If one has, or cannot be polled.
    pub fn ensure_running(&self, lab: &mut Lab) -> Result<()> {
        for process in self.processes() {
            let status = lab.exit_status(process)?;
            ensure!(
                status.is_none(),
                "a proxy process exited ({status:?}):\n{}",
                process.log_tail(30)
            );
        }
        Ok(())
    }

    /// Kills every process of the phase.
    ///
    /// # Errors
    ///
    /// If one cannot be killed.
    pub fn stop(self, lab: &mut Lab) -> Result<()> {
        for process in self.processes() {
            lab.kill(process)?;
        }
        Ok(())
    }
}

/// Starts upstream kube-proxy in iptables mode on `node`. It leaves the conntrack sysctls alone
/// (`nf_conntrack_max` cannot be set from inside a network namespace); metrics and healthz stay
/// on the node's loopback, as each node has its own.
fn start_kube_proxy(
    lab: &mut Lab,
    binaries: &Binaries,
    kubeconfig: &Path,
    node: &Node,
) -> Result<Process> {
    lab.spawn(
        node,
        binaries.kubernetes.join("kube-proxy"),
        &[
            "--kubeconfig",
            &kubeconfig.to_string_lossy(),
            "--hostname-override",
            node.name(),
            "--proxy-mode",
            "iptables",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--v=1",
        ],
    )
}

/// How many of `shape`'s endpoints `save` (an `iptables-save -t nat`) routes to: jumps from a
/// Service chain (`KUBE-SVC-…`, `KUBE-SVL-…`) to an endpoint chain (`KUBE-SEP-…`) whose DNAT
/// goes to one of them. Counting the DNATs alone is not enough: kube-proxy leaves endpoint chains
/// it no longer jumps to until its next cleanup, which in a large cluster may be long after.
#[must_use]
pub fn routed_endpoints(save: &str, shape: &Shape) -> usize {
    let (first, end) = (Shape::endpoint_ip(0), Shape::endpoint_ip(shape.endpoints));
    let rules = || save.lines().filter_map(|line| line.strip_prefix("-A "));
    let ours: HashSet<&str> = rules()
        .filter_map(|rule| {
            let chain = rule.split_whitespace().next()?;
            let target = rule.split_once("-j DNAT --to-destination ")?.1;
            let ip = target.split(':').next()?.parse::<Ipv4Addr>().ok()?;
            (first <= ip && ip < end).then_some(chain)
        })
        .collect();
    rules()
        .filter(|rule| rule.starts_with("KUBE-SVC-") || rule.starts_with("KUBE-SVL-"))
        .filter_map(|rule| rule.rsplit_once("-j ").map(|(_, target)| target.trim()))
        .filter(|target| ours.contains(target))
        .count()
}

/// Waits until every node's `nat` table routes to exactly `want` of `shape`'s endpoints, checking
/// meanwhile that the fleet still runs.
///
/// # Errors
///
/// If a node does not get there within `timeout`, or a process of the fleet exited.
pub fn await_endpoints(
    lab: &mut Lab,
    fleet: Option<&Fleet>,
    nodes: &[(Node, PathBuf)],
    shape: &Shape,
    want: usize,
    timeout: Duration,
) -> Result<()> {
    for (node, _) in nodes {
        eventually(
            &format!("{} programs {want} endpoints", node.name()),
            timeout,
            || {
                if let Some(fleet) = fleet {
                    fleet.ensure_running(lab)?;
                }
                let save = lab.exec_ok(node, "iptables-save", &["-t", "nat"])?;
                let have = routed_endpoints(&save, shape);
                ensure!(have == want, "{} has {have} endpoints", node.name());
                Ok(())
            },
        )
        .with_context(|| match fleet {
            Some(fleet) => fleet.logs(),
            None => String::new(),
        })?;
    }
    Ok(())
}

impl Fleet {
    /// The last log lines of the controllers and the first proxy, for failure messages.
    fn logs(&self) -> String {
        self.controllers
            .iter()
            .map(|(process, _)| process)
            .chain(self.proxies.first())
            .map(|process| process.log_tail(30))
            .collect()
    }
}

/// Empties the `nat`, `filter` and `mangle` tables of both families on every node, so the next
/// phase's proxies start from a clean node and cannot pass the checks on rules left behind.
///
/// # Errors
///
/// If a restore fails.
pub fn clean_nodes(lab: &Lab, nodes: &[(Node, PathBuf)]) -> Result<()> {
    // A restore without --noflush flushes each named table and deletes its own chains.
    let empty = r"printf '*nat\nCOMMIT\n*filter\nCOMMIT\n*mangle\nCOMMIT\n'";
    let script = format!("{empty} | iptables-restore && {empty} | ip6tables-restore");
    for (node, _) in nodes {
        lab.exec_ok(node, "sh", &["-c", &script])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_endpoints_a_service_chain_jumps_to_count() {
        let shape = Shape {
            services: 2,
            endpoints: 3,
            nodes: 1,
            zones: 0,
        };
        let save = "*nat
:KUBE-SEP-A - [0:0]
-A KUBE-SVC-0 -m comment --comment \"bench/svc-0:http -> 10.128.0.0:8080\" -m statistic --mode random --probability 0.5 -j KUBE-SEP-A
-A KUBE-SVC-0 -m comment --comment \"bench/svc-0:http -> 10.128.0.1:8080\" -j KUBE-SEP-B
-A KUBE-SVC-1 -j KUBE-SEP-D
-A KUBE-SVC-K -j KUBE-SEP-K
-A KUBE-SEP-A -s 10.128.0.0/32 -m comment --comment \"bench/svc-0:http\" -j KUBE-MARK-MASQ
-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.128.0.0:8080
-A KUBE-SEP-B -p tcp -m tcp -j DNAT --to-destination 10.128.0.1:8080
-A KUBE-SEP-C -p tcp -m tcp -j DNAT --to-destination 10.128.0.2:8080
-A KUBE-SEP-D -p tcp -m tcp -j DNAT --to-destination 10.128.0.3:8080
-A KUBE-SEP-K -p tcp -m tcp -j DNAT --to-destination 198.18.0.2:6443
COMMIT
";
        // C is left behind unreferenced; D (10.128.0.3) is beyond the shape's three endpoints;
        // K is the API server's own Service.
        assert_eq!(routed_endpoints(save, &shape), 2);
    }
}
