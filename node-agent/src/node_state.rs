//! The node's state as the controller described it: complete revisions applied on top of each
//! other, and the conversion of that state into the dataplane model.

use imbl::OrdMap;
use splitproxy_dataplane::{self as dp, ProxyState};
use splitproxy_proto::{Key, names::is_dns_label, topology::Place, v1alpha1 as pb};
use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::Arc,
    time::Duration,
};

/// Why a revision cannot be taken; the agent rejects it and keeps its last good state.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Rejected {
    /// A delta arrived while the agent holds no state, or one built on another controller's state.
    #[error("delta from epoch {got:?} does not build on the applied state (epoch {held:?})")]
    NotOnAppliedState {
        /// The epoch of the delta.
        got: String,
        /// The epoch of the state held, if any.
        held: Option<String>,
    },
    /// A resource arrived without its key.
    #[error("resource without a key")]
    MissingKey,
    /// The revision number is zero, which the protocol never sends.
    #[error("revision 0")]
    RevisionZero,
    /// A part of a revision names the same resource twice in one list (protocol rule 8).
    #[error("{list} names {key} twice")]
    DuplicateKey {
        /// Which list of the revision.
        list: &'static str,
        /// The key, `namespace/name`.
        key: String,
    },
    /// A revision names buckets to replace where the protocol allows none, or badly (rule 11).
    #[error("replaced buckets {0}")]
    ReplacedBuckets(&'static str),
    /// A piece of an endpoint set continues no set upserted earlier in the revision (rule 14).
    #[error("a piece of the endpoints of {0} continues no set the revision upserted")]
    PieceWithoutSet(String),
}

/// Why one Service cannot be programmed. The Service is skipped; the others are programmed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum InvalidService {
    /// A cluster IP does not parse.
    #[error("invalid cluster IP {0:?}")]
    ClusterIp(String),
    /// A port is zero or above 65535.
    #[error("port {0} out of range")]
    Port(u32),
    /// A protocol is unspecified or unknown.
    #[error("unknown protocol {0}")]
    Protocol(i32),
    /// An endpoint address does not parse.
    #[error("invalid endpoint address {0:?}")]
    EndpointAddress(String),
    /// An external or load-balancer IP does not parse.
    #[error("invalid external IP {0:?}")]
    ExternalIp(String),
    /// A load-balancer source range is not a CIDR.
    #[error("invalid load-balancer source range {0:?}")]
    SourceRange(String),
    /// The namespace, name or a port name is not a Kubernetes name (a DNS label), so it could not
    /// be written into a rule as it is.
    #[error("invalid name {0:?}")]
    Name(String),
    /// Two ports share a name, which would give them the same chains.
    #[error("port name {0:?} used twice")]
    DuplicatePort(String),
    /// A port lists the same endpoint twice, which would give it the same chain twice.
    #[error("endpoint {0} listed twice")]
    DuplicateEndpoint(String),
}

/// One complete revision as received: every part's changes gathered in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Revision {
    /// The sending controller's epoch.
    pub epoch: String,
    /// The revision number.
    pub number: u64,
    /// Whether the revision replaces the whole state.
    pub reset: bool,
    /// Whether the revision is the first of a stream on which the agent presented the digests of
    /// what it holds: a delta on top of that state, whatever epoch it came from (protocol rule 7).
    pub on_presented_state: bool,
    /// The changes, in the order they arrived.
    pub parts: Vec<pb::SyncResponse>,
}

/// Whether load balancers should keep sending the node new connections (kube-proxy's
/// `nodeEligible`), as the controller last said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eligibility {
    /// The controller knows the node's Node object, which is neither being deleted nor tainted
    /// for removal.
    Eligible,
    /// Not eligible, with the controller's reason.
    Ineligible(String),
}

impl Default for Eligibility {
    /// Not eligible until a controller says otherwise, as kube-proxy before it knows its Node.
    fn default() -> Self {
        Self::Ineligible("no controller has described the node".into())
    }
}

impl Eligibility {
    /// Whether the node is eligible.
    #[must_use]
    pub fn is_eligible(&self) -> bool {
        matches!(self, Self::Eligible)
    }
}

impl From<&pb::NodeStatus> for Eligibility {
    fn from(status: &pb::NodeStatus) -> Self {
        match (status.eligible, status.reason.is_empty()) {
            (true, _) => Self::Eligible,
            (false, false) => Self::Ineligible(status.reason.clone()),
            (false, true) => Self::Ineligible("the controller gave no reason".into()),
        }
    }
}

impl Revision {
    /// How many Services the revision adds, changes or removes, counting a change to a
    /// Service's endpoints as a change to the Service.
    #[must_use]
    pub fn services_changed(&self) -> usize {
        let mut keys = BTreeSet::new();
        for part in &self.parts {
            let upserted = part.upserted_services.iter().filter_map(|s| s.key.as_ref());
            let endpoints = part
                .upserted_endpoints
                .iter()
                .filter_map(|e| e.key.as_ref());
            for key in upserted
                .chain(endpoints)
                .chain(&part.removed_services)
                .chain(&part.removed_endpoints)
            {
                keys.insert((key.namespace.as_str(), key.name.as_str()));
            }
        }
        keys.len()
    }

    /// Fails on the first key a list of one part names twice: the protocol sends none (rule 8),
    /// and applying one would make the result depend on the order. Across parts a key may come
    /// back, in order.
    fn check_unique_keys(&self) -> Result<(), Rejected> {
        for part in &self.parts {
            unique_keys(
                "upserted_services",
                part.upserted_services.iter().map(|s| s.key.as_ref()),
            )?;
            unique_keys("removed_services", part.removed_services.iter().map(Some))?;
            unique_keys(
                "upserted_endpoints",
                part.upserted_endpoints.iter().map(|e| e.key.as_ref()),
            )?;
            unique_keys("removed_endpoints", part.removed_endpoints.iter().map(Some))?;
            unique_keys(
                "appended_endpoints",
                part.appended_endpoints.iter().map(|e| e.key.as_ref()),
            )?;
        }
        Ok(())
    }

    /// The buckets the revision replaces (protocol rule 11), named on its first part.
    ///
    /// # Errors
    ///
    /// Rejects buckets on a revision that is not the first on a presented state, or with a
    /// bucket count the protocol does not allow.
    fn replaced_buckets(&self) -> Result<Option<splitproxy_proto::BucketSet>, Rejected> {
        let Some(replaced) = self.parts.first().and_then(|p| p.replaced_buckets.as_ref()) else {
            return Ok(None);
        };
        if !self.on_presented_state {
            return Err(Rejected::ReplacedBuckets(
                "on a revision that does not answer a summary",
            ));
        }
        replaced.to_set().map(Some).ok_or(Rejected::ReplacedBuckets(
            "with a bucket count that is not a power of two up to 65536",
        ))
    }

    /// The revision it builds on (protocol rule 12), named on its first part; zero when it
    /// names none.
    #[must_use]
    pub fn base_revision(&self) -> u64 {
        self.parts.first().map_or(0, |part| part.base_revision)
    }

    /// The trace context the revision was sent with (on its first part); `None` when untraced.
    #[must_use]
    pub fn trace_context(&self) -> Option<&pb::TraceContext> {
        self.parts.first()?.trace_context.as_ref()
    }
}

/// Services and endpoints by key, and the node's eligibility, as last applied. The maps are
/// persistent: the next state is a copy that shares every entry a revision leaves alone, so a
/// revision costs in proportion to what it changes, and comparing two states skips what they
/// share.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeState {
    /// The controller epoch the state came from; `None` before the first revision.
    pub epoch: Option<String>,
    /// The revision the state matches.
    pub revision: u64,
    /// Services by key.
    pub services: OrdMap<Key, Arc<pb::Service>>,
    /// Endpoints by Service key.
    pub endpoints: OrdMap<Key, Arc<pb::ServiceEndpoints>>,
    /// The node's eligibility: from the last revision that carried a status; not eligible after
    /// a reset without one (protocol rule 9).
    pub eligibility: Eligibility,
    /// The Node's pod CIDRs, as written on it: from the last revision that carried a status.
    pub pod_cidrs: Vec<String>,
    /// The cluster's service CIDRs: from the last revision that carried a status.
    pub service_cidrs: Vec<String>,
    /// The Node's IPs: from the last revision that carried a status.
    pub node_ips: Vec<String>,
    /// The Node's zone, which endpoint sets in cluster form are localized with (protocol rule
    /// 15): from the last revision that carried a status.
    pub zone: String,
}

impl NodeState {
    /// The state after `revision`, or why it cannot be taken.
    ///
    /// # Errors
    ///
    /// Returns [`Rejected`] for a delta that does not build on this state or a resource without a
    /// key.
    pub fn apply(&self, revision: &Revision) -> Result<Self, Rejected> {
        if revision.number == 0 {
            return Err(Rejected::RevisionZero);
        }
        revision.check_unique_keys()?;
        let mut next = if revision.reset {
            Self::default()
        } else if self.epoch.as_deref() == Some(&revision.epoch) || revision.on_presented_state {
            self.clone()
        } else {
            return Err(Rejected::NotOnAppliedState {
                got: revision.epoch.clone(),
                held: self.epoch.clone(),
            });
        };
        next.epoch = Some(revision.epoch.clone());
        next.revision = revision.number;
        if let Some(replaced) = revision.replaced_buckets()? {
            // What the revision upserts in these buckets is all the node holds there.
            let within = |(namespace, name): &Key| replaced.contains(namespace, name);
            remove_keys(&mut next.services, within);
            remove_keys(&mut next.endpoints, within);
        }
        // The endpoint sets the revision upserted, which its later pieces continue (rule 14).
        let mut upserted_sets = BTreeSet::new();
        for part in &revision.parts {
            for key in &part.removed_services {
                let key = key_of(Some(key))?;
                next.services.remove(&key);
                next.endpoints.remove(&key);
                upserted_sets.remove(&key);
            }
            for key in &part.removed_endpoints {
                let key = key_of(Some(key))?;
                next.endpoints.remove(&key);
                upserted_sets.remove(&key);
            }
            for service in &part.upserted_services {
                next.services
                    .insert(key_of(service.key.as_ref())?, Arc::new(service.clone()));
            }
            for endpoints in &part.upserted_endpoints {
                let key = key_of(endpoints.key.as_ref())?;
                next.endpoints
                    .insert(key.clone(), Arc::new(endpoints.clone()));
                upserted_sets.insert(key);
            }
            for piece in &part.appended_endpoints {
                let key = key_of(piece.key.as_ref())?;
                let set = (next.endpoints.get_mut(&key)).filter(|_| upserted_sets.contains(&key));
                let Some(set) = set else {
                    return Err(Rejected::PieceWithoutSet(format!("{}/{}", key.0, key.1)));
                };
                splitproxy_proto::pieces::append(Arc::make_mut(set), piece);
            }
            if let Some(status) = &part.node_status {
                next.eligibility = status.into();
                next.pod_cidrs.clone_from(&status.pod_cidrs);
                next.service_cidrs.clone_from(&status.service_cidrs);
                next.node_ips.clone_from(&status.node_ips);
                next.zone.clone_from(&status.zone);
            }
        }
        Ok(next)
    }

    /// Whether `other` programs the same rules: the same Services and endpoints seen from the
    /// same zone, whatever the node's eligibility.
    #[must_use]
    pub fn same_rules(&self, other: &Self) -> bool {
        self.zone == other.zone
            && self.service_changes(other).next().is_none()
            && self.endpoint_changes(other).next().is_none()
    }

    /// Keys of the Services whose endpoints differ between `self` and `other`.
    pub fn endpoint_changes<'a>(&'a self, other: &'a Self) -> impl Iterator<Item = &'a Key> {
        dp::changed_keys(&self.endpoints, &other.endpoints)
    }

    /// Keys of the Services added, changed or removed between `self` and `other`.
    pub fn service_changes<'a>(&'a self, other: &'a Self) -> impl Iterator<Item = &'a Key> {
        dp::changed_keys(&self.services, &other.services)
    }

    /// The digest of every resource held, sorted by kind then key, for a subscribe (protocol
    /// rule 7).
    #[must_use]
    pub fn digests(&self) -> Vec<pb::ResourceDigest> {
        self.each_digest().map(resource_digest).collect()
    }

    /// The sums of [`Self::digests`] in [`splitproxy_proto::SUMMARY_BUCKETS`] buckets, for a
    /// subscribe to a controller that reads summaries (protocol rule 11).
    #[must_use]
    pub fn summary(&self) -> pb::HeldSummary {
        let mut summary = pb::HeldSummary::with_buckets(splitproxy_proto::SUMMARY_BUCKETS);
        for (_, (namespace, name), digest) in self.each_digest() {
            summary.add(namespace, name, digest);
        }
        summary
    }

    /// Every resource held with its kind and digest, sorted by kind then key.
    fn each_digest(&self) -> impl Iterator<Item = (pb::ResourceKind, &Key, u64)> {
        let services = self.services.iter().map(|(key, service)| {
            let digest = splitproxy_proto::digest(&**service);
            (pb::ResourceKind::Service, key, digest)
        });
        let endpoints = self.endpoints.iter().map(|(key, endpoints)| {
            let digest = splitproxy_proto::digest(&**endpoints);
            (pb::ResourceKind::Endpoints, key, digest)
        });
        services.chain(endpoints)
    }

    /// The number of endpoints over all Service ports.
    #[must_use]
    pub fn endpoint_count(&self) -> usize {
        self.endpoints
            .values()
            .flat_map(|e| &e.ports)
            .map(|p| p.endpoints.len())
            .sum()
    }
}

/// Removes from `map` every entry whose key passes `remove`.
fn remove_keys<V: Clone>(map: &mut OrdMap<Key, V>, remove: impl Fn(&Key) -> bool) {
    let gone: Vec<Key> = map.keys().filter(|key| remove(key)).cloned().collect();
    for key in gone {
        map.remove(&key);
    }
}

/// The digest of one resource held, as a subscribe lists it.
fn resource_digest(
    (kind, (namespace, name), digest): (pb::ResourceKind, &Key, u64),
) -> pb::ResourceDigest {
    pb::ResourceDigest {
        kind: kind as i32,
        key: Some(pb::ObjectKey {
            namespace: namespace.clone(),
            name: name.clone(),
        }),
        sha256_prefix: digest,
    }
}

/// The dataplane model of a node state, and the Services it had to leave out with why. Kept in
/// step with the state by converting again only the Services a revision changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversion {
    /// What the dataplane programs.
    pub model: ProxyState,
    /// The Services that cannot be programmed, so one bad Service never blocks the others.
    pub invalid: BTreeMap<Key, InvalidService>,
}

impl Conversion {
    /// The conversion of every Service of `state`, held by the agent of `node`.
    #[must_use]
    pub fn of(state: &NodeState, node: &str) -> Self {
        Self::default().updated(state, node, state.services.keys())
    }

    /// This conversion, of an earlier state of the same zone, brought to `state` by converting
    /// the Services of `changed` again (or dropping them, when `state` no longer has them).
    #[must_use]
    pub fn updated<'a>(
        &self,
        state: &NodeState,
        node: &str,
        changed: impl IntoIterator<Item = &'a Key>,
    ) -> Self {
        let place = Place {
            node,
            zone: &state.zone,
        };
        let mut next = self.clone();
        for key in changed {
            let model_key = dp::ServiceKey {
                namespace: key.0.clone(),
                name: key.1.clone(),
            };
            next.model.services.remove(&model_key);
            next.invalid.remove(key);
            let Some(service) = state.services.get(key) else {
                continue;
            };
            let endpoints = state.endpoints.get(key).map(|set| localized(set, &place));
            match convert_service(key, service, endpoints.as_deref()) {
                Ok(converted) => {
                    next.model.services.insert(model_key, Arc::new(converted));
                }
                Err(err) => {
                    next.invalid.insert(key.clone(), err);
                }
            }
        }
        next
    }
}

/// `set` as the node at `place` sees it: as it came when the controller filtered it for the node,
/// localized here when it came in cluster form (protocol rule 15).
fn localized<'a>(set: &'a pb::ServiceEndpoints, place: &Place) -> Cow<'a, pb::ServiceEndpoints> {
    if !set.cluster_form {
        return Cow::Borrowed(set);
    }
    let mut localized = set.clone();
    place.localize(&mut localized);
    Cow::Owned(localized)
}

/// Fails on the first key `keys` (the keys of one part's `list`) holds twice.
fn unique_keys<'a>(
    list: &'static str,
    keys: impl Iterator<Item = Option<&'a pb::ObjectKey>>,
) -> Result<(), Rejected> {
    let mut seen = BTreeSet::new();
    for key in keys {
        let (namespace, name) = key_of(key)?;
        if !seen.insert((namespace.clone(), name.clone())) {
            return Err(Rejected::DuplicateKey {
                list,
                key: format!("{namespace}/{name}"),
            });
        }
    }
    Ok(())
}

fn key_of(key: Option<&pb::ObjectKey>) -> Result<Key, Rejected> {
    let key = key.ok_or(Rejected::MissingKey)?;
    Ok((key.namespace.clone(), key.name.clone()))
}

fn convert_service(
    key: &Key,
    service: &pb::Service,
    endpoints: Option<&pb::ServiceEndpoints>,
) -> Result<dp::Service, InvalidService> {
    for name in [&key.0, &key.1] {
        if !is_dns_label(name) {
            return Err(InvalidService::Name(name.clone()));
        }
    }
    let mut port_names = BTreeSet::new();
    for port in &service.ports {
        if !(port.name.is_empty() || is_dns_label(&port.name)) {
            return Err(InvalidService::Name(port.name.clone()));
        }
        if !port_names.insert(&port.name) {
            return Err(InvalidService::DuplicatePort(port.name.clone()));
        }
    }
    let cluster_ips = ips(&service.cluster_ips, InvalidService::ClusterIp)?;
    let ports = service
        .ports
        .iter()
        .map(|port| {
            let protocol = protocol(port.protocol)?;
            let backends = endpoints
                .into_iter()
                .flat_map(|e| &e.ports)
                .find(|p| p.port_name == port.name && p.protocol == port.protocol)
                .map(|p| convert_endpoints(&p.endpoints))
                .transpose()?
                .unwrap_or_default();
            Ok(dp::ServicePort {
                name: port.name.clone(),
                protocol,
                port: port_number(port.port)?,
                node_port: match port.node_port {
                    0 => None,
                    n => Some(port_number(n)?),
                },
                endpoints: backends,
            })
        })
        .collect::<Result<_, _>>()?;
    let policy = |local| {
        if local {
            dp::TrafficPolicy::Local
        } else {
            dp::TrafficPolicy::Cluster
        }
    };
    Ok(dp::Service {
        key: dp::ServiceKey {
            namespace: key.0.clone(),
            name: key.1.clone(),
        },
        cluster_ips,
        ports,
        external_ips: ips(&service.external_ips, InvalidService::ExternalIp)?,
        load_balancer_ips: ips(&service.load_balancer_ips, InvalidService::ExternalIp)?,
        load_balancer_source_ranges: service
            .load_balancer_source_ranges
            .iter()
            .map(|range| {
                range
                    .parse()
                    .map_err(|_| InvalidService::SourceRange(range.clone()))
            })
            .collect::<Result<_, _>>()?,
        session_affinity: service
            .session_affinity
            .map(|a| Duration::from_secs(u64::from(a.timeout_seconds))),
        external_traffic_policy: policy(service.external_traffic_policy_local),
        internal_traffic_policy: policy(service.internal_traffic_policy_local),
        health_check_node_port: match service.health_check_node_port {
            0 => None,
            n => Some(port_number(n)?),
        },
    })
}

/// Parses every address of `texts`, or names the first that is not one.
fn ips(
    texts: &[String],
    invalid: fn(String) -> InvalidService,
) -> Result<Vec<IpAddr>, InvalidService> {
    texts
        .iter()
        .map(|ip| ip.parse::<IpAddr>().map_err(|_| invalid(ip.clone())))
        .collect()
}

/// Converts a port's endpoints, refusing one listed twice.
fn convert_endpoints(endpoints: &[pb::Endpoint]) -> Result<Vec<dp::Endpoint>, InvalidService> {
    let mut seen = BTreeSet::new();
    endpoints
        .iter()
        .map(|endpoint| {
            let converted = convert_endpoint(endpoint)?;
            if !seen.insert((converted.ip, converted.port)) {
                return Err(InvalidService::DuplicateEndpoint(converted.socket_string()));
            }
            Ok(converted)
        })
        .collect()
}

fn convert_endpoint(endpoint: &pb::Endpoint) -> Result<dp::Endpoint, InvalidService> {
    let conditions = endpoint.conditions.unwrap_or_default();
    Ok(dp::Endpoint {
        ip: endpoint
            .address
            .parse()
            .map_err(|_| InvalidService::EndpointAddress(endpoint.address.clone()))?,
        port: port_number(endpoint.port)?,
        ready: conditions.ready,
        serving: conditions.serving,
        terminating: conditions.terminating,
        is_local: endpoint.is_local,
        topology_excluded: endpoint.topology_excluded,
    })
}

fn protocol(value: i32) -> Result<dp::Protocol, InvalidService> {
    match pb::Protocol::try_from(value) {
        Ok(pb::Protocol::Tcp) => Ok(dp::Protocol::Tcp),
        Ok(pb::Protocol::Udp) => Ok(dp::Protocol::Udp),
        Ok(pb::Protocol::Sctp) => Ok(dp::Protocol::Sctp),
        _ => Err(InvalidService::Protocol(value)),
    }
}

fn port_number(port: u32) -> Result<u16, InvalidService> {
    u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(InvalidService::Port(port))
}

#[cfg(test)]
mod tests;
