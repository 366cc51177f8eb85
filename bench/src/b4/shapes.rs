//! The Services B4 adds beside the churned ones, in the shapes that cost a split proxy per
//! node rather than per cluster: DaemonSet-backed Services (an endpoint on every node),
//! `externalTrafficPolicy: Local` node ports, and hand-made slices whose endpoints name a
//! thousand nodes. None of them is churned; they are there for what holding them costs.
//!
//! Addresses: cluster IPs from 10.97.0.0 up, endpoints from 10.200.0.0 up, node ports from
//! 30000 up; none is used by the churned Services (`crate::cluster`).

use crate::cluster::{NAMESPACE, Shape};
use std::{fmt::Write as _, net::Ipv4Addr, path::Path};

const CLUSTER_IP_BASE: u32 = u32::from_be_bytes([10, 97, 0, 0]);
const ENDPOINT_IP_BASE: u32 = u32::from_be_bytes([10, 200, 0, 0]);
const FIRST_NODE_PORT: usize = 30_000;
/// How many `externalTrafficPolicy: Local` Services the node-port range (to 32767) has room for.
pub const MOST_LOCAL_SERVICES: usize = 32_767 - FIRST_NODE_PORT + 1;
/// The most endpoints the API server takes in one EndpointSlice.
const SLICE_ENDPOINTS: usize = 1_000;
/// The most node hints the API server takes on one endpoint.
const NODE_HINTS: usize = 8;
/// Endpoints of each `externalTrafficPolicy: Local` Service.
const LOCAL_SERVICE_ENDPOINTS: usize = 10;

/// How many Services of each shape.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Shapes {
    /// DaemonSet-backed Services, node-local DNS's shape: an endpoint on every node, two ports
    /// (DNS over UDP and TCP), `internalTrafficPolicy: Local`.
    pub daemon_sets: usize,
    /// NodePort Services with `externalTrafficPolicy: Local` and ten endpoints each.
    pub local_services: usize,
    /// Services of one full slice whose thousand endpoints each run on another node and carry
    /// node hints naming eight nodes: what one tenant can write to single out every node.
    pub hostile_slices: usize,
}

impl Shapes {
    /// How many Services they are.
    #[must_use]
    pub fn services(&self) -> usize {
        self.daemon_sets + self.local_services + self.hostile_slices
    }

    /// Writes each Service and its slices into its own file under `dir`, for the nodes of
    /// `shape`.
    ///
    /// # Errors
    ///
    /// Returns the first write that failed.
    pub fn write(&self, dir: &Path, shape: &Shape) -> std::io::Result<()> {
        let mut next = Numbers::default();
        for index in 0..self.daemon_sets {
            let name = format!("daemon-set-{index}");
            let nodes: Vec<usize> = (0..shape.nodes).collect();
            let yaml = next.service(&name, DAEMON_SET_SPEC, &DNS_PORTS, &nodes, shape, |_| {
                Vec::new()
            });
            std::fs::write(dir.join(format!("{name}.yaml")), yaml)?;
        }
        for index in 0..self.local_services {
            let name = format!("local-{index}");
            let spec = format!(
                "  type: NodePort\n  externalTrafficPolicy: Local\n  ports:\n  - name: http\n    \
                 port: 80\n    protocol: TCP\n    targetPort: 8080\n    nodePort: {}\n",
                FIRST_NODE_PORT + index
            );
            let stride = (shape.nodes / LOCAL_SERVICE_ENDPOINTS).max(1);
            let nodes: Vec<usize> = (0..LOCAL_SERVICE_ENDPOINTS)
                .map(|k| (index + k * stride) % shape.nodes)
                .collect();
            let yaml = next.service(&name, &spec, &HTTP_PORT, &nodes, shape, |_| Vec::new());
            std::fs::write(dir.join(format!("{name}.yaml")), yaml)?;
        }
        for index in 0..self.hostile_slices {
            let name = format!("hostile-{index}");
            let stride = (shape.nodes / SLICE_ENDPOINTS).max(1);
            let nodes: Vec<usize> = (0..SLICE_ENDPOINTS.min(shape.nodes))
                .map(|k| (index + k * stride) % shape.nodes)
                .collect();
            let spec = "  type: ClusterIP\n  ports:\n  - name: http\n    port: 80\n    \
                        protocol: TCP\n    targetPort: 8080\n";
            // Each endpoint hints its own node and seven more, spread past the slice's own.
            let hints = |node: usize| {
                (0..NODE_HINTS)
                    .map(|k| (node + k * (7 * stride + 1)) % shape.nodes)
                    .collect()
            };
            let yaml = next.service(&name, spec, &HTTP_PORT, &nodes, shape, hints);
            std::fs::write(dir.join(format!("{name}.yaml")), yaml)?;
        }
        Ok(())
    }
}

/// The spec of a DaemonSet-backed Service, past its cluster IP.
const DAEMON_SET_SPEC: &str = "  type: ClusterIP\n  internalTrafficPolicy: Local\n  ports:\n  - \
                               name: dns\n    port: 53\n    protocol: UDP\n    targetPort: 53\n  \
                               - name: dns-tcp\n    port: 53\n    protocol: TCP\n    \
                               targetPort: 53\n";
/// A slice port: name, protocol, port.
type SlicePort = (&'static str, &'static str, u16);
const DNS_PORTS: [SlicePort; 2] = [("dns", "UDP", 53), ("dns-tcp", "TCP", 53)];
const HTTP_PORT: [SlicePort; 1] = [("http", "TCP", 8080)];

/// The next cluster IP and endpoint address to give out.
#[derive(Debug, Default)]
struct Numbers {
    services: u32,
    endpoints: u32,
}

impl Numbers {
    /// A Service `name` with `spec` (everything past its cluster IP), and slices of at most a
    /// thousand endpoints, one on each of `nodes`, hinted for the nodes `node_hints` gives and,
    /// with zones, for its node's zone.
    fn service(
        &mut self,
        name: &str,
        spec: &str,
        ports: &[SlicePort],
        nodes: &[usize],
        shape: &Shape,
        node_hints: impl Fn(usize) -> Vec<usize>,
    ) -> String {
        let ip = Ipv4Addr::from(CLUSTER_IP_BASE + self.services);
        self.services += 1;
        let mut yaml = format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\n\
             spec:\n  clusterIP: {ip}\n  clusterIPs: [{ip}]\n{spec}"
        );
        for (slice, nodes) in nodes.chunks(SLICE_ENDPOINTS).enumerate() {
            let _ = write!(
                yaml,
                "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: \
                 {name}-{slice}\n  namespace: {NAMESPACE}\n  labels:\n    \
                 kubernetes.io/service-name: {name}\n    endpointslice.kubernetes.io/managed-by: \
                 {}\naddressType: IPv4\nports:\n",
                crate::cluster::MANAGED_BY
            );
            for (port_name, protocol, port) in ports {
                let _ = writeln!(
                    yaml,
                    "- name: {port_name}\n  protocol: {protocol}\n  port: {port}"
                );
            }
            yaml.push_str("endpoints:\n");
            for &node in nodes {
                let address = Ipv4Addr::from(ENDPOINT_IP_BASE + self.endpoints);
                self.endpoints += 1;
                let _ = writeln!(
                    yaml,
                    "- addresses: [{address}]\n  conditions: {{ready: true}}\n  nodeName: {}",
                    Shape::node_name(node)
                );
                let for_nodes: Vec<String> = node_hints(node)
                    .into_iter()
                    .map(|n| format!("{{name: {}}}", Shape::node_name(n)))
                    .collect();
                let for_zones = shape.zone_of(node).map(|zone| format!("{{name: {zone}}}"));
                if !for_nodes.is_empty() || for_zones.is_some() {
                    let _ = writeln!(
                        yaml,
                        "  hints: {{forZones: [{}], forNodes: [{}]}}",
                        for_zones.unwrap_or_default(),
                        for_nodes.join(", ")
                    );
                }
            }
        }
        yaml
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use splitproxy_controller::{
        cluster::{ClusterState, Objects, ServiceSelector},
        manifests::parse_documents,
    };

    fn state(shapes: Shapes, nodes: usize) -> ClusterState {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shape = Shape {
            services: 1,
            endpoints: 1,
            nodes,
            zones: 3,
        };
        shapes.write(dir.path(), &shape).expect("written");
        let mut documents = Vec::new();
        for entry in std::fs::read_dir(dir.path()).expect("listed") {
            let text = std::fs::read_to_string(entry.expect("an entry").path()).expect("read");
            documents.extend(parse_documents(&text).expect("parses"));
        }
        ClusterState::build(
            &Objects::from_manifests(&documents),
            &ServiceSelector::default(),
        )
    }

    #[test]
    fn each_shape_reads_as_the_controller_reads_it() {
        let shapes = Shapes {
            daemon_sets: 1,
            local_services: 2,
            hostile_slices: 1,
        };
        let state = state(shapes, 2_500);
        assert_eq!(state.services.len(), 4);
        assert!(state.invalid_services.is_empty());
        let endpoints = |name: &str| {
            let backends = &state.endpoints[&(NAMESPACE.to_owned(), name.to_owned())];
            backends
                .ports()
                .iter()
                .map(|p| p.endpoints.len())
                .collect::<Vec<_>>()
        };
        // An endpoint on every node, in three slices, behind both ports.
        assert_eq!(endpoints("daemon-set-0"), [2_500, 2_500]);
        assert_eq!(endpoints("local-1"), [LOCAL_SERVICE_ENDPOINTS]);
        let hostile = &state.endpoints[&(NAMESPACE.to_owned(), "hostile-0".to_owned())];
        let port = &hostile.ports()[0];
        assert_eq!(port.endpoints.len(), SLICE_ENDPOINTS);
        assert!(
            port.endpoints
                .iter()
                .all(|e| e.for_nodes.len() == NODE_HINTS)
        );
    }
}
