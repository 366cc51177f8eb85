//! The cluster as the controller sees it: Kubernetes objects filtered and converted the way
//! kube-proxy does, independent of any one node.

use crate::{
    cause::Cause,
    digests::SharedDigests,
    history::{ChangeSet, History, changed_keys},
    nodes::{NodeInfo, Nodes},
    placement::Placement,
    resources::{Endpoints, ServiceBackends, Services},
    wire::Encodings,
};
use imbl::OrdMap;
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use splitproxy_proto::{Key, names::is_dns_label, v1alpha1 as pb};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
};

mod build;
pub use build::Builder;

/// Label that hands a Service to another proxy; default kube-proxy ignores Services that carry it.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// Label the EndpointSlice controller sets on the slices of headless Services.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";
/// Label naming the Service an EndpointSlice belongs to.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Annotation holding the time of the change that caused the slice's last update.
pub const LAST_CHANGE_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Which Services this proxy programs, by the `service.kubernetes.io/service-proxy-name` label:
/// by default those without the label (as default kube-proxy); with a name, only those whose
/// label equals it (as kube-proxy's `serviceProxyName`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceSelector {
    /// The proxy name claimed; `None` claims unlabelled Services.
    pub service_proxy_name: Option<String>,
}

impl ServiceSelector {
    /// Whether a Service with `labels` is ours.
    #[must_use]
    pub fn claims(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let label = labels.and_then(|l| l.get(SERVICE_PROXY_NAME_LABEL));
        label == self.service_proxy_name.as_ref()
    }

    /// The same choice as an API label selector, so unclaimed Services are never even read.
    #[must_use]
    pub fn label_selector(&self) -> String {
        match &self.service_proxy_name {
            None => format!("!{SERVICE_PROXY_NAME_LABEL}"),
            Some(name) => format!("{SERVICE_PROXY_NAME_LABEL}={name}"),
        }
    }
}

/// Why an object was skipped. Each is logged once per object with its key.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Invalid {
    /// The object has no name.
    #[error("object has no name")]
    MissingName,
    /// A Service port's protocol is not TCP, UDP or SCTP.
    #[error("unknown protocol {0:?}")]
    Protocol(String),
    /// A port number is outside 1-65535.
    #[error("port {0} out of range")]
    Port(i32),
    /// A cluster IP does not parse.
    #[error("invalid cluster IP {0:?}")]
    ClusterIp(String),
    /// A Service has no ports.
    #[error("service has no ports")]
    NoPorts,
    /// A load-balancer source range is not a CIDR; the Service is skipped rather than opened to
    /// every source.
    #[error("invalid loadBalancerSourceRanges entry {0:?}")]
    SourceRange(String),
    /// The namespace, name or a port name is not a DNS label, as the API server would have
    /// refused; such a name could not be written into a kernel rule as it is.
    #[error("invalid name {0:?}: not a DNS label (at most 63 of a-z, 0-9 and -)")]
    Name(String),
    /// Two ports share a name, which would give them the same chains.
    #[error("port name {0:?} used twice")]
    DuplicatePort(String),
    /// The session affinity timeout is outside 1-86400 seconds.
    #[error("session affinity timeout {0} out of range")]
    AffinityTimeout(i32),
}

/// Kubernetes' default ClientIP affinity timeout (3 hours).
const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// Objects as read from a source, before filtering. A source updates its maps in place, object
/// by object, so a snapshot shares every part that did not change with the one before: that is
/// how [`Builder`] finds what to convert again without looking at the rest.
#[derive(Debug, Clone, Default)]
pub struct Objects {
    /// Services by namespace and name.
    pub services: OrdMap<Key, Arc<Service>>,
    /// EndpointSlices by namespace and name.
    pub slices: OrdMap<Key, Arc<EndpointSlice>>,
    /// Nodes by name.
    pub nodes: OrdMap<String, Arc<Node>>,
    /// ServiceCIDRs by name.
    pub service_cidrs: OrdMap<String, Arc<ServiceCIDR>>,
}

/// The node-independent state every view is computed from. Cloning it is cheap: the maps are
/// shared, and so is every entry that two states have in common.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// The Services kube-proxy would program, converted.
    pub services: Arc<Services>,
    /// The merged endpoints of each Service that has any usable endpoint.
    pub endpoints: Arc<Endpoints>,
    /// The known Nodes by name, with what the views need of each.
    pub nodes: Arc<Nodes>,
    /// The cluster's service CIDRs: every ServiceCIDR's `spec.cidrs`, sorted, without repeats.
    pub service_cidrs: Arc<Vec<String>>,
    /// The Services left out because they cannot be programmed (each logged once).
    pub invalid_services: BTreeSet<Key>,
    /// The change this state came from.
    pub cause: Cause,
    /// This state's generation and what changed in the states just before it.
    pub history: History,
    /// The digests of this state's entries, for the agents that resume from digests.
    pub digests: Arc<SharedDigests>,
    /// Which Services each node may see in a form of its own, for its first view.
    pub placement: Arc<Placement>,
    /// The encodings of the resources this state's revisions upsert, shared by every node's.
    pub encodings: Arc<Encodings>,
}

impl ClusterState {
    /// A state of these Services, endpoints and nodes, as the first of its history.
    #[must_use]
    pub fn of(
        services: BTreeMap<Key, pb::Service>,
        endpoints: BTreeMap<Key, ServiceBackends>,
        nodes: BTreeMap<String, NodeInfo>,
    ) -> Self {
        Self {
            services: Arc::new(
                services
                    .into_iter()
                    .map(|(k, s)| (k, Arc::new(s)))
                    .collect(),
            ),
            endpoints: Arc::new(
                endpoints
                    .into_iter()
                    .map(|(k, e)| (k, Arc::new(e)))
                    .collect(),
            ),
            nodes: Arc::new(nodes.into_iter().collect()),
            ..Self::default()
        }
        .followed_by(None)
    }

    /// This state as the successor of `previous` (`None`: as the first state), with what changed
    /// since it recorded in its history.
    #[must_use]
    pub fn followed_by(mut self, previous: Option<&Self>) -> Self {
        let (history, changes) = match previous {
            Some(previous) => (&previous.history, self.changes_since(previous)),
            None => (&History::default(), Default::default()),
        };
        self.history = history.next(changes);
        // A new state, whatever it was cloned from: its indexes are its own.
        self.digests = Arc::new(match previous {
            Some(previous) => SharedDigests::after(&previous.digests),
            None => SharedDigests::default(),
        });
        self.placement = Arc::new(match previous {
            Some(previous) => Placement::after(&previous.placement),
            None => Placement::default(),
        });
        self.encodings = Arc::default();
        self
    }

    /// The keys whose entries differ from `before` to this state. States built one from the
    /// other share the parts of their maps that did not change, which this skips: it costs in
    /// proportion to the change, not to the cluster.
    #[must_use]
    pub fn changes_since(&self, before: &Self) -> ChangeSet {
        ChangeSet {
            services: changed_keys(&before.services, &self.services),
            endpoints: changed_keys(&before.endpoints, &self.endpoints),
            nodes: changed_keys(&before.nodes, &self.nodes),
            service_cidrs: before.service_cidrs != self.service_cidrs,
        }
    }
}

impl ClusterState {
    /// Filters and converts `objects` as kube-proxy does, skipping (and logging) invalid ones and
    /// Services `selector` does not claim. A source builds each state with its [`Builder`]
    /// instead, which converts only what changed.
    #[must_use]
    pub fn build(objects: &Objects, selector: &ServiceSelector) -> Self {
        Builder::default().build(objects, selector)
    }
}

/// Converts a Service; `Ok(None)` for Services kube-proxy does not program.
pub(crate) fn convert_service(svc: &Service) -> Result<Option<pb::Service>, Invalid> {
    let meta = &svc.metadata;
    let name = meta.name.clone().ok_or(Invalid::MissingName)?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
    let Some(spec) = &svc.spec else {
        return Ok(None);
    };
    if spec.type_.as_deref() == Some("ExternalName") {
        return Ok(None);
    }
    for text in [&namespace, &name] {
        if !is_dns_label(text) {
            return Err(Invalid::Name(text.clone()));
        }
    }
    let cluster_ips: Vec<String> = match (&spec.cluster_ips, &spec.cluster_ip) {
        (Some(ips), _) if !ips.is_empty() => ips.clone(),
        (_, Some(ip)) => vec![ip.clone()],
        _ => Vec::new(),
    };
    if cluster_ips.is_empty() || cluster_ips.iter().any(|ip| ip.is_empty() || ip == "None") {
        return Ok(None);
    }
    for ip in &cluster_ips {
        ip.parse::<IpAddr>()
            .map_err(|_| Invalid::ClusterIp(ip.clone()))?;
    }
    let ports = spec
        .ports
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|p| {
            Ok(pb::ServicePort {
                name: p.name.clone().unwrap_or_default(),
                protocol: protocol(p.protocol.as_deref())? as i32,
                port: port(p.port)?,
                node_port: match p.node_port {
                    None | Some(0) => 0,
                    Some(np) => port(np)?,
                },
            })
        })
        .collect::<Result<Vec<_>, Invalid>>()?;
    if ports.is_empty() {
        return Err(Invalid::NoPorts);
    }
    let mut port_names = BTreeSet::new();
    for port in &ports {
        if !(port.name.is_empty() || is_dns_label(&port.name)) {
            return Err(Invalid::Name(port.name.clone()));
        }
        if !port_names.insert(&port.name) {
            return Err(Invalid::DuplicatePort(port.name.clone()));
        }
    }
    let load_balancer_source_ranges = spec
        .load_balancer_source_ranges
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|range| {
            let range = range.trim();
            valid_cidr(range)
                .then(|| range.to_owned())
                .ok_or_else(|| Invalid::SourceRange(range.to_owned()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let session_affinity = match spec.session_affinity.as_deref() {
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_seconds = match timeout {
                None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
                Some(t) => u32::try_from(t)
                    .ok()
                    .filter(|t| (1..=86_400).contains(t))
                    .ok_or(Invalid::AffinityTimeout(t))?,
            };
            Some(pb::SessionAffinity { timeout_seconds })
        }
        _ => None,
    };
    let load_balancer_ips: Vec<String> = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter(|ingress| ingress.ip_mode.as_deref() != Some("Proxy"))
        .filter_map(|ingress| ingress.ip.clone())
        .collect();
    Ok(Some(pb::Service {
        key: Some(pb::ObjectKey {
            namespace: namespace.clone(),
            name: name.clone(),
        }),
        cluster_ips,
        ports,
        external_ips: valid_ips(
            spec.external_ips.as_deref(),
            &namespace,
            &name,
            "externalIPs",
        ),
        load_balancer_ips: valid_ips(
            Some(&load_balancer_ips),
            &namespace,
            &name,
            "load-balancer ingress",
        ),
        load_balancer_source_ranges,
        session_affinity,
        external_traffic_policy_local: spec.external_traffic_policy.as_deref() == Some("Local"),
        internal_traffic_policy_local: spec.internal_traffic_policy.as_deref() == Some("Local"),
        health_check_node_port: match spec.health_check_node_port {
            None | Some(0) => 0,
            Some(p) => port(p)?,
        },
    }))
}

/// The entries of `ips` that are IP addresses; the others are logged and left out, as kube-proxy
/// does, so one typo does not take the whole Service down.
fn valid_ips(ips: Option<&[String]>, namespace: &str, name: &str, field: &str) -> Vec<String> {
    ips.unwrap_or_default()
        .iter()
        .filter(|ip| {
            let valid = ip.parse::<IpAddr>().is_ok();
            if !valid {
                tracing::warn!(service = %format!("{namespace}/{name}"), %field, ip = ?ip, "ignoring invalid IP");
            }
            valid
        })
        .cloned()
        .collect()
}

/// Whether `text` is `address/prefix` with a prefix that fits the address family.
fn valid_cidr(text: &str) -> bool {
    let Some((address, prefix)) = text.split_once('/') else {
        return false;
    };
    match (address.parse::<IpAddr>(), prefix.parse::<u8>()) {
        (Ok(IpAddr::V4(_)), Ok(p)) => p <= 32,
        (Ok(IpAddr::V6(_)), Ok(p)) => p <= 128,
        _ => false,
    }
}

fn protocol(name: Option<&str>) -> Result<pb::Protocol, Invalid> {
    match name.unwrap_or("TCP") {
        "TCP" => Ok(pb::Protocol::Tcp),
        "UDP" => Ok(pb::Protocol::Udp),
        "SCTP" => Ok(pb::Protocol::Sctp),
        other => Err(Invalid::Protocol(other.to_owned())),
    }
}

fn port(number: i32) -> Result<u32, Invalid> {
    u16::try_from(number)
        .ok()
        .filter(|p| *p != 0)
        .map(u32::from)
        .ok_or(Invalid::Port(number))
}

/// Merges every slice of each Service into one deduplicated set per port.
pub(crate) fn merge_slices<'a>(
    slices: impl Iterator<Item = &'a EndpointSlice>,
) -> BTreeMap<Key, ServiceBackends> {
    // (service, port name, protocol) → (address, port) → backend
    type PortMap = BTreeMap<(String, i32), BTreeMap<(String, u32), pb::Endpoint>>;
    let mut merged: BTreeMap<Key, (PortMap, Option<prost_types::Timestamp>)> = BTreeMap::new();
    for slice in slices {
        let meta = &slice.metadata;
        let labels = meta.labels.as_ref();
        let Some(service) = labels.and_then(|l| l.get(SERVICE_NAME_LABEL)) else {
            continue;
        };
        if labels.is_some_and(|l| l.contains_key(HEADLESS_LABEL))
            || !matches!(slice.address_type.as_str(), "IPv4" | "IPv6")
        {
            continue;
        }
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let slice_name = format!("{namespace}/{}", meta.name.as_deref().unwrap_or_default());
        let entry = merged.entry((namespace, service.clone())).or_default();
        let trigger = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAST_CHANGE_TRIGGER_TIME))
            .and_then(|t| parse_rfc3339(t));
        if trigger.is_some() && newer(&trigger, &entry.1) {
            entry.1 = trigger;
        }
        for slice_port in slice.ports.as_deref().unwrap_or_default() {
            let (Ok(proto), Some(Ok(number))) = (
                protocol(slice_port.protocol.as_deref()),
                slice_port.port.map(port),
            ) else {
                tracing::warn!(
                    slice = ?slice_name,
                    port = ?slice_port.port,
                    protocol = ?slice_port.protocol,
                    "ignoring slice port with an invalid number or protocol"
                );
                continue;
            };
            let by_address = entry
                .0
                .entry((slice_port.name.clone().unwrap_or_default(), proto as i32))
                .or_default();
            for ep in slice.endpoints.as_deref().unwrap_or_default() {
                let Some(address) = ep.addresses.first() else {
                    continue;
                };
                let why = match address.parse::<IpAddr>() {
                    Err(_) => "ignoring endpoint with an invalid address",
                    Ok(ip) if ip.is_ipv4() != (slice.address_type == "IPv4") => {
                        "ignoring endpoint of the other address family than the slice's"
                    }
                    Ok(_) => "",
                };
                if !why.is_empty() {
                    tracing::warn!(slice = ?slice_name, ?address, address_type = ?slice.address_type, "{why}");
                    continue;
                }
                let conditions = conditions(ep.conditions.as_ref());
                // Endpoints that are neither ready nor serving-while-terminating are never used.
                if !(conditions.ready || conditions.serving && conditions.terminating) {
                    continue;
                }
                by_address
                    .entry((address.clone(), number))
                    .or_insert_with(|| {
                        let (for_zones, for_nodes) = hints(ep.hints.as_ref());
                        pb::Endpoint {
                            address: address.clone(),
                            port: number,
                            conditions: Some(conditions),
                            node_name: ep.node_name.clone().unwrap_or_default(),
                            for_zones,
                            for_nodes,
                            ..pb::Endpoint::default()
                        }
                    });
            }
        }
    }
    merged
        .into_iter()
        .filter_map(|(key, (ports, trigger))| {
            let ports: Vec<pb::PortEndpoints> = ports
                .into_iter()
                .filter(|(_, eps)| !eps.is_empty())
                .map(|((port_name, protocol), eps)| pb::PortEndpoints {
                    port_name,
                    protocol,
                    endpoints: eps.into_values().collect(),
                })
                .collect();
            (!ports.is_empty()).then(|| {
                let backends = ServiceBackends::new(&key, ports, trigger);
                (key, backends)
            })
        })
        .collect()
}

/// An EndpointSlice endpoint's `hints`: the zones (`forZones`) and the nodes (`forNodes`) it is
/// meant for, each sorted and once.
fn hints(
    hints: Option<&k8s_openapi::api::discovery::v1::EndpointHints>,
) -> (Vec<String>, Vec<String>) {
    let names = |names: Vec<&String>| {
        let sorted: BTreeSet<&String> = names.into_iter().collect();
        sorted.into_iter().cloned().collect()
    };
    let Some(hints) = hints else {
        return (Vec::new(), Vec::new());
    };
    let zones = hints.for_zones.iter().flatten().map(|zone| &zone.name);
    let nodes = hints.for_nodes.iter().flatten().map(|node| &node.name);
    (names(zones.collect()), names(nodes.collect()))
}

/// kube-proxy's defaults: unset ready means ready; unset serving means the value of ready.
fn conditions(
    c: Option<&k8s_openapi::api::discovery::v1::EndpointConditions>,
) -> pb::EndpointConditions {
    let ready = c.and_then(|c| c.ready).unwrap_or(true);
    pb::EndpointConditions {
        ready,
        serving: c.and_then(|c| c.serving).unwrap_or(ready),
        terminating: c.and_then(|c| c.terminating).unwrap_or(false),
    }
}

fn newer(a: &Option<prost_types::Timestamp>, b: &Option<prost_types::Timestamp>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => (a.seconds, a.nanos) > (b.seconds, b.nanos),
        (Some(_), None) => true,
        _ => false,
    }
}

fn parse_rfc3339(text: &str) -> Option<prost_types::Timestamp> {
    text.parse::<prost_types::Timestamp>().ok()
}

#[cfg(test)]
mod tests;
