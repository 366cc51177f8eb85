//! The manifests source: Services, EndpointSlices, Nodes and ServiceCIDRs read from a directory of YAML files in
//! the form `kubectl get -o yaml` prints, re-read whenever the directory changes.
//!
//! A file that does not parse is reported and keeps contributing what it held when it last parsed,
//! so a half-written edit never removes Services from the cluster. The cluster's objects are kept
//! and patched by key as files change, so a change costs in proportion to the files it touched;
//! of objects with the same key in several files, the one in the last file (in path order) wins.

use crate::{cluster::Objects, source::Source};
use imbl::OrdMap;
use k8s_openapi::api::{
    core::v1::{Node, Service},
    discovery::v1::EndpointSlice,
    networking::v1::ServiceCIDR,
};
use notify::Watcher;
use serde::Deserialize;
use splitproxy_proto::Key;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, SystemTime},
};
use tokio::sync::mpsc;

/// Errors of the manifests source.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The directory could not be listed.
    #[error("reading directory {0}")]
    ReadDir(PathBuf, #[source] std::io::Error),
    /// A file could not be read.
    #[error("reading {0}")]
    ReadFile(PathBuf, #[source] std::io::Error),
    /// A YAML document is not valid YAML.
    #[error("document {index}: not valid YAML")]
    Yaml {
        /// The document's position in its file, from 1.
        index: usize,
        /// What the parser said.
        #[source]
        source: serde_norway::Error,
    },
    /// A document is valid YAML but not a valid object of its kind.
    #[error("document {index}: invalid {kind}")]
    Object {
        /// The document's position in its file, from 1.
        index: usize,
        /// The object's kind.
        kind: String,
        /// What the decoder said.
        #[source]
        source: serde_json::Error,
    },
    /// The directory could not be watched.
    #[error("watching {0}")]
    Watch(PathBuf, #[source] notify::Error),
}

/// One object of a kind the controller uses.
#[derive(Debug, Clone)]
pub enum Object {
    /// A core/v1 Service.
    Service(Arc<Service>),
    /// A discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice(Arc<EndpointSlice>),
    /// A core/v1 Node.
    Node(Arc<Node>),
    /// A networking.k8s.io/v1 ServiceCIDR.
    ServiceCidr(Arc<ServiceCIDR>),
}

impl Object {
    /// The object's `metadata.name`, if it has one.
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Service(svc) => svc.metadata.name.as_deref(),
            Self::EndpointSlice(slice) => slice.metadata.name.as_deref(),
            Self::Node(node) => node.metadata.name.as_deref(),
            Self::ServiceCidr(cidr) => cidr.metadata.name.as_deref(),
        }
    }

    /// What identifies the object across files: its kind and key; `None` without a name.
    fn id(&self) -> Option<Id> {
        Some(match self {
            Self::Service(svc) => Id::Service(key(&svc.metadata)?),
            Self::EndpointSlice(slice) => Id::EndpointSlice(key(&slice.metadata)?),
            Self::Node(node) => Id::Node(node.metadata.name.clone()?),
            Self::ServiceCidr(cidr) => Id::ServiceCidr(cidr.metadata.name.clone()?),
        })
    }

    /// The object's kind.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Service(_) => "Service",
            Self::EndpointSlice(_) => "EndpointSlice",
            Self::Node(_) => "Node",
            Self::ServiceCidr(_) => "ServiceCIDR",
        }
    }
}

/// An object's kind and key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Id {
    Service(Key),
    EndpointSlice(Key),
    Node(String),
    ServiceCidr(String),
}

/// Parses every object of a used kind from a multi-document YAML text; `kind: List` documents
/// (what `kubectl get -o yaml` prints for several objects) are unpacked. Other kinds are ignored.
///
/// # Errors
///
/// Returns the first document that is not valid YAML or not a valid object of its kind.
pub fn parse_documents(text: &str) -> Result<Vec<Object>, Error> {
    let mut objects = Vec::new();
    for (i, document) in serde_norway::Deserializer::from_str(text).enumerate() {
        let index = i + 1;
        let value = serde_json::Value::deserialize(document)
            .map_err(|source| Error::Yaml { index, source })?;
        if value.is_null() {
            continue;
        }
        let items = match value.get("kind").and_then(|k| k.as_str()) {
            Some("List") => value
                .get("items")
                .and_then(|i| i.as_array())
                .cloned()
                .unwrap_or_default(),
            _ => vec![value],
        };
        for item in items {
            if let Some(object) = decode(item, index)? {
                objects.push(object);
            }
        }
    }
    Ok(objects)
}

fn decode(value: serde_json::Value, index: usize) -> Result<Option<Object>, Error> {
    let api_version = value
        .get("apiVersion")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let kind = value
        .get("kind")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_owned();
    let invalid = |source| Error::Object {
        index,
        kind: kind.clone(),
        source,
    };
    Ok(match (api_version, kind.as_str()) {
        ("v1", "Service") => Some(Object::Service(
            serde_json::from_value(value)
                .map(Arc::new)
                .map_err(invalid)?,
        )),
        ("discovery.k8s.io/v1", "EndpointSlice") => Some(Object::EndpointSlice(
            serde_json::from_value(value)
                .map(Arc::new)
                .map_err(invalid)?,
        )),
        ("v1", "Node") => Some(Object::Node(
            serde_json::from_value(value)
                .map(Arc::new)
                .map_err(invalid)?,
        )),
        ("networking.k8s.io/v1", "ServiceCIDR") => Some(Object::ServiceCidr(
            serde_json::from_value(value)
                .map(Arc::new)
                .map_err(invalid)?,
        )),
        _ => None,
    })
}

/// The directory's files, what each held when it last parsed, and the objects they make up.
#[derive(Debug)]
pub struct ManifestsDir {
    dir: PathBuf,
    files: BTreeMap<PathBuf, Parsed>,
    /// The files that hold each object.
    holders: HashMap<Id, BTreeSet<PathBuf>>,
    /// Each object as the last file holding it has it.
    objects: Objects,
}

/// One file's objects, and what its metadata was when they were read.
#[derive(Debug)]
struct Parsed {
    /// `None` when the file may still change unseen (see [`Stamp::of`]): it is read again.
    stamp: Option<Stamp>,
    /// The named objects; of several with the same kind and key, the last.
    objects: BTreeMap<Id, Object>,
}

/// What tells a file that is unchanged since it was read: a rewrite (in place, or aside and
/// renamed over it) changes its modification time, size or inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: SystemTime,
    len: u64,
    inode: u64,
}

/// How old a modification time must be before a stamp is trusted. File times come from a
/// coarse clock, so a file written twice within one tick keeps its time: only files whose
/// time is older than this are known to have been read after their last write.
const SETTLED: Duration = Duration::from_secs(2);

impl Stamp {
    /// The stamp of a file with `metadata`; `None` while its last write is recent.
    fn of(metadata: &std::fs::Metadata) -> Option<Self> {
        let modified = metadata.modified().ok()?;
        let age = SystemTime::now().duration_since(modified).ok()?;
        (age >= SETTLED).then(|| Self {
            modified,
            len: metadata.len(),
            inode: metadata.ino(),
        })
    }
}

impl ManifestsDir {
    /// A source reading `dir`; nothing is read until [`ManifestsDir::rescan`].
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: BTreeMap::new(),
            holders: HashMap::new(),
            objects: Objects::default(),
        }
    }

    /// Re-reads the directory and returns every object it holds. Only files that changed since
    /// they were last read are parsed again. Files that fail to parse are logged and keep their
    /// last good objects; files that are gone lose theirs.
    ///
    /// # Errors
    ///
    /// Fails only when the directory itself cannot be listed.
    pub fn rescan(&mut self) -> Result<Objects, Error> {
        let present: BTreeMap<PathBuf, std::fs::Metadata> =
            manifest_files(&self.dir)?.into_iter().collect();
        let gone: Vec<PathBuf> = (self.files.keys())
            .filter(|path| !present.contains_key(*path))
            .cloned()
            .collect();
        for path in gone {
            self.replace(&path, None);
        }
        for (path, metadata) in present {
            let stamp = Stamp::of(&metadata);
            let before = self.files.get(&path);
            if stamp.is_some() && before.is_some_and(|before| before.stamp == stamp) {
                continue;
            }
            let parsed = read(&path, stamp, before);
            self.replace(&path, parsed);
        }
        Ok(self.objects.clone())
    }

    /// Re-reads the files at `paths`, which the watcher saw change, and returns every object the
    /// directory holds: a path that is no longer a manifest file loses its objects, and the
    /// other files are neither listed nor looked at. Parse failures as for [`Self::rescan`].
    pub fn refresh(&mut self, paths: impl IntoIterator<Item = PathBuf>) -> Objects {
        for path in paths {
            // The watch is of the directory alone: every path is one of its entries.
            let Some(name) = path.file_name() else {
                continue;
            };
            let path = self.dir.join(name);
            let metadata = std::fs::metadata(&path).ok().filter(|m| m.is_file());
            let parsed = metadata
                .filter(|_| is_manifest(&path))
                .and_then(|metadata| read(&path, Stamp::of(&metadata), self.files.get(&path)));
            self.replace(&path, parsed);
        }
        self.objects.clone()
    }

    /// Makes `parsed` what the file at `path` holds (`None`: nothing) and updates the objects
    /// it held or holds.
    fn replace(&mut self, path: &Path, parsed: Option<Parsed>) {
        let before = match parsed {
            Some(parsed) => self.files.insert(path.to_owned(), parsed),
            None => self.files.remove(path),
        };
        let held = before.map(|parsed| parsed.objects.into_keys().collect::<Vec<_>>());
        for id in held.iter().flatten() {
            if let Some(holders) = self.holders.get_mut(id) {
                holders.remove(path);
            }
        }
        let holds = self
            .files
            .get(path)
            .into_iter()
            .flat_map(|p| p.objects.keys());
        let holds: Vec<Id> = holds.cloned().collect();
        for id in &holds {
            (self.holders.entry(id.clone()).or_default()).insert(path.to_owned());
        }
        for id in held.iter().flatten().chain(&holds) {
            self.settle(id);
        }
    }

    /// Sets the object `id` to what the last file holding it holds, or removes it.
    fn settle(&mut self, id: &Id) {
        let last = self.holders.get(id).and_then(BTreeSet::last);
        match last.and_then(|path| self.files.get(path)?.objects.get(id)) {
            Some(object) => self.objects.put(object),
            None => {
                self.holders.remove(id);
                self.objects.take(id);
            }
        }
    }
}

/// Reads and parses the file at `path`; when it fails, logs why and keeps what it held `before`.
fn read(path: &Path, stamp: Option<Stamp>, before: Option<&Parsed>) -> Option<Parsed> {
    match std::fs::read_to_string(path)
        .map_err(|e| Error::ReadFile(path.to_owned(), e))
        .and_then(|text| parse_documents(&text))
    {
        Ok(objects) => {
            let mut named = BTreeMap::new();
            for object in objects {
                match object.id() {
                    Some(id) => {
                        named.insert(id, object);
                    }
                    None => tracing::warn!(
                        file = %path.display(),
                        kind = object.kind(),
                        "ignoring object without a name"
                    ),
                }
            }
            Some(Parsed {
                stamp,
                objects: named,
            })
        }
        Err(err) => {
            tracing::error!(
                file = %path.display(),
                error = &err as &dyn std::error::Error,
                "skipping manifest file that does not parse; keeping what it held before"
            );
            // Not stamped: the file is read again on the next change, until it parses.
            before.map(|parsed| Parsed {
                stamp: None,
                objects: parsed.objects.clone(),
            })
        }
    }
}

impl Objects {
    /// The objects of parsed manifests by key; of several with the same key the last wins, and
    /// those without a name are left out.
    pub fn from_manifests<'a>(manifests: impl IntoIterator<Item = &'a Object>) -> Self {
        let mut objects = Self::default();
        for object in manifests {
            objects.put(object);
        }
        objects
    }

    /// Sets `object` in place of the one with its key, if it has a name.
    fn put(&mut self, object: &Object) {
        match object {
            Object::Service(svc) => put(&mut self.services, key(&svc.metadata), svc),
            Object::EndpointSlice(slice) => put(&mut self.slices, key(&slice.metadata), slice),
            Object::Node(node) => put(&mut self.nodes, node.metadata.name.clone(), node),
            Object::ServiceCidr(cidr) => {
                put(&mut self.service_cidrs, cidr.metadata.name.clone(), cidr);
            }
        }
    }

    /// Removes the object `id`.
    fn take(&mut self, id: &Id) {
        match id {
            Id::Service(key) => {
                self.services.remove(key);
            }
            Id::EndpointSlice(key) => {
                self.slices.remove(key);
            }
            Id::Node(name) => {
                self.nodes.remove(name);
            }
            Id::ServiceCidr(name) => {
                self.service_cidrs.remove(name);
            }
        }
    }
}

/// Sets `object` under `key` unless it is there already, so an unchanged map stays shared.
fn put<I: Ord + Clone, K>(map: &mut OrdMap<I, Arc<K>>, key: Option<I>, object: &Arc<K>) {
    if let Some(key) = key
        && !map.get(&key).is_some_and(|held| Arc::ptr_eq(held, object))
    {
        map.insert(key, Arc::clone(object));
    }
}

impl Source for ManifestsDir {
    type Error = Error;

    /// Reads the directory now and again after every change to it. Runs until the watcher stops;
    /// fails when the directory cannot be watched or listed.
    async fn run(mut self, mut publish: impl FnMut(Objects) + Send + 'static) -> Result<(), Error> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // Every rescan opens and reads the files, which inotify reports as access: reacting
                // to those would rescan forever. Only changes count.
                if event.as_ref().is_ok_and(|e| e.kind.is_access()) {
                    return;
                }
                // The receiver only goes away when the source stops.
                let _ = tx.send(event);
            })
            .map_err(|e| Error::Watch(self.dir.clone(), e))?;
        watcher
            .watch(&self.dir, notify::RecursiveMode::NonRecursive)
            .map_err(|e| Error::Watch(self.dir.clone(), e))?;
        let dir = self.dir.display().to_string();
        // Each read of the directory is one change: its span is the root of the trace of every
        // revision it causes (see `crate::cause`).
        let span = tracing::info_span!("manifests change", %dir, initial = true);
        let objects = span.in_scope(|| self.rescan())?;
        span.in_scope(|| publish(objects));
        while let Some(event) = rx.recv().await {
            // Editors write in bursts (truncate, write, rename): let the burst settle, then read
            // what it changed once.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let mut changed = Changed::default();
            changed.note(event);
            let mut events = 1;
            while let Ok(event) = rx.try_recv() {
                changed.note(event);
                events += 1;
            }
            let span = tracing::info_span!("manifests change", %dir, initial = false, events);
            // An event of the directory itself (moved, replaced) may change any file.
            let entries = changed.paths.filter(|paths| !paths.contains(&self.dir));
            let objects = span.in_scope(|| match entries {
                Some(paths) => Ok(self.refresh(paths)),
                None => self.rescan(),
            })?;
            span.in_scope(|| publish(objects));
        }
        Ok(())
    }
}

/// What a burst of watch events changed.
#[derive(Debug)]
struct Changed {
    /// The paths the events named; `None` when an event was lost or named none, so the whole
    /// directory must be read again.
    paths: Option<BTreeSet<PathBuf>>,
}

impl Default for Changed {
    fn default() -> Self {
        Self {
            paths: Some(BTreeSet::new()),
        }
    }
}

impl Changed {
    fn note(&mut self, event: notify::Result<notify::Event>) {
        match event {
            Ok(event) if !event.need_rescan() && !event.paths.is_empty() => {
                if let Some(paths) = &mut self.paths {
                    paths.extend(event.paths);
                }
            }
            Ok(_) => self.paths = None,
            Err(err) => {
                tracing::warn!(error = %err, "manifest watch event error; rescanning");
                self.paths = None;
            }
        }
    }
}

/// Whether `path` names a manifest: a `.yaml`, `.yml` or `.json` file that is not hidden.
fn is_manifest(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with('.'));
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
    yaml && !hidden
}

/// The manifest files of `dir` with their metadata, in path order.
fn manifest_files(dir: &Path) -> Result<Vec<(PathBuf, std::fs::Metadata)>, Error> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::ReadDir(dir.to_owned(), e))?;
    let mut files: Vec<(PathBuf, std::fs::Metadata)> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| is_manifest(path))
        .filter_map(|path| {
            let metadata = std::fs::metadata(&path).ok()?;
            metadata.is_file().then_some((path, metadata))
        })
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<Key> {
    let name = meta.name.clone()?;
    Some((
        meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name,
    ))
}

#[cfg(test)]
mod tests;
