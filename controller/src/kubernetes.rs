//! The Kubernetes API source: one watcher each on Services, EndpointSlices, Nodes and
//! ServiceCIDRs, with backoff.
//!
//! Each watch's events are applied, object by object, to a persistent map of that kind (a
//! [`Mirror`]), so each snapshot shares all it did not change with the one before and the
//! cluster builder converts only the changed objects. Nothing is published before all four have
//! listed once, so agents never see a half-read cluster. A relist (after a 410 or an API-server
//! restart) is patched into the map when it completes, so objects that still exist never
//! disappear in between, and those that did not change keep their entries.

use crate::{
    cluster::{HEADLESS_LABEL, Objects, ServiceSelector},
    source::Source,
};
use futures::{FutureExt, StreamExt, stream::BoxStream};
use imbl::{OrdMap, ordmap::DiffItem};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, watcher},
};
use splitproxy_proto::Key;
use std::sync::{Arc, Mutex, PoisonError};

/// Errors of the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every watch stream ended, which watchers with backoff never do on their own.
    #[error("the watch streams ended")]
    StreamsEnded,
}

/// Which of the watches an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Services,
    EndpointSlices,
    Nodes,
    ServiceCidrs,
}

/// What a watch event means for publishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// The store changed.
    Changed,
    /// A (re)list of this kind has completed.
    Listed(Kind),
    /// A relist started: the store keeps the old objects until it completes.
    Relisting,
    /// The API server does not serve this kind: it counts as listed, with nothing in it.
    Missing(Kind),
}

/// Watches the API server through `client`.
#[derive(Clone)]
pub struct KubernetesSource {
    client: Client,
    selector: ServiceSelector,
}

impl std::fmt::Debug for KubernetesSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesSource").finish_non_exhaustive()
    }
}

impl KubernetesSource {
    /// A source reading the Services `selector` claims from the cluster `client` talks to.
    #[must_use]
    pub fn new(client: Client, selector: ServiceSelector) -> Self {
        Self { client, selector }
    }
}

/// One kind's objects as its watch has shown them, by key.
struct Mirror<I, K> {
    kind: Kind,
    objects: OrdMap<I, Arc<K>>,
    /// The objects a relist under way has listed so far.
    relisted: Option<OrdMap<I, Arc<K>>>,
    /// The key of an object; objects without one are left out.
    key: fn(&ObjectMeta) -> Option<I>,
}

impl<I: Ord + Clone, K: Resource + PartialEq> Mirror<I, K> {
    fn new(kind: Kind, key: fn(&ObjectMeta) -> Option<I>) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            kind,
            objects: OrdMap::new(),
            relisted: None,
            key,
        }))
    }

    /// Applies one watch event; returns what it means for publishing, if anything.
    fn apply(&mut self, event: watcher::Event<K>) -> Option<Signal> {
        match event {
            watcher::Event::Init => {
                self.relisted = Some(OrdMap::new());
                Some(Signal::Relisting)
            }
            watcher::Event::InitApply(object) => {
                let key = (self.key)(object.meta())?;
                (self.relisted.get_or_insert_default()).insert(key, Arc::new(object));
                None
            }
            watcher::Event::InitDone => {
                let relisted = self.relisted.take().unwrap_or_default();
                self.objects = patched(&self.objects, &relisted);
                Some(Signal::Listed(self.kind))
            }
            watcher::Event::Apply(object) => {
                let key = (self.key)(object.meta())?;
                self.objects.insert(key, Arc::new(object));
                Some(Signal::Changed)
            }
            watcher::Event::Delete(object) => {
                let key = (self.key)(object.meta())?;
                self.objects.remove(&key);
                Some(Signal::Changed)
            }
        }
    }

    /// What the mirror holds now.
    fn snapshot(mirror: &Mutex<Self>) -> OrdMap<I, Arc<K>> {
        mirror
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .objects
            .clone()
    }
}

/// `before` made equal to `after` entry by entry, so that what both hold keeps its place (and
/// its `Arc`) and the result shares with `before` all that did not change.
fn patched<I: Ord + Clone, K: PartialEq>(
    before: &OrdMap<I, Arc<K>>,
    after: &OrdMap<I, Arc<K>>,
) -> OrdMap<I, Arc<K>> {
    let mut patched = before.clone();
    for change in before.diff(after) {
        match change {
            DiffItem::Add(key, object)
            | DiffItem::Update {
                new: (key, object), ..
            } => {
                patched.insert(key.clone(), Arc::clone(object));
            }
            DiffItem::Remove(key, _) => {
                patched.remove(key);
            }
        }
    }
    patched
}

/// A watch on `api` whose events are applied to `mirror`, reduced to publish signals.
fn watch<I, K>(
    api: Api<K>,
    config: watcher::Config,
    mirror: Arc<Mutex<Mirror<I, K>>>,
) -> BoxStream<'static, Signal>
where
    I: Ord + Clone + Send + Sync + 'static,
    K: Resource + PartialEq + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
    K::DynamicType: Default,
{
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let mut mirror = mirror.lock().unwrap_or_else(PoisonError::into_inner);
            let signal = match event {
                Ok(event) => mirror.apply(event),
                // An API server without the kind (ServiceCIDRs before v1.33) has none of it:
                // kube-proxy then runs without them too.
                Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                    if status.code == 404 && mirror.kind == Kind::ServiceCidrs =>
                {
                    Some(Signal::Missing(mirror.kind))
                }
                Err(err) => {
                    tracing::warn!(
                        kind = ?mirror.kind,
                        error = &err as &dyn std::error::Error,
                        "watch failed; retrying"
                    );
                    None
                }
            };
            std::future::ready(signal)
        })
        .boxed()
}

impl Source for KubernetesSource {
    type Error = Error;

    async fn run(self, mut publish: impl FnMut(Objects) + Send + 'static) -> Result<(), Error> {
        let services = Mirror::new(Kind::Services, keyed);
        let slices = Mirror::new(Kind::EndpointSlices, keyed);
        let nodes = Mirror::new(Kind::Nodes, by_name);
        let service_cidrs = Mirror::new(Kind::ServiceCidrs, by_name);
        // kube-proxy's informer filters: Services another proxy claims and the slices of
        // headless Services are never read.
        let streams = [
            watch(
                Api::<Service>::all(self.client.clone()),
                watcher::Config::default().labels(&self.selector.label_selector()),
                Arc::clone(&services),
            ),
            watch(
                Api::<EndpointSlice>::all(self.client.clone()),
                watcher::Config::default().labels(&format!("!{HEADLESS_LABEL}")),
                Arc::clone(&slices),
            ),
            watch(
                Api::<Node>::all(self.client.clone()),
                watcher::Config::default(),
                Arc::clone(&nodes),
            ),
            watch(
                Api::<ServiceCIDR>::all(self.client.clone()),
                watcher::Config::default(),
                Arc::clone(&service_cidrs),
            ),
        ];
        let mut signals = futures::stream::select_all(streams);
        let mut listed = Listed::default();
        while let Some(signal) = signals.next().await {
            let mut changed = listed.note(signal);
            let mut events = 1;
            // Take the whole burst (a relist, a rollout) before reading the stores once.
            while let Some(Some(signal)) = signals.next().now_or_never() {
                changed |= listed.note(signal);
                events += 1;
            }
            if changed && listed.all() {
                // One batch of watch events is one change: the root of the trace of every
                // revision it causes (see `crate::cause`).
                tracing::info_span!("watch events", events).in_scope(|| {
                    publish(Objects {
                        services: Mirror::snapshot(&services),
                        slices: Mirror::snapshot(&slices),
                        nodes: Mirror::snapshot(&nodes),
                        service_cidrs: Mirror::snapshot(&service_cidrs),
                    });
                });
            }
        }
        Err(Error::StreamsEnded)
    }
}

/// Which kinds have completed their first list.
#[derive(Debug, Default)]
struct Listed {
    services: bool,
    slices: bool,
    nodes: bool,
    service_cidrs: bool,
}

impl Listed {
    /// Records a signal; returns whether the stores may now differ from what was published.
    fn note(&mut self, signal: Signal) -> bool {
        match signal {
            Signal::Relisting => false,
            Signal::Changed => true,
            Signal::Listed(kind) => {
                *self.flag(kind) = true;
                true
            }
            // Once: an API server without the kind answers every retry the same.
            Signal::Missing(kind) => !std::mem::replace(self.flag(kind), true),
        }
    }

    fn flag(&mut self, kind: Kind) -> &mut bool {
        match kind {
            Kind::Services => &mut self.services,
            Kind::EndpointSlices => &mut self.slices,
            Kind::Nodes => &mut self.nodes,
            Kind::ServiceCidrs => &mut self.service_cidrs,
        }
    }

    fn all(&self) -> bool {
        self.services && self.slices && self.nodes && self.service_cidrs
    }
}

/// A cluster-scoped object's key: its name.
fn by_name(meta: &ObjectMeta) -> Option<String> {
    meta.name.clone()
}

/// A namespaced object's key.
fn keyed(meta: &ObjectMeta) -> Option<Key> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_published_until_every_kind_has_listed_once() {
        let mut listed = Listed::default();
        assert!(listed.note(Signal::Listed(Kind::Services)));
        assert!(listed.note(Signal::Changed));
        assert!(listed.note(Signal::Listed(Kind::EndpointSlices)));
        assert!(!listed.all());
        listed.note(Signal::Listed(Kind::Nodes));
        assert!(!listed.all());
        listed.note(Signal::Listed(Kind::ServiceCidrs));
        assert!(listed.all());
    }

    #[test]
    fn a_kind_the_api_server_lacks_counts_as_listed_once() {
        let mut listed = Listed::default();
        for kind in [Kind::Services, Kind::EndpointSlices, Kind::Nodes] {
            listed.note(Signal::Listed(kind));
        }
        assert!(listed.note(Signal::Missing(Kind::ServiceCidrs)));
        assert!(listed.all());
        assert!(!listed.note(Signal::Missing(Kind::ServiceCidrs)));
    }

    fn node(name: &str, zone: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some([("zone".to_owned(), zone.to_owned())].into());
        node
    }

    #[test]
    fn watch_events_are_applied_by_key_and_a_relist_is_patched_in_when_it_completes() {
        let mirror = Mirror::new(Kind::Nodes, by_name);
        let mut mirror = mirror.lock().expect("not poisoned");
        for name in ["a", "b", "c"] {
            mirror.apply(watcher::Event::InitApply(node(name, "z1")));
        }
        assert_eq!(
            mirror.apply(watcher::Event::InitDone),
            Some(Signal::Listed(Kind::Nodes))
        );
        assert_eq!(mirror.objects.len(), 3);
        let listed = mirror.objects.clone();

        assert_eq!(
            mirror.apply(watcher::Event::Delete(node("c", "z1"))),
            Some(Signal::Changed)
        );
        assert_eq!(mirror.objects.len(), 2);

        // A relist: until it completes, the objects are those before it.
        assert_eq!(mirror.apply(watcher::Event::Init), Some(Signal::Relisting));
        mirror.apply(watcher::Event::InitApply(node("a", "z1")));
        mirror.apply(watcher::Event::InitApply(node("d", "z2")));
        assert_eq!(mirror.objects.keys().collect::<Vec<_>>(), ["a", "b"]);
        mirror.apply(watcher::Event::InitDone);
        assert_eq!(mirror.objects.keys().collect::<Vec<_>>(), ["a", "d"]);
        // What the relist found unchanged keeps its entry, so nothing downstream sees it change.
        assert!(Arc::ptr_eq(&mirror.objects["a"], &listed["a"]));

        assert_eq!(
            mirror.apply(watcher::Event::Apply(node("a", "z3"))),
            Some(Signal::Changed)
        );
        let labels = mirror.objects["a"]
            .metadata
            .labels
            .clone()
            .unwrap_or_default();
        assert_eq!(labels["zone"], "z3");
    }

    #[test]
    fn a_relist_starting_is_not_a_change() {
        let mut listed = Listed::default();
        assert!(!listed.note(Signal::Relisting));
    }
}
