//! The synthetic cluster the benchmarks serve: Services with their endpoints spread evenly over
//! them, each Service with one EndpointSlice it does not select itself (no selector, and the
//! slice labelled as managed by this bench, so a real kube-controller-manager leaves the slices
//! alone). B1 writes one manifest file per Service and one file of Nodes; B2 and B3 create the
//! same objects on a real API server.
//!
//! Addresses: cluster IPs from 10.96.1.0 up (Service `i` is 10.96.1.0 + i, clear of the API
//! server's own `kubernetes` Service at 10.96.0.1); endpoints from 10.128.0.0 up, numbered
//! across the whole cluster; endpoint `j` runs on node `j % nodes`.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

/// The namespace every Service lives in.
pub const NAMESPACE: &str = "bench";
const CLUSTER_IP_BASE: u32 = u32::from_be_bytes([10, 96, 1, 0]);
/// The `endpointslice.kubernetes.io/managed-by` value of the slices: not the EndpointSlice
/// controller's, so it neither adopts nor deletes them.
pub const MANAGED_BY: &str = "splitproxy-bench";
const ENDPOINT_IP_BASE: u32 = u32::from_be_bytes([10, 128, 0, 0]);
/// The endpoints' target port.
pub const ENDPOINT_PORT: u16 = 8080;

/// Checks that `changes` single-endpoint changes, each to its own Service, fit a cluster of
/// `services` Services and `endpoints` endpoints (the flags of the benchmarks that churn).
///
/// # Errors
///
/// Names the flags that do not fit together.
pub fn check_churn(services: usize, endpoints: usize, changes: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        endpoints >= services,
        "--endpoints ({endpoints}) must be at least --services ({services}): every Service needs an endpoint to churn"
    );
    anyhow::ensure!(
        changes <= services,
        "--changes ({changes}) must be at most --services ({services}): each change goes to its own Service"
    );
    Ok(())
}

/// The sizes of the cluster.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// How many Services.
    pub services: usize,
    /// How many endpoints over all Services.
    pub endpoints: usize,
    /// How many Nodes (one hollow agent each).
    pub nodes: usize,
    /// How many zones the Nodes are spread over (node `i` in zone `i % zones`), each endpoint
    /// hinted for its node's zone; 0 for no zones and no hints.
    pub zones: usize,
}

impl Shape {
    /// The name of Service `index`.
    #[must_use]
    pub fn service_name(index: usize) -> String {
        format!("svc-{index}")
    }

    /// The name of Service `index`'s EndpointSlice.
    #[must_use]
    pub fn slice_name(index: usize) -> String {
        format!("{}-bench", Self::service_name(index))
    }

    /// Sets the `ready` condition of the first endpoint in Service `index`'s slice on the real
    /// API server of `control_plane`: one endpoint change, as the churns of B2 and B3 make them.
    ///
    /// # Errors
    ///
    /// If kubectl fails.
    pub fn set_first_endpoint_ready(
        control_plane: &splitproxy_e2e::control_plane::ControlPlane,
        lab: &splitproxy_e2e::lab::Lab,
        index: usize,
        ready: bool,
    ) -> anyhow::Result<()> {
        let patch = format!(
            r#"[{{"op":"replace","path":"/endpoints/0/conditions/ready","value":{ready}}}]"#
        );
        let slice = Self::slice_name(index);
        let args = [
            "-n",
            NAMESPACE,
            "patch",
            "endpointslice",
            &slice,
            "--type=json",
            "-p",
            &patch,
        ];
        control_plane.kubectl(lab, &args)?;
        Ok(())
    }

    /// The name of node `index`.
    #[must_use]
    pub fn node_name(index: usize) -> String {
        format!("node-{index}")
    }

    /// The global numbers of Service `index`'s endpoints: the first `endpoints % services`
    /// Services get one more than the rest.
    #[must_use]
    pub fn endpoint_range(&self, index: usize) -> std::ops::Range<usize> {
        let base = self.endpoints / self.services;
        let extra = self.endpoints % self.services;
        let start = index * base + index.min(extra);
        let len = base + usize::from(index < extra);
        start..start + len
    }

    /// The cluster IP of Service `index`.
    #[must_use]
    pub fn cluster_ip(index: usize) -> Ipv4Addr {
        Ipv4Addr::from(CLUSTER_IP_BASE + u32::try_from(index).unwrap_or(u32::MAX))
    }

    /// The address of endpoint `number`.
    #[must_use]
    pub fn endpoint_ip(number: usize) -> Ipv4Addr {
        Ipv4Addr::from(ENDPOINT_IP_BASE + u32::try_from(number).unwrap_or(u32::MAX))
    }

    /// Service `index`'s file: its Service and one EndpointSlice with all its endpoints, the
    /// first of them ready unless `first_ready` is false.
    #[must_use]
    pub fn service_yaml(&self, index: usize, first_ready: bool) -> String {
        let ip = Self::cluster_ip(index);
        let mut yaml = format!(
            "{}  type: ClusterIP
  clusterIP: {ip}
  clusterIPs: [{ip}]
  ports:
  - name: http
    port: 80
    protocol: TCP
    targetPort: {ENDPOINT_PORT}
---
{}ports:
- name: http
  protocol: TCP
  port: {ENDPOINT_PORT}
endpoints:
",
            Self::service_head(index),
            Self::slice_head(index)
        );
        let range = self.endpoint_range(index);
        let first = range.start;
        for number in range {
            let ready = number != first || first_ready;
            let node = number % self.nodes;
            // Writing to a String cannot fail.
            let _ = writeln!(
                yaml,
                "- addresses: [{}]\n  conditions: {{ready: {ready}}}\n  nodeName: {}",
                Self::endpoint_ip(number),
                Self::node_name(node),
            );
            if let Some(zone) = self.zone_of(node) {
                let _ = writeln!(yaml, "  hints: {{forZones: [{{name: {zone}}}]}}");
            }
        }
        yaml
    }

    /// The head of Service `index`, up to its spec's fields: kind, name and namespace.
    #[must_use]
    pub fn service_head(index: usize) -> String {
        let name = Self::service_name(index);
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: {NAMESPACE}\nspec:\n"
        )
    }

    /// The head of Service `index`'s EndpointSlice, up to its ports: its name and labels (the
    /// Service's, and managed by this bench) and its address type.
    #[must_use]
    pub fn slice_head(index: usize) -> String {
        let (service, slice) = (Self::service_name(index), Self::slice_name(index));
        format!(
            "apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {slice}
  namespace: {NAMESPACE}
  labels:
    kubernetes.io/service-name: {service}
    endpointslice.kubernetes.io/managed-by: {MANAGED_BY}
addressType: IPv4
"
        )
    }

    /// The zone of node `index`; `None` without zones.
    #[must_use]
    pub fn zone_of(&self, index: usize) -> Option<String> {
        (self.zones > 0).then(|| format!("zone-{}", index % self.zones))
    }

    /// Every Node, in one file.
    #[must_use]
    pub fn nodes_yaml(&self) -> String {
        (0..self.nodes)
            .map(|i| {
                let labels = self.zone_of(i).map_or_else(String::new, |zone| {
                    format!("  labels:\n    topology.kubernetes.io/zone: {zone}\n")
                });
                format!(
                    "apiVersion: v1\nkind: Node\nmetadata:\n  name: {}\n{labels}---\n",
                    Self::node_name(i)
                )
            })
            .collect()
    }

    /// The file Service `index` lives in under `dir`.
    #[must_use]
    pub fn service_path(dir: &Path, index: usize) -> PathBuf {
        dir.join(format!("{}.yaml", Self::service_name(index)))
    }

    /// Writes the whole cluster into `dir`, every endpoint ready.
    ///
    /// # Errors
    ///
    /// Returns the first write that failed.
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::write(dir.join("nodes.yaml"), self.nodes_yaml())?;
        for index in 0..self.services {
            std::fs::write(
                Self::service_path(dir, index),
                self.service_yaml(index, true),
            )?;
        }
        Ok(())
    }

    /// Replaces Service `index`'s file the way `kubectl` and editors do, write aside then
    /// rename, so the controller never reads half a file.
    ///
    /// # Errors
    ///
    /// Returns the write or rename that failed.
    pub fn rewrite(&self, dir: &Path, index: usize, first_ready: bool) -> std::io::Result<()> {
        let aside = dir.join(format!(".{}.tmp", Self::service_name(index)));
        std::fs::write(&aside, self.service_yaml(index, first_ready))?;
        std::fs::rename(&aside, Self::service_path(dir, index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_spread_over_services_without_gaps_or_overlap() {
        let shape = Shape {
            services: 3,
            endpoints: 10,
            nodes: 2,
            zones: 0,
        };
        let ranges: Vec<_> = (0..3).map(|i| shape.endpoint_range(i)).collect();
        assert_eq!(ranges, vec![0..4, 4..7, 7..10]);
    }

    #[test]
    fn with_zones_nodes_are_labelled_and_endpoints_hinted_for_their_nodes_zone() {
        let shape = Shape {
            services: 1,
            endpoints: 3,
            nodes: 3,
            zones: 2,
        };
        let objects =
            splitproxy_controller::manifests::parse_documents(&shape.service_yaml(0, true))
                .expect("the generated manifest parses");
        let Some(splitproxy_controller::manifests::Object::EndpointSlice(slice)) = objects.get(1)
        else {
            panic!("the second object is the slice");
        };
        let zones: Vec<_> = slice
            .endpoints
            .iter()
            .flatten()
            .map(|e| {
                let hints = e.hints.as_ref().expect("hinted");
                let zones = hints.for_zones.as_ref().expect("for zones");
                (
                    e.node_name.clone().unwrap_or_default(),
                    zones[0].name.clone(),
                )
            })
            .collect();
        assert_eq!(
            zones,
            [
                ("node-0", "zone-0"),
                ("node-1", "zone-1"),
                ("node-2", "zone-0")
            ]
            .map(|(n, z)| (n.to_owned(), z.to_owned()))
        );
        let nodes = splitproxy_controller::manifests::parse_documents(&shape.nodes_yaml())
            .expect("the Nodes parse");
        let Some(splitproxy_controller::manifests::Object::Node(node)) = nodes.get(1) else {
            panic!("the second object is a Node");
        };
        let labels = node.metadata.labels.as_ref().expect("labelled");
        assert_eq!(labels["topology.kubernetes.io/zone"], "zone-1");
    }

    #[test]
    fn a_service_file_parses_as_the_controller_reads_it() {
        let shape = Shape {
            services: 2,
            endpoints: 3,
            nodes: 2,
            zones: 0,
        };
        let objects =
            splitproxy_controller::manifests::parse_documents(&shape.service_yaml(1, false))
                .expect("the generated manifest parses");
        assert_eq!(objects.len(), 2);
    }
}
