//! A seeded random generator of Services and EndpointSlices over every feature kube-proxy
//! programs, in rounds of changes, for differential tests against upstream kube-proxy: the
//! same seed gives the same objects and the same changes.
//!
//! Services are selector-less, so their EndpointSlices are the generator's own (managed by
//! `differential-test`). One address never appears in two slices of one Service: upstream
//! settles such a conflict by Go map order in its endpoint-slice cache, which no other
//! implementation can reproduce. For the same reason no two Services share an external or
//! load-balancer IP: upstream's nftables mode keeps whichever Service it wrote last.

// `choose(…).expect("not empty")` below picks from constant, non-empty arrays: it cannot fail.
use rand::{Rng, SeedableRng, rngs::StdRng, seq::IndexedRandom};
use std::{collections::BTreeMap, fmt::Write as _};

/// The namespace every generated object lives in.
pub const NAMESPACE: &str = "diff";
/// The node whose view is compared; its zone is [`ZONES`]`[0]`.
pub const NODE: &str = "node-1";
/// The zones nodes and hints name.
pub const ZONES: [&str; 2] = ["zone-a", "zone-b"];

/// One round's changes, to apply in order: deletions, then `apply` (a multi-document YAML),
/// then the load-balancer statuses.
#[derive(Debug, Default)]
pub struct Round {
    /// Services to delete, with their EndpointSlices.
    pub deleted: Vec<String>,
    /// Services and EndpointSlices to create or update.
    pub apply: String,
    /// `(service, status patch)` for LoadBalancer Services.
    pub statuses: Vec<(String, String)>,
    /// The address of this round's marker endpoint (one per seed and round): once a proxy
    /// programs it, it has seen everything applied before it.
    pub marker: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    ClusterIp,
    NodePort,
    LoadBalancer,
    Headless,
}

#[derive(Debug, Clone)]
struct Port {
    name: String,
    protocol: &'static str,
    port: u16,
    target: u16,
}

#[derive(Debug, Clone)]
struct Endpoint {
    ip: String,
    ready: bool,
    serving: bool,
    terminating: bool,
    node: Option<&'static str>,
    zone: &'static str,
    hinted: bool,
}

#[derive(Debug, Clone)]
struct Service {
    kind: Kind,
    ports: Vec<Port>,
    affinity: Option<u32>,
    external_local: bool,
    internal_local: bool,
    external_ips: Vec<String>,
    ingress: Vec<(String, &'static str)>,
    source_ranges: Vec<&'static str>,
    other_proxy: bool,
    topology: Option<&'static str>,
    slices: [Vec<Endpoint>; 2],
}

/// The generator: its random source and the Services it has created.
#[derive(Debug)]
pub struct Generator {
    seed: u64,
    rng: StdRng,
    services: BTreeMap<String, Service>,
    next_name: usize,
    next_address: u32,
    round: u32,
}

impl Generator {
    /// A generator whose objects and changes follow from `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            rng: StdRng::seed_from_u64(seed),
            services: BTreeMap::new(),
            next_name: 0,
            next_address: 0,
            round: 0,
        }
    }

    /// The next round: `size` new Services the first time; later, about a third of the
    /// Services changed (endpoints, spec, or type by deletion and re-creation), a tenth deleted
    /// and a fifth of `size` added.
    pub fn round(&mut self, size: usize) -> Round {
        let mut round = Round::default();
        let mut touched = Vec::new();
        if self.services.is_empty() {
            for _ in 0..size {
                touched.push(self.add());
            }
        } else {
            let names: Vec<String> = self.services.keys().cloned().collect();
            for name in names {
                let roll: f64 = self.rng.random();
                if roll < 0.1 {
                    self.services.remove(&name);
                    round.deleted.push(name);
                } else if roll < 0.15 {
                    // A new type: the API server keeps type-dependent fields on update, so the
                    // Service is deleted and created again.
                    round.deleted.push(name.clone());
                    let service = self.service(&name);
                    self.services.insert(name.clone(), service);
                    touched.push(name);
                } else if roll < 0.3 {
                    let kind = self.services[&name].kind;
                    let mut service = self.service(&name);
                    service.kind = kind;
                    self.fit_to_kind(&mut service);
                    self.services.insert(name.clone(), service);
                    touched.push(name);
                } else if roll < 0.45 {
                    let slices = [self.endpoints(&name), self.endpoints(&name)];
                    let topology = self.services[&name].topology.is_some();
                    let service = self.services.get_mut(&name).expect("listed above");
                    service.slices = slices;
                    if topology {
                        hint_all(&mut service.slices, &mut self.rng);
                    }
                    touched.push(name);
                }
            }
            for _ in 0..size.div_ceil(5) {
                touched.push(self.add());
            }
        }
        for name in &touched {
            let service = &self.services[name];
            round.apply.push_str(&service_yaml(name, service));
            for (index, endpoints) in service.slices.iter().enumerate() {
                round
                    .apply
                    .push_str(&slice_yaml(name, index, &service.ports, endpoints));
            }
            if !service.ingress.is_empty() {
                round
                    .statuses
                    .push((name.clone(), status_patch(&service.ingress)));
            }
        }
        self.round += 1;
        round.marker = format!("10.255.{}.{}", self.seed % 250, self.round % 250 + 1);
        let marker_port = Port {
            name: "p0".to_owned(),
            protocol: "TCP",
            port: 80,
            target: 8080,
        };
        let marker = Service {
            kind: Kind::ClusterIp,
            ports: vec![marker_port],
            affinity: None,
            external_local: false,
            internal_local: false,
            external_ips: Vec::new(),
            ingress: Vec::new(),
            source_ranges: Vec::new(),
            other_proxy: false,
            topology: None,
            slices: [Vec::new(), Vec::new()],
        };
        round.apply.push_str(&service_yaml("marker", &marker));
        let endpoint = Endpoint {
            ip: round.marker.clone(),
            ready: true,
            serving: true,
            terminating: false,
            node: None,
            zone: ZONES[1],
            hinted: false,
        };
        round
            .apply
            .push_str(&slice_yaml("marker", 0, &marker.ports, &[endpoint]));
        round
    }

    /// How many Services the generator holds now.
    #[must_use]
    pub fn services(&self) -> usize {
        self.services.len()
    }

    fn add(&mut self) -> String {
        let name = format!("svc-{}", self.next_name);
        self.next_name += 1;
        let service = self.service(&name);
        self.services.insert(name.clone(), service);
        name
    }

    /// A random Service named `name`.
    fn service(&mut self, name: &str) -> Service {
        let kind = *[
            Kind::ClusterIp,
            Kind::ClusterIp,
            Kind::NodePort,
            Kind::LoadBalancer,
            Kind::Headless,
        ]
        .choose(&mut self.rng)
        .expect("not empty");
        let port_count = self.rng.random_range(1..=3);
        let ports = (0..port_count)
            .map(|index| Port {
                name: format!("p{index}"),
                protocol: ["TCP", "TCP", "UDP", "SCTP"]
                    .choose(&mut self.rng)
                    .expect("not empty"),
                port: 80 + u16::try_from(index).unwrap_or(0),
                target: 8080 + u16::try_from(index).unwrap_or(0),
            })
            .collect();
        let mut service = Service {
            kind,
            ports,
            affinity: self
                .rng
                .random_bool(0.2)
                .then(|| *[300, 10_800].choose(&mut self.rng).expect("not empty")),
            external_local: self.rng.random_bool(0.4),
            internal_local: self.rng.random_bool(0.2),
            external_ips: Vec::new(),
            ingress: Vec::new(),
            source_ranges: Vec::new(),
            other_proxy: self.rng.random_bool(0.05),
            topology: self.rng.random_bool(0.2).then(|| {
                *["annotation", "trafficDistribution"]
                    .choose(&mut self.rng)
                    .expect("not empty")
            }),
            slices: [self.endpoints(name), self.endpoints(name)],
        };
        if service.topology.is_some() {
            hint_all(&mut service.slices, &mut self.rng);
        }
        if self.rng.random_bool(0.2) {
            service.external_ips.push(self.address("192.0"));
        }
        self.fit_to_kind(&mut service);
        service
    }

    /// Clears or fills what `service.kind` does not allow or needs.
    fn fit_to_kind(&mut self, service: &mut Service) {
        match service.kind {
            Kind::LoadBalancer => {
                if service.ingress.is_empty() {
                    let mode = *["VIP", "VIP", "Proxy"]
                        .choose(&mut self.rng)
                        .expect("not empty");
                    service.ingress.push((self.address("203.0"), mode));
                }
                if self.rng.random_bool(0.4) {
                    let ranges = ["198.18.0.0/24", "203.0.113.0/25", "100.64.0.0/10"];
                    let count = self.rng.random_range(1..=2);
                    service.source_ranges = ranges
                        .choose_multiple(&mut self.rng, count)
                        .copied()
                        .collect();
                }
            }
            Kind::Headless => {
                service.external_ips.clear();
                service.ingress.clear();
                service.source_ranges.clear();
                service.affinity = None;
                service.external_local = false;
            }
            Kind::ClusterIp | Kind::NodePort => {
                service.ingress.clear();
                service.source_ranges.clear();
                if service.kind == Kind::ClusterIp {
                    service.external_local = false;
                }
            }
        }
    }

    /// Up to four endpoints with random conditions, nodes and zones, each address new.
    fn endpoints(&mut self, _service: &str) -> Vec<Endpoint> {
        let count = self.rng.random_range(0..=4);
        (0..count)
            .map(|_| {
                let (ready, serving, terminating) = *[
                    (true, true, false),
                    (true, true, false),
                    (false, false, false),
                    (false, true, true),
                    (false, false, true),
                ]
                .choose(&mut self.rng)
                .expect("not empty");
                Endpoint {
                    ip: self.address("10.180"),
                    ready,
                    serving,
                    terminating,
                    node: *[Some(NODE), Some("node-2"), None]
                        .choose(&mut self.rng)
                        .expect("not empty"),
                    zone: ZONES.choose(&mut self.rng).expect("not empty"),
                    hinted: false,
                }
            })
            .collect()
    }

    /// A new address under the two-octet `prefix` (`10.180`, `192.0`), used by no other
    /// object of the seed: an external or load-balancer IP two Services share (on one port) is
    /// settled by Go map order in upstream's nftables mode.
    fn address(&mut self, prefix: &str) -> String {
        self.next_address += 1;
        let n = self.next_address;
        format!("{prefix}.{}.{}", n / 250 % 250, n % 250 + 1)
    }
}

/// Hints every endpoint with its zone, or (one time in five) all but one, which makes upstream
/// ignore the hints.
fn hint_all(slices: &mut [Vec<Endpoint>; 2], rng: &mut StdRng) {
    let skip_one = rng.random_bool(0.2);
    let mut first = true;
    for endpoint in slices.iter_mut().flatten() {
        endpoint.hinted = !(skip_one && first);
        first = false;
    }
}

fn service_yaml(name: &str, service: &Service) -> String {
    let mut yaml = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\n"
    );
    if service.other_proxy {
        yaml.push_str("  labels:\n    service.kubernetes.io/service-proxy-name: other\n");
    }
    if service.topology == Some("annotation") {
        yaml.push_str("  annotations:\n    service.kubernetes.io/topology-mode: Auto\n");
    }
    let kind = match service.kind {
        Kind::ClusterIp | Kind::Headless => "ClusterIP",
        Kind::NodePort => "NodePort",
        Kind::LoadBalancer => "LoadBalancer",
    };
    let _ = writeln!(yaml, "spec:\n  type: {kind}");
    if service.kind == Kind::Headless {
        yaml.push_str("  clusterIP: None\n");
    }
    yaml.push_str("  ports:\n");
    for port in &service.ports {
        let _ = writeln!(
            yaml,
            "  - name: {}\n    protocol: {}\n    port: {}\n    targetPort: {}",
            port.name, port.protocol, port.port, port.target
        );
    }
    if let Some(timeout) = service.affinity {
        let _ = writeln!(
            yaml,
            "  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: {timeout}"
        );
    }
    if service.external_local {
        yaml.push_str("  externalTrafficPolicy: Local\n");
    }
    if service.internal_local {
        yaml.push_str("  internalTrafficPolicy: Local\n");
    }
    if service.topology == Some("trafficDistribution") {
        yaml.push_str("  trafficDistribution: PreferClose\n");
    }
    if !service.external_ips.is_empty() {
        let _ = writeln!(yaml, "  externalIPs: [{}]", service.external_ips.join(", "));
    }
    if !service.source_ranges.is_empty() {
        let _ = writeln!(
            yaml,
            "  loadBalancerSourceRanges: [{}]",
            service.source_ranges.join(", ")
        );
    }
    yaml
}

fn slice_yaml(service: &str, index: usize, ports: &[Port], endpoints: &[Endpoint]) -> String {
    let mut yaml = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {service}-{index}\n  \
         namespace: {NAMESPACE}\n  labels:\n    kubernetes.io/service-name: {service}\n    \
         endpointslice.kubernetes.io/managed-by: differential-test\naddressType: IPv4\nports:\n"
    );
    for port in ports {
        let _ = writeln!(
            yaml,
            "- name: {}\n  protocol: {}\n  port: {}",
            port.name, port.protocol, port.target
        );
    }
    if endpoints.is_empty() {
        yaml.push_str("endpoints: []\n");
        return yaml;
    }
    yaml.push_str("endpoints:\n");
    for endpoint in endpoints {
        let _ = writeln!(
            yaml,
            "- addresses: [{}]\n  conditions:\n    ready: {}\n    serving: {}\n    terminating: {}\n  zone: {}",
            endpoint.ip, endpoint.ready, endpoint.serving, endpoint.terminating, endpoint.zone
        );
        if let Some(node) = endpoint.node {
            let _ = writeln!(yaml, "  nodeName: {node}");
        }
        if endpoint.hinted {
            let _ = writeln!(
                yaml,
                "  hints:\n    forZones:\n    - name: {}",
                endpoint.zone
            );
        }
    }
    yaml
}

fn status_patch(ingress: &[(String, &str)]) -> String {
    let entries: Vec<String> = ingress
        .iter()
        .map(|(ip, mode)| format!(r#"{{"ip":"{ip}","ipMode":"{mode}"}}"#))
        .collect();
    format!(
        r#"{{"status":{{"loadBalancer":{{"ingress":[{}]}}}}}}"#,
        entries.join(",")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_rounds() {
        let (mut a, mut b) = (Generator::new(7), Generator::new(7));
        for _ in 0..4 {
            let (ra, rb) = (a.round(20), b.round(20));
            assert_eq!(
                (ra.apply, ra.deleted, ra.statuses),
                (rb.apply, rb.deleted, rb.statuses)
            );
        }
        assert_ne!(
            Generator::new(8).round(20).apply,
            Generator::new(7).round(20).apply
        );
    }

    #[test]
    fn no_address_is_in_two_slices_of_one_service() {
        let mut generator = Generator::new(1);
        for _ in 0..5 {
            generator.round(30);
            for service in generator.services.values() {
                let mut seen = std::collections::BTreeSet::new();
                for endpoint in service.slices.iter().flatten() {
                    assert!(seen.insert(endpoint.ip.clone()), "{} twice", endpoint.ip);
                }
            }
        }
    }
}
