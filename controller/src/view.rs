//! Per-node views and the deltas between two views of one node.
//!
//! A node's view shares almost everything with the cluster state and with every other node's
//! view: the Services, and the endpoints of every Service the node runs none of and no node hint
//! names it for, in their plain form or, where zone hints narrow them, in the form every node of
//! its zone sees. Only the rest, usually a few Services per node, is the node's own. The next
//! view is computed from what changed since the last (see [`crate::history`]), so a change
//! costs each node work in proportion to the change, not to the cluster.

use crate::{
    cluster::ClusterState,
    nodes,
    resources::{Endpoints, ServiceBackends, Services},
    topology,
};
use splitproxy_proto::{Key, topology::Place, v1alpha1 as pb};
use std::{collections::BTreeMap, sync::Arc};

/// How a node's agent takes endpoint sets (protocol rule 15).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EndpointForm {
    /// Filtered for the node: locality and topology set by the controller, so a node that runs
    /// an endpoint of a Service or that a node hint names has a copy of the set of its own.
    #[default]
    Filtered,
    /// In cluster form, the same for every node: the agent derives locality and topology, and
    /// the view holds nothing of its own.
    Cluster,
}

/// What one node must program: the Services and, for those that have any, their endpoints; and
/// the node's own status.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    /// The generation of the cluster state the view was computed from; `None` for the empty
    /// view a reset is computed from.
    generation: Option<u64>,
    /// Services by key: the cluster's.
    services: Arc<Services>,
    /// The cluster's endpoints: in cluster form, or their form for the node's zone unless `own`
    /// has an entry.
    backends: Arc<Endpoints>,
    /// How the node's agent takes endpoint sets.
    form: EndpointForm,
    /// The node's zone; empty when it has none.
    zone: String,
    /// The endpoints as this node sees them, where that may differ from its zone's form: the
    /// Services with an endpoint on the node or a node hint naming it. Always empty in cluster
    /// form.
    own: Arc<BTreeMap<Key, Arc<pb::ServiceEndpoints>>>,
    /// The node's status; set in every computed view, `None` only in the empty view, so a reset
    /// always carries it.
    status: Option<pb::NodeStatus>,
}

impl NodeView {
    /// Computes `node`'s view of the cluster in `form`: filtered, with locality and topology
    /// hints applied per Service port with the node's zone (see [`splitproxy_proto::topology`]);
    /// and the node's eligibility (see [`crate::eligibility`]).
    #[must_use]
    pub fn for_node(cluster: &ClusterState, node: &str, form: EndpointForm) -> Self {
        let place = place_of(cluster, node);
        if form == EndpointForm::Cluster {
            return Self::of(cluster, &place, form, Arc::default());
        }
        let mine = |(key, backends): (&Key, &Arc<ServiceBackends>)| {
            own_endpoints(backends, &place).map(|e| (key.clone(), Arc::new(e)))
        };
        let own = match cluster.placement.candidates(&cluster.endpoints, node) {
            Some(keys) => keys
                .filter_map(|key| cluster.endpoints.get_key_value(key))
                .filter_map(mine)
                .collect(),
            None => cluster.endpoints.iter().filter_map(mine).collect(),
        };
        Self::of(cluster, &place, form, Arc::new(own))
    }

    /// `node`'s view of `cluster`, and the delta from this view (an earlier one of the same
    /// node) to it. Computed from the changes since this view's cluster state when the history
    /// still reaches it and the node itself did not change; from whole views otherwise.
    #[must_use]
    pub fn advance(&self, cluster: &ClusterState, node: &str) -> (Self, Delta) {
        let changes = self
            .generation
            .and_then(|generation| cluster.history.since(generation))
            .filter(|changes| !changes.nodes.contains(node));
        let Some(changes) = changes else {
            let next = Self::for_node(cluster, node, self.form);
            let delta = Delta::between(self, &next);
            return (next, delta);
        };
        let place = place_of(cluster, node);
        let mut own = Arc::clone(&self.own);
        let filtered = self.form == EndpointForm::Filtered;
        for key in changes.endpoints.iter().filter(|_| filtered) {
            let mine = cluster
                .endpoints
                .get(key)
                .and_then(|backends| own_endpoints(backends, &place));
            match mine {
                Some(endpoints) => {
                    Arc::make_mut(&mut own).insert(key.clone(), Arc::new(endpoints));
                }
                None if own.contains_key(key) => {
                    Arc::make_mut(&mut own).remove(key);
                }
                None => {}
            }
        }
        let next = Self::of(cluster, &place, self.form, own);
        let delta = Delta::assemble(
            diff(
                &changes.services,
                &*self.services,
                &*next.services,
                same_entry,
            ),
            diff(
                &changes.endpoints,
                &EndpointsOf(self),
                &EndpointsOf(&next),
                same_entry,
            ),
            &next,
            next.status.clone().filter(|_| self.status != next.status),
        );
        (next, delta)
    }

    /// The view in `form` of the node at `place`, whose own entries are `own`.
    fn of(
        cluster: &ClusterState,
        place: &Place,
        form: EndpointForm,
        own: Arc<BTreeMap<Key, Arc<pb::ServiceEndpoints>>>,
    ) -> Self {
        Self {
            generation: Some(cluster.history.generation()),
            services: Arc::clone(&cluster.services),
            backends: Arc::clone(&cluster.endpoints),
            form,
            zone: place.zone.to_owned(),
            own,
            status: Some(nodes::status(
                cluster.nodes.get(place.node),
                &cluster.service_cidrs,
            )),
        }
    }

    /// The Services by key.
    #[must_use]
    pub fn services(&self) -> &Services {
        &self.services
    }

    /// The endpoints of `key` as this node sees them.
    #[must_use]
    pub fn endpoints_of(&self, key: &Key) -> Option<&Arc<pb::ServiceEndpoints>> {
        self.own
            .get(key)
            .or_else(|| self.backends.get(key).map(|b| self.shared_form(b)))
    }

    /// Every Service's endpoints as this node sees them, by key.
    pub fn endpoints(&self) -> impl Iterator<Item = (&Key, &Arc<pb::ServiceEndpoints>)> {
        self.backends.iter().map(|(key, b)| {
            (
                key,
                self.own.get(key).unwrap_or_else(|| self.shared_form(b)),
            )
        })
    }

    /// The form of `backends` this node shares with others: the cluster form, or its zone's.
    fn shared_form<'a>(&self, backends: &'a ServiceBackends) -> &'a Arc<pb::ServiceEndpoints> {
        match self.form {
            EndpointForm::Cluster => &backends.cluster,
            EndpointForm::Filtered => backends.seen_in_zone(&self.zone),
        }
    }

    /// The form the view holds endpoint sets in.
    #[must_use]
    pub fn form(&self) -> EndpointForm {
        self.form
    }

    /// The node's status.
    #[must_use]
    pub fn status(&self) -> Option<&pb::NodeStatus> {
        self.status.as_ref()
    }
}

fn place_of<'a>(cluster: &'a ClusterState, node: &'a str) -> Place<'a> {
    topology::place(node, cluster.nodes.get(node).map(|n| &n.topology))
}

/// The endpoints of one Service as the node at `place` sees them, when that may differ from
/// what its zone sees; `None` when the node runs none of them and no node hint names it.
fn own_endpoints(backends: &ServiceBackends, place: &Place) -> Option<pb::ServiceEndpoints> {
    place
        .is_singled_out(backends.ports())
        .then(|| backends.seen_from(place))
}

/// The changes that turn one view into another.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Services added or changed.
    pub upserted_services: Vec<Arc<pb::Service>>,
    /// Services removed.
    pub removed_services: Vec<pb::ObjectKey>,
    /// Endpoint sets added or changed.
    pub upserted_endpoints: Vec<Arc<pb::ServiceEndpoints>>,
    /// Endpoint sets removed while their Service stays.
    pub removed_endpoints: Vec<pb::ObjectKey>,
    /// The node's new status; `None` when it did not change.
    pub node_status: Option<pb::NodeStatus>,
    /// The buckets whose resources the delta replaces (protocol rule 11); only in a delta from a
    /// summary.
    pub replaced_buckets: Option<pb::ReplacedBuckets>,
}

impl Delta {
    /// The delta from `from` to `to`, comparing whole views (entries shared by both are equal
    /// without a look inside). A removed Service implies the removal of its endpoints, so those
    /// are not listed again. The node's status is listed only when it changed.
    #[must_use]
    pub fn between(from: &NodeView, to: &NodeView) -> Self {
        let services = if Arc::ptr_eq(&from.services, &to.services) {
            Diff::default()
        } else {
            diff_all(&*from.services, &*to.services, same_entry)
        };
        let (from_endpoints, to_endpoints) = (EndpointsOf(from), EndpointsOf(to));
        Self::assemble(
            services,
            diff_all(&from_endpoints, &to_endpoints, same_entry),
            to,
            to.status.clone().filter(|_| from.status != to.status),
        )
    }

    /// A delta to `to` from upserts and removals per kind. A removed Service implies the removal
    /// of its endpoints, so those are not listed again.
    fn assemble(
        (upserted_services, removed_services): Diff<Arc<pb::Service>>,
        (upserted_endpoints, removed): Diff<Arc<pb::ServiceEndpoints>>,
        to: &NodeView,
        node_status: Option<pb::NodeStatus>,
    ) -> Self {
        let removed_endpoints = removed
            .into_iter()
            .filter(|key| {
                to.services
                    .contains_key(&(key.namespace.clone(), key.name.clone()))
            })
            .collect();
        Self {
            upserted_services,
            removed_services,
            upserted_endpoints,
            removed_endpoints,
            node_status,
            replaced_buckets: None,
        }
    }

    /// Whether the delta changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.upserted_services.is_empty()
            && self.removed_services.is_empty()
            && self.upserted_endpoints.is_empty()
            && self.removed_endpoints.is_empty()
            && self.node_status.is_none()
            && self.replaced_buckets.is_none()
    }
}

/// Whether two entries are the same: shared, or equal.
fn same_entry<T: PartialEq>(a: &Arc<T>, b: &Arc<T>) -> bool {
    Arc::ptr_eq(a, b) || a == b
}

/// One kind of resource a node holds (or an agent said it holds), by key.
trait Resources {
    /// What is held per key.
    type Entry;
    fn get(&self, key: &Key) -> Option<&Self::Entry>;
    /// Every entry, sorted by key.
    fn entries(&self) -> impl Iterator<Item = (&Key, &Self::Entry)>;
}

impl<V: Clone> Resources for imbl::OrdMap<Key, V> {
    type Entry = V;
    fn get(&self, key: &Key) -> Option<&V> {
        imbl::OrdMap::get(self, key)
    }
    fn entries(&self) -> impl Iterator<Item = (&Key, &V)> {
        self.iter()
    }
}

/// A view's endpoints as that node sees them.
struct EndpointsOf<'a>(&'a NodeView);

impl Resources for EndpointsOf<'_> {
    type Entry = Arc<pb::ServiceEndpoints>;
    fn get(&self, key: &Key) -> Option<&Self::Entry> {
        self.0.endpoints_of(key)
    }
    fn entries(&self) -> impl Iterator<Item = (&Key, &Self::Entry)> {
        self.0.endpoints()
    }
}

/// What turns `from` into `to`, over every key either holds: one walk of both in key order.
fn diff_all<F: Resources, T: Resources>(
    from: &F,
    to: &T,
    same: impl Fn(&F::Entry, &T::Entry) -> bool,
) -> Diff<T::Entry>
where
    T::Entry: Clone,
{
    use itertools::EitherOrBoth::{Both, Left, Right};
    let pairs = itertools::merge_join_by(from.entries(), to.entries(), |(a, _), (b, _)| a.cmp(b));
    collect_diff(
        pairs.map(|pair| match pair {
            Both((key, held), (_, entry)) => (key, Some(held), Some(entry)),
            Left((key, held)) => (key, Some(held), None),
            Right((key, entry)) => (key, None, Some(entry)),
        }),
        same,
    )
}

/// What turns `from` into `to` among `keys` (those that may have changed).
fn diff<'k, F: Resources, T: Resources>(
    keys: impl IntoIterator<Item = &'k (impl std::borrow::Borrow<Key> + 'k)>,
    from: &F,
    to: &T,
    same: impl Fn(&F::Entry, &T::Entry) -> bool,
) -> Diff<T::Entry>
where
    T::Entry: Clone,
{
    let keys = keys.into_iter().map(std::borrow::Borrow::borrow);
    collect_diff(keys.map(|key| (key, from.get(key), to.get(key))), same)
}

/// The entries to upsert and the keys to remove, for one kind.
type Diff<V> = (Vec<V>, Vec<pb::ObjectKey>);

/// The upserts and removals of `pairs` (a key, what `from` holds for it and what `to` does),
/// where `same` says whether what `from` holds (the entry itself, or its digest) matches `to`'s.
fn collect_diff<'a, H: 'a, E: Clone + 'a>(
    pairs: impl Iterator<Item = (&'a Key, Option<&'a H>, Option<&'a E>)>,
    same: impl Fn(&H, &E) -> bool,
) -> Diff<E> {
    let mut upserted = Vec::new();
    let mut removed = Vec::new();
    for (key, held, entry) in pairs {
        match (held, entry) {
            (Some(held), Some(entry)) if same(held, entry) => {}
            (_, Some(entry)) => upserted.push(entry.clone()),
            (Some(_), None) => removed.push(object_key(key)),
            (None, None) => {}
        }
    }
    (upserted, removed)
}

fn object_key((namespace, name): &Key) -> pb::ObjectKey {
    pb::ObjectKey {
        namespace: namespace.clone(),
        name: name.clone(),
    }
}

mod resume;

pub use resume::{Held, HeldDigests};

#[cfg(test)]
mod tests;
