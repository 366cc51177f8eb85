//! A proxy under measurement in a lab node (splitproxy's agent or upstream kube-proxy), what its
//! rules hold, and the cluster it is fed: what B2 and B5 share.

use crate::{cluster::NAMESPACE, prometheus::Histogram};
use anyhow::{Context as _, Result, ensure};
use aya::maps::{HashMap, Map, MapData};
use serde::Serialize;
use splitproxy_dataplane::ebpf::{
    kernel,
    layout::{self, Scope, SlotKey, SlotValue},
};
use splitproxy_dataplane::iptables::save;
use splitproxy_e2e::{
    bpffs::BpfFs,
    control_plane::ControlPlane,
    eventually,
    lab::{Lab, Node, Process},
};
use std::{
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

/// Every sync, full or partial (kube-proxy's name, which the agent exports too).
pub const SYNCS: &str = "kubeproxy_sync_proxy_rules_duration_seconds";
/// Parallel `kubectl create` runs that populate the cluster.
const POPULATE_WORKERS: usize = 4;
/// Services per `kubectl create` run.
const POPULATE_CHUNK: usize = 1_000;
/// Besides the benchmark's, the API server's own `kubernetes` Service (one endpoint) is proxied.
pub const OWN_SERVICES: usize = 1;
/// The agent's name in results.
pub const SPLITPROXY: &str = "splitproxy";
/// Upstream kube-proxy's name in results.
pub const KUBE_PROXY: &str = "kube-proxy";
/// The host's default iptables (what the proxies use unless a bench picks a backend).
const IPTABLES_SAVE: &str = "iptables-save";

/// A dataplane backend both proxies offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// iptables, programmed with iptables-restore.
    Iptables,
    /// nftables, programmed with `nft -f -`.
    Nftables,
    /// splitproxy's socket programs and their map (kube-proxy has no such mode: beside it, it
    /// runs [`kube_proxy`](Self::kube_proxy)'s).
    Ebpf,
}

impl ProxyMode {
    /// The value of both proxies' `--proxy-mode`.
    pub fn flag(self) -> &'static str {
        match self {
            Self::Iptables => "iptables",
            Self::Nftables => "nftables",
            Self::Ebpf => "ebpf",
        }
    }

    /// The mode kube-proxy runs beside splitproxy in this mode: the same one, or nftables,
    /// upstream's fastest at every size (B2, B5), beside the ebpf mode upstream lacks.
    #[must_use]
    pub fn kube_proxy(self) -> Self {
        match self {
            Self::Ebpf => Self::Nftables,
            mode => mode,
        }
    }
}

/// What a proxy's nat table routes to, next to what the cluster asks for. Endpoints are counted
/// as the jumps from Service chains to endpoint chains, not as endpoint chains: in large clusters
/// kube-proxy leaves unused endpoint chains behind until a later full sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Programmed {
    /// Service chains (`KUBE-SVC-…`) found.
    pub service_chains: usize,
    /// Service chains expected: every Service, all of which have ready endpoints.
    pub expected_service_chains: usize,
    /// Jumps from a Service chain to an endpoint chain (`KUBE-SEP-…`) found.
    pub endpoint_jumps: usize,
    /// Jumps expected: one per ready endpoint.
    pub expected_endpoint_jumps: usize,
}

/// What a proxy's rules should hold: Service chains and jumps to endpoints.
#[derive(Debug, Clone, Copy)]
pub struct Wanted {
    /// Service chains: one per Service port with endpoints.
    pub service_chains: usize,
    /// Jumps to endpoints: one per ready endpoint of each Service port.
    pub endpoint_jumps: usize,
    /// In ebpf mode, the headers of node ports on the node's addresses, beside those of the
    /// cluster IPs (the other modes' node-port rules are not counted).
    pub node_port_headers: usize,
    /// In ebpf mode, the endpoint slots of those node ports.
    pub node_port_endpoints: usize,
}

impl Programmed {
    /// The Service chains and their endpoints in `listing` (what [`ProxyMode::listing`]
    /// prints), next to `wanted`: in iptables mode the jumps from `KUBE-SVC-` to `KUBE-SEP-`
    /// chains, in nftables mode the `service-` chains and the endpoints of their
    /// `numgen random mod N` choices (kube-proxy's inline maps, splitproxy's ranges of its
    /// endpoint maps), in ebpf mode the services map's headers and endpoint slots
    /// ([`ebpf_listing`]).
    pub fn count(listing: &str, wanted: Wanted, mode: ProxyMode) -> Self {
        let (service_chains, endpoint_jumps) = match mode {
            ProxyMode::Iptables => {
                let service = |chain: &str| chain.starts_with("KUBE-SVC-");
                let endpoint = |chain: &str| chain.starts_with("KUBE-SEP-");
                (
                    save::chains(listing, "nat")
                        .iter()
                        .filter(|c| service(c))
                        .count(),
                    save::jumps(listing, "nat", service, endpoint).len(),
                )
            }
            ProxyMode::Nftables => (
                // A Service port's chain names it (`service-HASH-ns/name/proto/port`); the fixed
                // `service-endpoints-check` does not.
                listing
                    .lines()
                    .map(str::trim_start)
                    .filter(|line| line.starts_with("chain service-") && line.contains('/'))
                    .count(),
                // In rules only: splitproxy's endpoint maps are typed `typeof numgen random mod 1`.
                listing
                    .lines()
                    .filter(|line| !line.trim_start().starts_with("typeof "))
                    .flat_map(|line| line.split("numgen random mod ").skip(1))
                    .filter_map(|rest| rest.split_whitespace().next()?.parse::<usize>().ok())
                    .sum(),
            ),
            ProxyMode::Ebpf => {
                let kind = |kind: &str| {
                    listing
                        .lines()
                        .filter(|line| line.split(' ').next() == Some(kind))
                        .count()
                };
                // A header without endpoints (a node port on an address of the other
                // family, say) refuses: like a Service chain, only one with endpoints counts.
                let empty = listing
                    .lines()
                    .filter(|line| line.starts_with(EBPF_HEADER) && line.ends_with(" count=0"))
                    .count();
                (kind(EBPF_HEADER) - empty, kind(EBPF_ENDPOINT))
            }
        };
        let (node_port_headers, node_port_endpoints) = match mode {
            ProxyMode::Ebpf => (wanted.node_port_headers, wanted.node_port_endpoints),
            ProxyMode::Iptables | ProxyMode::Nftables => (0, 0),
        };
        Self {
            service_chains,
            expected_service_chains: wanted.service_chains + node_port_headers,
            endpoint_jumps,
            expected_endpoint_jumps: wanted.endpoint_jumps + node_port_endpoints,
        }
    }

    /// Whether the counts match.
    #[must_use]
    pub fn matches(&self) -> bool {
        self.service_chains == self.expected_service_chains
            && self.endpoint_jumps == self.expected_endpoint_jumps
    }
}

/// One proxy under measurement: which, where, its process and its mode.
pub struct Proxy {
    /// Its name in results (`splitproxy`, `kube-proxy`).
    pub name: &'static str,
    /// The node it programs.
    pub node: Node,
    /// Its process.
    pub process: Process,
    /// The mode it runs.
    pub mode: ProxyMode,
    /// The `iptables-save` of the iptables backend it uses (`iptables-save` is the host's
    /// default, `iptables-legacy-save` the legacy one).
    pub iptables_save: &'static str,
    /// In ebpf mode, the BPF filesystem holding its pins (unmounted with the proxy).
    pins: Option<BpfFs>,
}

impl Proxy {
    /// Starts splitproxy's agent on `node` in `mode`, with `extra` flags and `env`. In ebpf
    /// mode the node gets a lab cgroup, which its processes and pods join and the programs
    /// attach to, and a BPF filesystem for the pins.
    ///
    /// # Errors
    ///
    /// If the cgroup or filesystem cannot be made or the agent cannot start.
    pub fn start_splitproxy(
        lab: &mut Lab,
        control_plane: &ControlPlane,
        node: &Node,
        mode: ProxyMode,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Self> {
        let mut flags: Vec<String> = vec!["--proxy-mode".into(), mode.flag().into()];
        let pins = if mode == ProxyMode::Ebpf {
            let cgroup = lab.node_cgroup(node)?;
            let pins = BpfFs::mount()?;
            flags.extend([
                "--bpf-root".into(),
                pins.path().to_string_lossy().into_owned(),
                "--cgroup-root".into(),
                cgroup.to_string_lossy().into_owned(),
            ]);
            Some(pins)
        } else {
            None
        };
        let mut flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        flags.extend_from_slice(extra);
        Ok(Self {
            name: SPLITPROXY,
            node: node.clone(),
            process: control_plane.start_agent_with_env(lab, node, &flags, env)?,
            mode,
            iptables_save: IPTABLES_SAVE,
            pins,
        })
    }

    /// Starts upstream kube-proxy on `node` in the mode it runs beside splitproxy's `mode`
    /// ([`ProxyMode::kube_proxy`]), with `extra` flags and `env`.
    ///
    /// # Errors
    ///
    /// If kube-proxy cannot start.
    pub fn start_kube_proxy(
        lab: &mut Lab,
        control_plane: &ControlPlane,
        node: &Node,
        mode: ProxyMode,
        extra: &[&str],
        env: &[(String, String)],
    ) -> Result<Self> {
        let mode = mode.kube_proxy();
        Ok(Self {
            name: KUBE_PROXY,
            node: node.clone(),
            process: control_plane.start_kube_proxy_with(lab, node, mode.flag(), extra, env)?,
            mode,
            iptables_save: IPTABLES_SAVE,
            pins: None,
        })
    }

    /// The same proxy listing its iptables rules with `iptables_save` (its backend's).
    #[must_use]
    pub fn listed_by(self, iptables_save: &'static str) -> Self {
        Self {
            iptables_save,
            ..self
        }
    }

    /// The proxy's `/metrics` (Prometheus text).
    pub fn metrics(&self, lab: &Lab) -> Result<String> {
        lab.exec_ok(
            &self.node,
            "curl",
            &["-sf", "-m", "10", "http://127.0.0.1:10249/metrics"],
        )
        .with_context(|| format!("scraping {}", self.name))
    }

    /// Its sync histogram (every sync, full or partial, since it started). kube-proxy runs a
    /// proxier per IP family, each observing its own syncs, so its series add up; the agent's
    /// sync writes every family and is observed once under each family's label
    /// (docs/kube-proxy-compatibility.md), so one family's series holds every sync, whole.
    pub fn syncs(&self, lab: &Lab) -> Result<Histogram> {
        let text = self.metrics(lab)?;
        Ok(if self.name == SPLITPROXY {
            Histogram::parse_series(&text, SYNCS, &[("ip_family", "IPv4")])
        } else {
            Histogram::parse(&text, SYNCS)
        })
    }

    /// Waits until the proxy, just started, has synced and its rules hold `wanted`; returns
    /// its sync histogram then (every sync since it started).
    pub fn await_full_sync(
        &self,
        lab: &Lab,
        wanted: Wanted,
        timeout: Duration,
    ) -> Result<Histogram> {
        let what = format!("{} programs the populated cluster", self.name);
        eventually(&what, timeout, || {
            let full = self.syncs(lab)?;
            ensure!(full.count > 0.0, "no sync yet");
            let found = Programmed::count(&self.save(lab)?, wanted, self.mode);
            ensure!(found.matches(), "found {found:?}");
            Ok(full)
        })
        .with_context(|| self.process.log_tail(20))
    }

    /// The proxy's rules, as its mode lists them.
    pub fn save(&self, lab: &Lab) -> Result<String> {
        match (self.mode, &self.pins) {
            (ProxyMode::Iptables, _) => lab.exec_ok(&self.node, self.iptables_save, &[]),
            (ProxyMode::Nftables, _) => {
                lab.exec_ok(&self.node, "nft", &["list", "table", "ip", "kube-proxy"])
            }
            (ProxyMode::Ebpf, Some(pins)) => ebpf_listing(pins.path()),
            (ProxyMode::Ebpf, None) => anyhow::bail!("{} in ebpf mode has no pins", self.name),
        }
    }

    /// How many rules `listing` holds (in ebpf mode, map entries).
    pub fn rules(&self, listing: &str) -> usize {
        match self.mode {
            ProxyMode::Iptables => listing.lines().filter(|l| l.starts_with("-A ")).count(),
            ProxyMode::Nftables => nft_rules(listing),
            ProxyMode::Ebpf => listing.lines().count(),
        }
    }
}

/// An ebpf listing's line for a Service port's header (slot 0).
const EBPF_HEADER: &str = "header";
/// An ebpf listing's line for an endpoint slot.
const EBPF_ENDPOINT: &str = "endpoint";

/// The entries of the services map pinned under the BPF filesystem `bpf_root`, read from the
/// kernel, one line each: `header ADDRESS PORT PROTOCOL count=N` or
/// `endpoint ADDRESS PORT PROTOCOL slot=N ENDPOINT`, prefixed `outside-` for the entries
/// serving traffic from outside the node (the node's own are what the benchmarks count),
/// sorted.
///
/// # Errors
///
/// If the pinned map cannot be opened or read.
pub fn ebpf_listing(bpf_root: &Path) -> Result<String> {
    let pin = kernel::map_pins(bpf_root).join(layout::SERVICES_MAP);
    let data = MapData::from_pin(&pin).with_context(|| format!("opening {}", pin.display()))?;
    let map: HashMap<MapData, [u8; layout::KEY_LEN], [u8; layout::VALUE_LEN]> =
        HashMap::try_from(Map::from_map_data(data)?)?;
    let mut lines = Vec::new();
    for entry in map.iter() {
        let (key, value) = entry.with_context(|| format!("reading {}", pin.display()))?;
        let Some(key) = SlotKey::from_bytes(key) else {
            continue;
        };
        let service = format!("{} {} {:?}", key.address, key.port, key.protocol);
        let scope = match key.scope {
            Scope::Node => "",
            Scope::Outside => "outside-",
        };
        lines.push(match SlotValue::from_bytes(key, value) {
            SlotValue::Header { count, .. } => {
                format!("{scope}{EBPF_HEADER} {service} count={count}")
            }
            SlotValue::Endpoint(endpoint) => {
                format!(
                    "{scope}{EBPF_ENDPOINT} {service} slot={} {endpoint}",
                    key.slot
                )
            }
        });
    }
    lines.sort_unstable();
    Ok(lines.iter().map(|line| format!("{line}\n")).collect())
}

/// The rules in the chains of an `nft list table` listing: every line inside a `chain … {`
/// block but the chain's own `type …`, `policy …` and `comment …` lines.
pub fn nft_rules(listing: &str) -> usize {
    let mut in_chain = false;
    let mut rules = 0;
    for line in listing.lines().map(str::trim) {
        if line.starts_with("chain ") && line.ends_with('{') {
            in_chain = true;
        } else if line == "}" {
            in_chain = false;
        } else if in_chain
            && !line.is_empty()
            && !["type ", "policy ", "comment "]
                .iter()
                .any(|start| line.starts_with(start))
        {
            rules += 1;
        }
    }
    rules
}

/// Creates namespace `bench`, then Services `0..services` with their EndpointSlices (the YAML
/// `objects` writes for each index) with a few `kubectl create` runs in parallel, each from a
/// multi-document file of [`POPULATE_CHUNK`] Services. Says how far it got at every tenth (or
/// every chunk per worker), with the rate since the last report: the API server's create rate
/// falls as the cluster grows.
///
/// # Errors
///
/// If a file cannot be written or kubectl fails.
pub fn populate(
    lab: &Lab,
    control_plane: &ControlPlane,
    services: usize,
    objects: impl Fn(usize) -> String + Sync,
) -> Result<()> {
    control_plane.create_namespace(lab, NAMESPACE)?;
    let dir = tempfile::tempdir().context("creating the populate directory")?;
    let chunks: Vec<std::ops::Range<usize>> = (0..services)
        .step_by(POPULATE_CHUNK)
        .map(|start| start..(start + POPULATE_CHUNK).min(services))
        .collect();
    let next = AtomicUsize::new(0);
    let progress = std::sync::Mutex::new(Progress::new(services));
    let worker = || -> Result<()> {
        loop {
            let index = next.fetch_add(1, Ordering::Relaxed);
            let Some(chunk) = chunks.get(index) else {
                return Ok(());
            };
            let yaml: Vec<String> = chunk.clone().map(&objects).collect();
            let file = dir.path().join(format!("services-{index}.yaml"));
            std::fs::write(&file, yaml.join("---\n")).context("writing the objects to create")?;
            create(lab, control_plane, &file)?;
            std::fs::remove_file(&file).context("removing a created file")?;
            progress
                .lock()
                .map_err(|_| anyhow::anyhow!("a populate worker panicked"))?
                .add(chunk.len());
        }
    };
    std::thread::scope(|scope| {
        let runs: Vec<_> = (0..POPULATE_WORKERS).map(|_| scope.spawn(worker)).collect();
        runs.into_iter().try_for_each(|run| {
            run.join()
                .map_err(|_| anyhow::anyhow!("a kubectl run panicked"))?
        })
    })
}

/// How far populating got, reported at every tenth or chunk per worker, whichever is more.
struct Progress {
    total: usize,
    done: usize,
    started: Instant,
    /// Services created and the time at the last report.
    reported: (usize, Instant),
}

impl Progress {
    fn new(total: usize) -> Self {
        let now = Instant::now();
        Self {
            total,
            done: 0,
            started: now,
            reported: (0, now),
        }
    }

    fn add(&mut self, created: usize) {
        self.done += created;
        // A tenth, but at least a chunk per worker: chunks taken together end together.
        let step = self
            .total
            .div_ceil(10)
            .max(POPULATE_WORKERS * POPULATE_CHUNK);
        if self.done / step == self.reported.0 / step && self.done < self.total {
            return;
        }
        let (before, at) = self.reported;
        let rate = (self.done - before) as f64 / at.elapsed().as_secs_f64().max(1e-3);
        eprintln!(
            "populate: {} of {} Services in {:.0} s ({rate:.0} Services/s since {before})",
            self.done,
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        self.reported = (self.done, Instant::now());
    }
}

fn create(lab: &Lab, control_plane: &ControlPlane, file: &Path) -> Result<()> {
    let file = file.to_string_lossy();
    control_plane.kubectl(
        lab,
        &["create", "--validate=false", "-o", "name", "-f", &file],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trimmed `iptables-save` of one Service with two endpoints and a leftover endpoint
    /// chain nothing jumps to, as kube-proxy keeps in large clusters.
    const SAVED: &str = "\
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-1111111111111111 - [0:0]
:KUBE-SEP-2222222222222222 - [0:0]
:KUBE-SEP-3333333333333333 - [0:0]
-A KUBE-SERVICES -d 10.96.1.0/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-1111111111111111
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-2222222222222222
COMMIT
";

    #[test]
    fn endpoints_count_as_jumps_from_service_chains_not_as_chains() {
        let wanted = Wanted {
            service_chains: 1,
            endpoint_jumps: 2,
            node_port_headers: 0,
            node_port_endpoints: 0,
        };
        let found = Programmed::count(SAVED, wanted, ProxyMode::Iptables);
        assert_eq!((found.service_chains, found.endpoint_jumps), (1, 2));
        assert!(found.matches());
        let more = Wanted {
            endpoint_jumps: 3,
            ..wanted
        };
        assert!(!Programmed::count(SAVED, more, ProxyMode::Iptables).matches());
    }

    /// A trimmed `nft list table ip kube-proxy` of one Service with two endpoints.
    const LISTED: &str = "\
table ip kube-proxy {
\tcomment \"rules for kube-proxy\"
\tmap service-ips {
\t\ttype ipv4_addr . inet_proto . inet_service : verdict
\t\telements = { 10.96.1.0 . tcp . 80 : goto service-AAAAAAAA-bench/s0/tcp/http }
\t}
\tchain nat-prerouting {
\t\ttype nat hook prerouting priority dstnat; policy accept;
\t\tjump services
\t}
\tchain services {
\t\tip daddr . meta l4proto . th dport vmap @service-ips
\t}
\tchain service-endpoints-check {
\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services
\t}
\tchain service-AAAAAAAA-bench/s0/tcp/http {
\t\tip daddr 10.96.1.0 tcp dport 80 ip saddr != 10.244.0.0/16 mark set mark or 0x4000
\t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.2 . 8080, 1 : 10.244.2.2 . 8080 }
\t}
}
";

    /// The same Service as splitproxy lists it, its endpoints in an endpoint map.
    const LISTED_WITH_ENDPOINT_MAP: &str = "\
table ip kube-proxy {
\tmap endpoints-tcp-AA {
\t\ttypeof numgen random mod 1 : ip daddr . tcp dport
\t\telements = { 4 : 10.244.1.2 . 8080, 5 : 10.244.2.2 . 8080 }
\t}
\tchain service-AAAAAAAA-bench/s0/tcp/http {
\t\tmeta l4proto tcp dnat ip to numgen random mod 2 offset 4 map @endpoints-tcp-AA
\t}
}
";

    #[test]
    fn in_nftables_mode_endpoints_are_the_numgen_choices_of_service_chains() {
        let wanted = Wanted {
            service_chains: 1,
            endpoint_jumps: 2,
            node_port_headers: 0,
            node_port_endpoints: 0,
        };
        let found = Programmed::count(LISTED, wanted, ProxyMode::Nftables);
        assert_eq!((found.service_chains, found.endpoint_jumps), (1, 2));
        assert!(found.matches());
        let found = Programmed::count(LISTED_WITH_ENDPOINT_MAP, wanted, ProxyMode::Nftables);
        assert_eq!((found.service_chains, found.endpoint_jumps), (1, 2));
        assert_eq!(
            nft_rules(LISTED),
            5,
            "the chains' rules, not their type lines"
        );
    }

    #[test]
    fn in_ebpf_mode_node_ports_add_headers_and_slots_the_other_modes_do_not_count() {
        let listing = "\
endpoint 10.96.1.0 80 Tcp slot=1 10.244.1.2:8080
endpoint 192.168.1.2 30000 Tcp slot=1 10.244.1.2:8080
header 10.96.1.0 80 Tcp count=1
header 192.168.1.2 30000 Tcp count=1
header fd00::2 30000 Tcp count=0
outside-endpoint 192.168.1.2 30000 Tcp slot=1 10.244.1.2:8080
outside-header 192.168.1.2 30000 Tcp count=1
";
        let wanted = Wanted {
            service_chains: 1,
            endpoint_jumps: 1,
            node_port_headers: 1,
            node_port_endpoints: 1,
        };
        let found = Programmed::count(listing, wanted, ProxyMode::Ebpf);
        assert_eq!((found.service_chains, found.endpoint_jumps), (2, 2));
        assert!(found.matches());
        let without = Wanted {
            node_port_headers: 0,
            node_port_endpoints: 0,
            ..wanted
        };
        assert!(!Programmed::count(listing, without, ProxyMode::Ebpf).matches());
        assert_eq!(
            Programmed::count(SAVED, wanted, ProxyMode::Iptables).expected_service_chains,
            1
        );
    }
}
