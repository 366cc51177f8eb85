//! The Kubernetes API source: one reflector each on Services, EndpointSlices, Nodes and
//! ServiceCIDRs.
//!
//! Nothing is published before all four have listed once, so agents never see a half-read
//! cluster. A relist (after a 410 or an API-server restart) is swapped into the stores atomically
//! when it completes, so objects that still exist never disappear in between.

use crate::{
    cluster::{HEADLESS_LABEL, Key, Objects, ServiceSelector},
    source::Source,
};
use futures::{FutureExt, StreamExt, stream::BoxStream};
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use kube::{
    Api, Client, Resource,
    runtime::{WatchStreamExt, reflector, watcher},
};
use std::sync::Arc;

/// Errors of the Kubernetes source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every watch stream ended, which reflectors with backoff never do on their own.
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

/// A reflector on `api` whose store is `writer`, reduced to publish signals.
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    kind: Kind,
) -> BoxStream<'static, Signal>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    reflector(writer, watcher(api, config).default_backoff())
        .filter_map(move |event| async move {
            match event {
                Ok(watcher::Event::Init) => Some(Signal::Relisting),
                Ok(watcher::Event::InitApply(_)) => None,
                Ok(watcher::Event::InitDone) => Some(Signal::Listed(kind)),
                Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => Some(Signal::Changed),
                // An API server without the kind (ServiceCIDRs before v1.33) has none of it:
                // kube-proxy then runs without them too.
                Err(watcher::Error::InitialListFailed(kube::Error::Api(status)))
                    if status.code == 404 && kind == Kind::ServiceCidrs =>
                {
                    Some(Signal::Missing(kind))
                }
                Err(err) => {
                    tracing::warn!(
                        ?kind,
                        error = &err as &dyn std::error::Error,
                        "watch failed; retrying"
                    );
                    None
                }
            }
        })
        .boxed()
}

impl Source for KubernetesSource {
    type Error = Error;

    async fn run(self, mut publish: impl FnMut(Objects) + Send + 'static) -> Result<(), Error> {
        let (services, services_writer) = reflector::store();
        let (slices, slices_writer) = reflector::store();
        let (nodes, nodes_writer) = reflector::store();
        let (service_cidrs, service_cidrs_writer) = reflector::store();
        // kube-proxy's informer filters: Services another proxy claims and the slices of
        // headless Services are never read.
        let streams = [
            watch(
                Api::<Service>::all(self.client.clone()),
                watcher::Config::default().labels(&self.selector.label_selector()),
                services_writer,
                Kind::Services,
            ),
            watch(
                Api::<EndpointSlice>::all(self.client.clone()),
                watcher::Config::default().labels(&format!("!{HEADLESS_LABEL}")),
                slices_writer,
                Kind::EndpointSlices,
            ),
            watch(
                Api::<Node>::all(self.client.clone()),
                watcher::Config::default(),
                nodes_writer,
                Kind::Nodes,
            ),
            watch(
                Api::<ServiceCIDR>::all(self.client.clone()),
                watcher::Config::default(),
                service_cidrs_writer,
                Kind::ServiceCidrs,
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
                        services: keyed(&services.state()),
                        slices: keyed(&slices.state()),
                        nodes: by_name(&nodes.state()),
                        service_cidrs: by_name(&service_cidrs.state()),
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

/// The store's cluster-scoped objects by name, as [`keyed`] does.
fn by_name<K: Resource>(objects: &[Arc<K>]) -> std::collections::BTreeMap<String, Arc<K>> {
    objects
        .iter()
        .filter_map(|o| Some((o.meta().name.clone()?, Arc::clone(o))))
        .collect()
}

/// The store's objects by key: the store's own `Arc`s, which it replaces only when an object
/// changes (what lets the cluster builder skip the others).
fn keyed<K: Resource>(objects: &[Arc<K>]) -> std::collections::BTreeMap<Key, Arc<K>> {
    objects
        .iter()
        .filter_map(|o| {
            let meta = o.meta();
            let key = (meta.namespace.clone()?, meta.name.clone()?);
            Some((key, Arc::clone(o)))
        })
        .collect()
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

    #[test]
    fn a_relist_starting_is_not_a_change() {
        let mut listed = Listed::default();
        assert!(!listed.note(Signal::Relisting));
    }
}
