//! The pure render: a [`ProxyState`] and one IP family's [`Options`] in, the family's
//! `kube-proxy` table out, kept per Service ([`Rendered`]) so that the next sync renders again
//! only the Services that changed.
//!
//! The table has a fixed part (base chains, dispatch chains, the sets and verdict maps Services
//! fill, module `skeleton`) and, per Service, its own chains, its affinity sets and its
//! elements of the shared sets and maps ([`ServiceRules`], module `service`). The layout is
//! kube-proxy's v1.36 nftables mode:
//!
//! ```text
//! nat-prerouting/nat-output → services ─┬─ @cluster-ips from outside the pod CIDR: mark for masquerade
//!                                       ├─ daddr . proto . port vmap @service-ips ─→ service-… / local-… / external-…
//!                                       └─ node address: proto . port vmap @service-nodeports → external-…
//! external-… → masquerade, then service-… (eTP Cluster) or local-… (eTP Local, after the short-circuits)
//! service-…/local-… → DNAT to numgen random mod N offset K in @endpoints-tcp-XX (endpoint-… chains with affinity)
//! filter-prerouting-pre-dnat/filter-output-pre-dnat → firewall-check: vmap @firewall-ips → firewall-… (drop)
//! filter-input/forward/output → service-endpoints-check / nodeport-endpoints-check: drop or reject
//!                               (vmap @no-endpoint-services, @no-endpoint-nodeports)
//! filter-forward/output → cluster-ips-check: reject other ports of cluster IPs, drop unallocated ones
//! nat-postrouting → masquerading: marked packets, and hairpin connections (@hairpin-connections)
//! ```
//!
//! **Endpoint choice** is where this layout leaves upstream's. Upstream gives every `service-…`
//! and `local-…` chain an anonymous map of its own (`numgen random mod N map { 0 : …, 1 : … }`),
//! and the kernel's cost of adding a set grows with the sets the table already holds: a full
//! sync of 10k Services spends seconds to minutes in the kernel naming and binding 10k anonymous
//! maps. Here the chains pick from shared named maps, one per protocol and first two characters
//! of the port's hash (`endpoints-tcp-UL` for `service-ULMVA6XW-…/tcp/…`, at most 1,024 per
//! protocol): a chain owns the numbers `K … K+N-1` of its map and picks `numgen random mod N
//! offset K`. Adding a Service then costs the same however many the table holds, the choice
//! stays one lookup, and a port whose endpoints change but not their number changes map elements
//! only, not its chain. [`Rendered`] hands out the ranges ([`Slot`]): a chain keeps its range
//! while its number of endpoints stays, and otherwise gets fresh numbers at the end of its map's,
//! so a number never points at two endpoints within one transaction.
//!
//! Which endpoints a port uses, whether it has any, and which traffic policies apply are decided
//! by the mode-neutral `PortPlan` (`crate::port_plan`, from [`crate::endpoints`]), so both modes always agree on
//! endpoints, `Local` policies and drop versus reject.
//!
//! Where the output can differ from upstream's for the same state:
//!
//! * an element two Services claim (one external IP and port for both, say) holds the first
//!   Service's verdict in key order, where upstream's is whichever it wrote last in its map's
//!   random order;
//! * endpoints are numbered in the model's order (address, then port), where upstream sorts
//!   their `ip:port` text (`10.0.0.10` before `10.0.0.9`); the choice is as random either way.

mod service;
pub(crate) mod skeleton;
#[cfg(test)]
mod tests;

use super::names::EndpointMap;
use crate::IpFamily;
use crate::NodeOptions;
use crate::node_options::FamilyOptions;
use crate::{Cidr, ProxyState, Service, ServiceKey};
use imbl::OrdMap;
use std::borrow::Cow;
use std::sync::Arc;

pub(crate) use skeleton::Skeleton;

/// How one family's table is rendered: the node's configuration that is not in its state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    common: FamilyOptions,
    service_cidrs: Vec<Cidr>,
}

impl Options {
    /// `options` as the `family` render uses them: that family's cluster CIDR (the local-traffic
    /// detector), node-port addresses and node IPs, and masquerade-all. No service CIDRs.
    #[must_use]
    pub fn new(family: IpFamily, options: &NodeOptions) -> Self {
        Self {
            common: FamilyOptions::new(family, options),
            service_cidrs: Vec::new(),
        }
    }

    /// Sets the service CIDRs (kube-proxy's `ServiceCIDR`s); those of the family go into the
    /// rule that drops traffic to unallocated cluster IPs, with their host bits cleared. Without
    /// any (the default), that rule is left out, as upstream without the `ServiceCIDR` API.
    #[must_use]
    pub fn with_service_cidrs(mut self, cidrs: impl IntoIterator<Item = Cidr>) -> Self {
        let family = self.common.family;
        self.service_cidrs = cidrs
            .into_iter()
            .filter(|cidr| family.contains(&cidr.address))
            .map(|cidr| cidr.network())
            .collect();
        self
    }

    /// The family rendered.
    #[must_use]
    pub fn family(&self) -> IpFamily {
        self.common.family
    }

    pub(crate) fn common(&self) -> &FamilyOptions {
        &self.common
    }

    pub(crate) fn service_cidrs(&self) -> &[Cidr] {
        &self.service_cidrs
    }
}

/// One of the fixed sets and verdict maps Services put elements in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Container {
    /// `cluster-ips`: every cluster IP of the family, for masquerading and the checks on ports no
    /// Service defines.
    ClusterIps,
    /// `nodeport-ips`: the node addresses that take node ports, with `--nodeport-addresses`.
    NodePortIps,
    /// `hairpin-connections`: `ip . ip . protocol . port` of each endpoint on this node, whose
    /// connections to itself through a Service are masqueraded.
    HairpinConnections,
    /// `service-ips`: cluster, external and load-balancer IP, protocol and port → the chain that
    /// handles them.
    ServiceIps,
    /// `service-nodeports`: protocol and node port → the port's `external-…` chain.
    ServiceNodePorts,
    /// `no-endpoint-services`: an IP, protocol and port no endpoint takes → drop or reject.
    NoEndpointServices,
    /// `no-endpoint-nodeports`: a node port no endpoint takes → drop or reject.
    NoEndpointNodePorts,
    /// `firewall-ips`: a load-balancer IP, protocol and port with source ranges → its
    /// `firewall-…` chain.
    FirewallIps,
    /// `endpoints-tcp-XX`: the numbers Service ports pick at random → endpoint address and port.
    /// Created while some port picks from it, unlike the fixed ones.
    Endpoints(EndpointMap),
}

impl Container {
    /// Every fixed container, in the order the table declares them.
    pub const ALL: [Self; 8] = [
        Self::ClusterIps,
        Self::NodePortIps,
        Self::HairpinConnections,
        Self::FirewallIps,
        Self::NoEndpointNodePorts,
        Self::NoEndpointServices,
        Self::ServiceIps,
        Self::ServiceNodePorts,
    ];

    /// The set's or map's name in the table.
    #[must_use]
    pub fn name(self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            Self::ClusterIps => "cluster-ips",
            Self::NodePortIps => "nodeport-ips",
            Self::HairpinConnections => "hairpin-connections",
            Self::ServiceIps => "service-ips",
            Self::ServiceNodePorts => "service-nodeports",
            Self::NoEndpointServices => "no-endpoint-services",
            Self::NoEndpointNodePorts => "no-endpoint-nodeports",
            Self::FirewallIps => "firewall-ips",
            Self::Endpoints(map) => return Cow::Owned(map.name()),
        })
    }

    /// Whether it is an endpoint map, whose every element belongs to the one chain it numbers
    /// (elements of the others may be claimed by several Services).
    #[must_use]
    pub fn is_endpoint_map(self) -> bool {
        matches!(self, Self::Endpoints(_))
    }

    /// `map` for a verdict map, `set` for a set: the keyword nft commands name it with.
    #[must_use]
    pub fn kind(self) -> &'static str {
        match self {
            Self::ClusterIps | Self::NodePortIps | Self::HairpinConnections => "set",
            Self::ServiceIps
            | Self::ServiceNodePorts
            | Self::NoEndpointServices
            | Self::NoEndpointNodePorts
            | Self::FirewallIps
            | Self::Endpoints(_) => "map",
        }
    }
}

/// One of a Service's own chains and its rules, each rule as nft writes it after
/// `add rule <family> kube-proxy <chain>` (with its `comment "…"`, if any).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// The chain's name (`service-…`, `endpoint-…`, …).
    pub name: String,
    /// Its rules, in order.
    pub rules: Vec<String>,
}

/// A set remembering which clients stick to one endpoint (`sessionAffinity: ClientIP`): source
/// addresses, each forgotten `timeout_seconds` after its last new connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffinitySet {
    /// The set's name (`affinity-…`).
    pub name: String,
    /// How long a client stays stuck after its last new connection.
    pub timeout_seconds: u64,
}

/// One element of a set or map Services share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// The set or map it belongs to.
    pub container: Container,
    /// The key, as nft writes it (`172.30.0.41 . tcp . 80`): the element's identity.
    pub key: Arc<str>,
    /// The element's comment (the `ns/name:port` of no-endpoint entries).
    pub comment: Option<String>,
    /// The data of a map element: a verdict (`goto service-…`, `drop`) or an endpoint
    /// (`10.180.0.1 . 80`); `None` in a set.
    pub value: Option<String>,
}

impl Element {
    /// Whether `other` has the same comment and value: the kernel keeps an element's comment
    /// and refuses a new value, so an element whose data changes is deleted and added again.
    pub(crate) fn same_data(&self, other: &Self) -> bool {
        self.comment == other.comment && self.value == other.value
    }
}

/// The numbers one `service-…` or `local-…` chain picks from in its endpoint map:
/// `offset … offset + len - 1`, one per endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The chain picking.
    pub chain: String,
    /// The map it picks from.
    pub map: EndpointMap,
    /// Its first number.
    pub offset: u32,
    /// How many numbers: its endpoints.
    pub len: u32,
}

/// What one Service adds to a family's table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceRules {
    /// Its own chains, each named once.
    pub chains: Vec<Chain>,
    /// Its affinity sets, each named once.
    pub sets: Vec<AffinitySet>,
    /// Its elements of the shared sets and maps, each key once per container.
    pub elements: Vec<Element>,
    /// Its chains' ranges in the endpoint maps.
    pub slots: Vec<Slot>,
}

impl ServiceRules {
    /// The rules of all its chains.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|chain| chain.rules.len()).sum()
    }
}

/// Which element: its container and key.
pub(crate) type ElementId = (Container, Arc<str>);

/// The Services holding one element, in key order: the first one's comment and value win when
/// Services disagree (two Services claiming one external IP and port, say), as the kernel can hold
/// only one. Shared elements (two Services over one local endpoint) are common in the hairpin
/// set.
type Holders = Arc<Vec<ServiceKey>>;

/// One family's table for a state, kept per Service and tied to the Services' `Arc`s, so that
/// [`Rendered::update`] renders again only the Services that changed and the transaction builder
/// compares only those.
#[derive(Debug, Clone)]
pub struct Rendered {
    options: Arc<Options>,
    skeleton: Arc<Skeleton>,
    /// The Services rendered, as the state held them.
    services: OrdMap<ServiceKey, Arc<Service>>,
    /// What each of them renders to.
    rules: OrdMap<ServiceKey, Arc<ServiceRules>>,
    /// Who holds each element of the containers Services may share (not the endpoint maps).
    holders: imbl::HashMap<ElementId, Holders>,
    /// Elements of the endpoint maps.
    endpoint_elements: usize,
    /// Rules in the Services' chains.
    service_rules: usize,
    /// The Services' chains.
    service_chains: usize,
    /// Each endpoint map in use, with the number of chains picking from it.
    endpoint_maps: OrdMap<EndpointMap, usize>,
    /// The first number of each endpoint map no chain has had since the numbering began.
    next_numbers: imbl::HashMap<EndpointMap, u32>,
    /// How many times the endpoint maps were numbered again from 0: a table numbered otherwise
    /// than the kernel's is written whole, as every chain's numbers may have moved.
    numbering: u64,
    /// [`NUMBER_LIMIT`], or a small one in tests.
    number_limit: u32,
}

/// The numbers an endpoint map hands out stay below this, so `offset + N` never overflows; a
/// map reaching it has everything numbered again from 0 (after some two billion changes).
const NUMBER_LIMIT: u32 = 1 << 31;

/// Hands the chains of one Service being rendered their ranges in the endpoint maps.
pub(super) struct Numbering<'a> {
    /// The Service's ranges before this render.
    previous: &'a [Slot],
    /// The next free number of each map.
    next: &'a mut imbl::HashMap<EndpointMap, u32>,
    /// No number reaches it.
    limit: u32,
    /// Some map ran out of numbers; the whole table is numbered again.
    exhausted: bool,
}

impl Numbering<'_> {
    /// The first of `len` numbers in `map` for `chain`: the ones it had if it had as many,
    /// otherwise fresh ones.
    pub(super) fn offset(&mut self, chain: &str, map: EndpointMap, len: u32) -> u32 {
        let kept = self
            .previous
            .iter()
            .find(|slot| slot.chain == chain && slot.map == map && slot.len == len);
        if let Some(slot) = kept {
            return slot.offset;
        }
        let next = self.next.entry(map).or_insert(0);
        let offset = *next;
        match offset.checked_add(len).filter(|end| *end <= self.limit) {
            Some(end) => *next = end,
            None => self.exhausted = true,
        }
        offset
    }
}

impl Rendered {
    /// Renders `state` for `options`' family.
    ///
    /// As upstream's per-family proxiers, only Services with a cluster IP of the family are
    /// rendered, and of each only its addresses, source ranges and endpoints of the family.
    #[must_use]
    pub fn new(state: &ProxyState, options: &Options) -> Self {
        let empty = Self {
            options: Arc::new(options.clone()),
            skeleton: Arc::new(Skeleton::new(options)),
            services: OrdMap::new(),
            rules: OrdMap::new(),
            holders: imbl::HashMap::new(),
            endpoint_elements: 0,
            service_rules: 0,
            service_chains: 0,
            endpoint_maps: OrdMap::new(),
            next_numbers: imbl::HashMap::new(),
            numbering: 0,
            number_limit: NUMBER_LIMIT,
        };
        // Numbering from 0 runs out only past `u32::MAX` numbers in one map.
        empty.render_changed(state, u32::MAX).0
    }

    /// This render, with endpoint maps numbered again once a number would reach `limit`.
    #[cfg(test)]
    pub(crate) fn with_number_limit(self, limit: u32) -> Self {
        Self {
            number_limit: limit,
            ..self
        }
    }

    /// The table for `state`, rendering again only the Services that differ from those rendered
    /// here (every one of them when `options` differ from those rendered with).
    #[must_use]
    pub fn update(&self, state: &ProxyState, options: &Options) -> Self {
        if *self.options != *options {
            return Self::new(state, options);
        }
        match self.render_changed(state, self.number_limit) {
            (next, false) => next,
            (_, true) => Self {
                numbering: self.numbering + 1,
                number_limit: self.number_limit,
                ..Self::new(state, options)
            },
        }
    }

    /// This table with the Services that differ in `state` rendered again, and whether an
    /// endpoint map ran out of numbers below `limit` (the table is then unusable: chains may
    /// share numbers).
    fn render_changed(&self, state: &ProxyState, limit: u32) -> (Self, bool) {
        let mut next = self.clone();
        let mut exhausted = false;
        for key in crate::changed_keys(&self.services, &state.services) {
            let old = self.rules.get(key);
            if let Some(old) = old {
                next.forget(key, old);
            }
            match state.services.get(key) {
                Some(service) => {
                    let mut numbering = Numbering {
                        previous: old.map_or(&[], |old| old.slots.as_slice()),
                        next: &mut next.next_numbers,
                        limit,
                        exhausted: false,
                    };
                    let rules = Arc::new(service::render(service, &self.options, &mut numbering));
                    exhausted |= numbering.exhausted;
                    next.remember(key, &rules);
                    next.rules.insert(key.clone(), rules);
                }
                None => {
                    next.rules.remove(key);
                }
            }
        }
        next.services = state.services.clone();
        (next, exhausted)
    }

    /// Takes the elements, chains and rules of `key`'s `rules` out of the totals and holders.
    fn forget(&mut self, key: &ServiceKey, rules: &ServiceRules) {
        self.service_rules -= rules.rule_count();
        self.service_chains -= rules.chains.len();
        for slot in &rules.slots {
            self.endpoint_elements -= slot.len as usize;
            match self.endpoint_maps.get_mut(&slot.map) {
                Some(users) if *users > 1 => *users -= 1,
                _ => {
                    self.endpoint_maps.remove(&slot.map);
                }
            }
        }
        for element in shared_elements(rules) {
            let id = (element.container, Arc::clone(&element.key));
            let Some(holders) = self.holders.get_mut(&id) else {
                continue;
            };
            if holders.len() == 1 {
                self.holders.remove(&id);
            } else {
                Arc::make_mut(holders).retain(|holder| holder != key);
            }
        }
    }

    /// Adds `key`'s `rules` to the totals and holders.
    fn remember(&mut self, key: &ServiceKey, rules: &ServiceRules) {
        self.service_rules += rules.rule_count();
        self.service_chains += rules.chains.len();
        for slot in &rules.slots {
            self.endpoint_elements += slot.len as usize;
            *self.endpoint_maps.entry(slot.map).or_insert(0) += 1;
        }
        for element in shared_elements(rules) {
            let id = (element.container, Arc::clone(&element.key));
            match self.holders.get_mut(&id) {
                Some(holders) => {
                    let holders = Arc::make_mut(holders);
                    let at = holders.partition_point(|holder| holder < key);
                    holders.insert(at, key.clone());
                }
                None => {
                    self.holders.insert(id, Arc::new(vec![key.clone()]));
                }
            }
        }
    }

    /// The options rendered with.
    #[must_use]
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Whether `other` was rendered with the same options and numbers its endpoint maps the
    /// same way, so a transaction between the two need only look at the Services that changed.
    #[must_use]
    pub fn comparable(&self, other: &Self) -> bool {
        self.options == other.options && self.numbering == other.numbering
    }

    /// The family rendered.
    #[must_use]
    pub fn family(&self) -> IpFamily {
        self.options.family()
    }

    pub(crate) fn skeleton(&self) -> &Arc<Skeleton> {
        &self.skeleton
    }

    /// The Services rendered, as the state held them.
    pub(crate) fn services(&self) -> &OrdMap<ServiceKey, Arc<Service>> {
        &self.services
    }

    /// What the Service of `key` renders to; `None` when the state has no such Service.
    #[must_use]
    pub fn service(&self, key: &ServiceKey) -> Option<&ServiceRules> {
        self.rules.get(key).map(AsRef::as_ref)
    }

    /// Every Service's rules, in key order.
    pub fn service_rules(&self) -> impl Iterator<Item = (&ServiceKey, &ServiceRules)> {
        self.rules.iter().map(|(key, rules)| (key, rules.as_ref()))
    }

    /// The element of `id`, of a container Services may share, as the table holds it: the first
    /// holder's.
    pub(crate) fn element(&self, id: &ElementId) -> Option<&Element> {
        let first = self.holders.get(id)?.first()?;
        self.rules
            .get(first)?
            .elements
            .iter()
            .find(|element| element.container == id.0 && element.key == id.1)
    }

    /// Whether the Service of `key` is the one whose copy of `element`, one of its own, the
    /// table holds.
    pub(crate) fn holds(&self, key: &ServiceKey, element: &Element) -> bool {
        element.container.is_endpoint_map()
            || self
                .holders
                .get(&(element.container, Arc::clone(&element.key)))
                .and_then(|holders| holders.first())
                .is_some_and(|first| first == key)
    }

    /// Whether a Service of this render owns chain `name`.
    #[must_use]
    pub fn has_chain(&self, name: &str) -> bool {
        self.owner_of(name)
            .is_some_and(|rules| rules.chains.iter().any(|chain| chain.name == name))
    }

    /// Whether a Service of this render owns affinity set `name`.
    #[must_use]
    pub fn has_set(&self, name: &str) -> bool {
        self.owner_of(name)
            .is_some_and(|rules| rules.sets.iter().any(|set| set.name == name))
    }

    /// The rules of the Service whose port a per-Service object `name` belongs to, found from
    /// the `namespace/name` the object's name carries after its hash.
    fn owner_of(&self, name: &str) -> Option<&ServiceRules> {
        // `prefix-HASH-namespace/name/…`: the namespace runs from after the second dash to the
        // first slash (namespaces hold dashes, so count from the slash back to the hash).
        let (head, rest) = name.split_once('/')?;
        let service = rest.split('/').next()?;
        let namespace = head.splitn(3, '-').nth(2)?;
        self.rules
            .get(&ServiceKey::new(namespace, service))
            .map(AsRef::as_ref)
    }

    /// Every chain of the Services, in key order.
    pub fn chain_names(&self) -> impl Iterator<Item = &str> {
        self.rules
            .values()
            .flat_map(|rules| rules.chains.iter().map(|chain| chain.name.as_str()))
    }

    /// Every affinity set of the Services, in key order.
    pub fn set_names(&self) -> impl Iterator<Item = &str> {
        self.rules
            .values()
            .flat_map(|rules| rules.sets.iter().map(|set| set.name.as_str()))
    }

    /// The endpoint maps some chain picks from, in name order.
    pub fn endpoint_maps(&self) -> impl Iterator<Item = EndpointMap> + '_ {
        self.endpoint_maps.keys().copied()
    }

    /// Whether some chain picks from endpoint map `map`.
    #[must_use]
    pub fn has_endpoint_map(&self, map: EndpointMap) -> bool {
        self.endpoint_maps.contains_key(&map)
    }

    /// Rules the table holds: the fixed chains' and the Services'.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.skeleton.rules + self.service_rules
    }

    /// Chains the table holds, fixed and the Services'.
    #[must_use]
    pub fn chain_count(&self) -> usize {
        self.skeleton.chains + self.service_chains
    }

    /// Elements the table's shared sets and maps hold (the endpoint maps' included).
    #[must_use]
    pub fn element_count(&self) -> usize {
        self.skeleton.elements + self.holders.len() + self.endpoint_elements
    }
}

/// The elements of `rules` in containers Services may share.
fn shared_elements(rules: &ServiceRules) -> impl Iterator<Item = &Element> {
    rules
        .elements
        .iter()
        .filter(|element| !element.container.is_endpoint_map())
}
