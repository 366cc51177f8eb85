//! The Kubernetes API source: one reflector each on Services, EndpointSlices and Nodes.
//!
//! Nothing is published before all three have listed once, so agents never see a half-read
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

/// Which of the three watches an event came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Services,
    EndpointSlices,
    Nodes,
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
                        nodes: nodes
                            .state()
                            .iter()
                            .filter_map(|n| Some((n.metadata.name.clone()?, Arc::clone(n))))
                            .collect(),
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
}

impl Listed {
    /// Records a signal; returns whether the stores may now differ from what was published.
    fn note(&mut self, signal: Signal) -> bool {
        match signal {
            Signal::Relisting => false,
            Signal::Changed => true,
            Signal::Listed(kind) => {
                match kind {
                    Kind::Services => self.services = true,
                    Kind::EndpointSlices => self.slices = true,
                    Kind::Nodes => self.nodes = true,
                }
                true
            }
        }
    }

    fn all(&self) -> bool {
        self.services && self.slices && self.nodes
    }
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
        assert!(listed.all());
    }

    #[test]
    fn a_relist_starting_is_not_a_change() {
        let mut listed = Listed::default();
        assert!(!listed.note(Signal::Relisting));
    }
}
