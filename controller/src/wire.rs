//! What the controller sends agents, in the form it sends it: `splitproxy.v1alpha1.SyncResponse`
//! with its upserted resources already encoded. A resource sent to many nodes (a Service, or
//! the endpoints every node of a zone sees) is encoded once per cluster state and its bytes are
//! shared by every message carrying it. An embedded message and a `bytes` field are the same on
//! the wire, so agents decode these as the generated message.

use bytes::Bytes;
use prost::Message;
use splitproxy_proto::v1alpha1 as pb;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

/// The node view service's server (see `build.rs`).
pub mod server {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("splitproxy.v1alpha1.NodeViewService");
}

/// `splitproxy.v1alpha1.SyncResponse` field for field, the upserted resources as their
/// encodings. See `view.proto` for what each field means.
#[derive(Clone, PartialEq, Message)]
pub struct SyncResponse {
    /// Identifies the controller process.
    #[prost(string, tag = "1")]
    pub controller_epoch: String,
    /// The revision this message belongs to.
    #[prost(uint64, tag = "2")]
    pub revision: u64,
    /// Whether the revision replaces the agent's whole state.
    #[prost(bool, tag = "3")]
    pub reset: bool,
    /// Set on the last message of the revision.
    #[prost(bool, tag = "4")]
    pub complete: bool,
    /// Encoded `Service` messages.
    #[prost(bytes = "bytes", repeated, tag = "5")]
    pub upserted_services: Vec<Bytes>,
    /// Services removed.
    #[prost(message, repeated, tag = "6")]
    pub removed_services: Vec<pb::ObjectKey>,
    /// Encoded `ServiceEndpoints` messages.
    #[prost(bytes = "bytes", repeated, tag = "7")]
    pub upserted_endpoints: Vec<Bytes>,
    /// Endpoint sets removed.
    #[prost(message, repeated, tag = "8")]
    pub removed_endpoints: Vec<pb::ObjectKey>,
    /// The trace context of the change behind the revision.
    #[prost(message, optional, tag = "9")]
    pub trace_context: Option<pb::TraceContext>,
    /// The node's status, when it changed.
    #[prost(message, optional, tag = "10")]
    pub node_status: Option<pb::NodeStatus>,
    /// The buckets a revision answering a summary replaces.
    #[prost(message, optional, tag = "11")]
    pub replaced_buckets: Option<pb::ReplacedBuckets>,
    /// The revision this delta builds on.
    #[prost(uint64, tag = "12")]
    pub base_revision: u64,
    /// Encoded later pieces of `ServiceEndpoints` upserted earlier in the revision.
    #[prost(bytes = "bytes", repeated, tag = "13")]
    pub appended_endpoints: Vec<Bytes>,
}

/// The encodings of the resources one cluster state's revisions upsert, by entry address: whole,
/// and for an endpoint set too big for one message, in pieces (protocol rule 14). Each entry is
/// held, so no address is reused while the cache lives. Dropped with the state.
#[derive(Debug, Default)]
pub struct Encodings {
    whole: Cache<Bytes>,
    pieces: Cache<Arc<[Bytes]>>,
}

impl Encodings {
    /// `entry`'s encoding: the one made for the first node that was sent it, or made now.
    pub fn of<M: Message + Send + Sync + 'static>(&self, entry: &Arc<M>) -> Bytes {
        self.whole
            .get_or_make(entry, || Bytes::from(entry.encode_to_vec()))
    }

    /// The encodings of `entry` in pieces of at most `max` bytes, the first to upsert and the
    /// others to append (see [`splitproxy_proto::pieces`]); made once per entry, like
    /// [`Encodings::of`], so every node sent a big Service shares the same bytes.
    pub fn pieces_of(&self, entry: &Arc<pb::ServiceEndpoints>, max: usize) -> Arc<[Bytes]> {
        self.pieces.get_or_make(entry, || {
            let pieces = splitproxy_proto::pieces::split(entry, max);
            pieces
                .iter()
                .map(|piece| Bytes::from(piece.encode_to_vec()))
                .collect()
        })
    }
}

/// Values made from entries, by entry address.
#[derive(Debug)]
struct Cache<V>(Mutex<HashMap<usize, Made<V>>>);

impl<V> Default for Cache<V> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

#[derive(Debug)]
struct Made<V> {
    /// Held only to keep the address from being reused.
    _entry: Arc<dyn std::any::Any + Send + Sync>,
    value: V,
}

impl<V: Clone> Cache<V> {
    /// The value made for `entry`, or `make`'s, made outside the lock: two nodes making the same
    /// entry's at once keep the first.
    fn get_or_make<M: Send + Sync + 'static>(&self, entry: &Arc<M>, make: impl FnOnce() -> V) -> V {
        let address = Arc::as_ptr(entry).cast::<()>() as usize;
        if let Some(known) = self.lock().get(&address) {
            return known.value.clone();
        }
        let value = make();
        let entry: Arc<dyn std::any::Any + Send + Sync> = Arc::clone(entry) as _;
        let made = Made {
            _entry: entry,
            value,
        };
        self.lock().entry(address).or_insert(made).value.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Made<V>>> {
        // Every write leaves the map consistent.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
