//! The connected agents: one record per open node view stream, written by the fan-out through a
//! [`Connection`] and read by the metrics and the inspection service; and the most streams this
//! replica keeps, beyond which the oldest are told to end (see [`crate::shares`]).
//!
//! **Lag.** A node is *behind* from the first cluster state published after the view it last
//! acknowledged (or from the moment its stream opened) until it acknowledges a view of the latest
//! published state. A published state that turns out not to change the node's view ends the lag
//! as soon as the stream computes that view, which it does whenever no revision is in flight.
//! The lag is measured on tokio's clock, so paused-time tests control it.

use prometheus_client::metrics::counter::Counter;
use prost::Message;
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, SystemTime},
};
use tokio::{sync::Notify, time::Instant};

/// A point in time on both clocks: tokio's, to measure lag, and the wall clock, to show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moment {
    /// On tokio's clock.
    pub instant: Instant,
    /// On the wall clock.
    pub wall: SystemTime,
}

impl Moment {
    /// Now, on both clocks.
    #[must_use]
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }
}

/// One open stream, as last updated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The node the agent subscribed as.
    pub node: String,
    /// The agent's address.
    pub peer: String,
    /// The proxy mode the agent reported (`pb::ProxyMode` as its wire number).
    pub proxy_mode: i32,
    /// When the stream opened.
    pub connected_at: SystemTime,
    /// The last revision the node applied; 0 before the first.
    pub acked_revision: u64,
    /// The newest revision sent; 0 before the first.
    pub latest_revision: u64,
    /// Since when the node lacks a published change; `None` while it is up to date.
    pub behind_since: Option<Moment>,
    /// When the node last acknowledged a revision as applied.
    pub last_ack_at: Option<SystemTime>,
    /// When and why the node last rejected a revision.
    pub last_nack: Option<(SystemTime, String)>,
    /// Messages sent on the stream.
    pub messages_sent: u64,
    /// Their encoded protobuf bytes.
    pub bytes_sent: u64,
}

impl Record {
    /// How long the node has been behind at `now`; zero while it is up to date.
    #[must_use]
    pub fn lag(&self, now: Instant) -> Duration {
        self.behind_since.map_or(Duration::ZERO, |since| {
            now.saturating_duration_since(since.instant)
        })
    }
}

/// Every open stream, by connection order; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Agents {
    table: Arc<Mutex<Table>>,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    streams: BTreeMap<u64, Stream>,
    /// How many streams were told to end and have not ended yet.
    shedding: usize,
    /// The most streams kept; `None` for no limit.
    limit: Option<usize>,
    /// Whether the replica is shutting down: every stream told to end, none taken.
    draining: bool,
}

#[derive(Debug)]
struct Stream {
    record: Record,
    /// Tells the stream to end.
    shed: Arc<Notify>,
    /// Why the stream was told to end; `None` while it was not.
    ending: Option<Ending>,
}

/// Why a stream is told to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The replica holds more than its share of the nodes (protocol rule 13).
    Shed,
    /// A newer stream of the same node replaced it: a node has one stream per replica, so
    /// one node's credential cannot hold more.
    Superseded,
    /// The replica is shutting down and sends every agent to another one first.
    Draining,
}

impl Agents {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned table still holds the last written records, which is what readers want.
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every open stream, sorted by node name then connection order.
    #[must_use]
    pub fn streams(&self) -> Vec<Record> {
        let mut streams: Vec<Record> = (self.lock().streams.values())
            .map(|stream| stream.record.clone())
            .collect();
        // Stable: streams of one node keep their connection order.
        streams.sort_by(|a, b| a.node.cmp(&b.node));
        streams
    }

    /// The newest stream of each connected node, sorted by node name: what the per-node metrics
    /// report, so a node has one series even while an old stream of it lingers.
    #[must_use]
    pub fn by_node(&self) -> BTreeMap<String, Record> {
        // Later (newer) streams overwrite earlier ones.
        self.lock()
            .streams
            .values()
            .map(|stream| (stream.record.node.clone(), stream.record.clone()))
            .collect()
    }

    /// Sets the most streams kept; returns whether it changed.
    pub fn set_limit(&self, limit: Option<usize>) -> bool {
        let mut table = self.lock();
        let changed = table.limit != limit;
        table.limit = limit;
        changed
    }

    /// Tells the oldest stream to end if more streams are kept than the limit; returns whether
    /// one was told.
    pub fn shed_oldest(&self) -> bool {
        let mut table = self.lock();
        let Some(limit) = table.limit else {
            return false;
        };
        if table.streams.len() - table.shedding <= limit {
            return false;
        }
        let Some(oldest) = table.streams.values_mut().find(|s| s.ending.is_none()) else {
            return false;
        };
        oldest.ending = Some(Ending::Shed);
        // Kept until the stream looks: it may be busy sending when told.
        oldest.shed.notify_one();
        table.shedding += 1;
        true
    }

    /// How many streams are open.
    #[must_use]
    pub fn open(&self) -> usize {
        self.lock().streams.len()
    }

    /// Tells every stream to end ([`Ending::Draining`]), the replica shutting down; returns how
    /// many were told.
    pub fn drain(&self) -> usize {
        let mut table = self.lock();
        table.draining = true;
        let mut told = 0;
        for stream in table.streams.values_mut() {
            if stream.ending.is_none() {
                stream.ending = Some(Ending::Draining);
                stream.shed.notify_one();
                told += 1;
            }
        }
        table.shedding += told;
        told
    }

    /// Whether the replica is shutting down ([`Agents::drain`]).
    #[must_use]
    pub fn draining(&self) -> bool {
        self.lock().draining
    }

    /// How many streams are open and not told to end.
    #[must_use]
    pub fn kept(&self) -> usize {
        let table = self.lock();
        table.streams.len() - table.shedding
    }
}

/// What every stream counts into, summed over the streams; the metrics register them.
#[derive(Debug, Clone, Default)]
pub struct StreamCounters {
    /// `splitproxy_controller_view_computations_total`: node views computed, one per stream
    /// each time it looks for something to send.
    pub view_computations: Counter,
    /// `splitproxy_controller_update_messages_sent_total`: `SyncResponse` messages sent.
    pub messages_sent: Counter,
    /// `splitproxy_controller_update_bytes_sent_total`: their encoded protobuf size, without
    /// gRPC framing or HTTP/2 overhead.
    pub bytes_sent: Counter,
    /// `splitproxy_controller_rejected_revisions_total`: revisions agents rejected (NACKs).
    pub rejected_revisions: Counter,
    /// `splitproxy_controller_superseded_streams_total`: streams ended because a newer one of
    /// the same node opened.
    pub superseded_streams: Counter,
    /// `splitproxy_controller_fallen_behind_streams_total`: streams ended because their agent
    /// left a revision unanswered (or unread) past the fall-behind limit.
    pub fallen_behind_streams: Counter,
}

/// One stream's handle on its record: the fan-out reports what happens on the stream, and the
/// record goes away when the handle is dropped (the stream ended).
#[derive(Debug)]
pub struct Connection {
    agents: Agents,
    counters: StreamCounters,
    id: u64,
    /// The first cluster state published since the node's view was last computed.
    observed_change: Option<Moment>,
    /// Tells the stream to end (see [`Ending`]).
    shed: Arc<Notify>,
}

impl Connection {
    /// Records a new stream of `node` from `peer`, and tells the node's older streams to end
    /// ([`Ending::Superseded`]); `acked_revision` is what the agent resumed from (0 when it
    /// starts afresh). The node is behind until its first acknowledgement.
    #[must_use]
    pub fn open(
        agents: &Agents,
        counters: &StreamCounters,
        node: &str,
        peer: &str,
        proxy_mode: i32,
        acked_revision: u64,
    ) -> Self {
        let agents = agents.clone();
        let now = Moment::now();
        let shed = Arc::new(Notify::new());
        let id = {
            let mut table = agents.lock();
            let id = table.next_id;
            table.next_id += 1;
            let record = Record {
                node: node.to_owned(),
                peer: peer.to_owned(),
                proxy_mode,
                connected_at: now.wall,
                acked_revision,
                latest_revision: acked_revision,
                behind_since: None,
                last_ack_at: None,
                last_nack: None,
                messages_sent: 0,
                bytes_sent: 0,
            };
            let mut superseded = 0;
            for older in (table.streams.values_mut()).filter(|s| s.record.node == node) {
                if older.ending.is_none() {
                    older.ending = Some(Ending::Superseded);
                    older.shed.notify_one();
                    superseded += 1;
                }
            }
            table.shedding += superseded;
            counters.superseded_streams.inc_by(superseded as u64);
            let stream = Stream {
                record,
                shed: Arc::clone(&shed),
                ending: None,
            };
            table.streams.insert(id, stream);
            id
        };
        Self {
            agents,
            counters: counters.clone(),
            id,
            observed_change: Some(now),
            shed,
        }
    }

    fn update(&self, change: impl FnOnce(&mut Record)) {
        if let Some(stream) = self.agents.lock().streams.get_mut(&self.id) {
            change(&mut stream.record);
        }
    }

    /// Completes once the stream is to end, with why.
    pub async fn ending(&self) -> Ending {
        self.shed.notified().await;
        let table = self.agents.lock();
        let ending = table.streams.get(&self.id).and_then(|s| s.ending);
        // Only this handle removes the record, and the notification comes with a reason set:
        // the fallback is never taken, and shedding is the plainest ending if it were.
        ending.unwrap_or(Ending::Shed)
    }

    /// A new cluster state was published; the node may be behind from now on.
    pub fn observed_change(&mut self) {
        self.observed_change.get_or_insert_with(Moment::now);
    }

    /// The node's view of the latest published state was computed; `differs` says whether the
    /// node does not hold it yet: it differs from what was sent (a revision follows) or a
    /// revision is still in flight. Otherwise the node is up to date.
    pub fn view_computed(&mut self, differs: bool) {
        self.counters.view_computations.inc();
        let observed = self.observed_change.take();
        self.update(|record| {
            record.behind_since = if differs {
                record
                    .behind_since
                    .or(observed)
                    .or_else(|| Some(Moment::now()))
            } else {
                None
            };
        });
    }

    /// `messages` of `revision` were handed to the stream.
    pub fn sent(&self, revision: u64, messages: &[crate::wire::SyncResponse]) {
        let bytes: u64 = messages.iter().map(|m| m.encoded_len() as u64).sum();
        let count = messages.len() as u64;
        self.counters.messages_sent.inc_by(count);
        self.counters.bytes_sent.inc_by(bytes);
        self.update(|record| {
            record.latest_revision = revision;
            record.messages_sent += count;
            record.bytes_sent += bytes;
        });
    }

    /// The node applied `revision` and every one before it; `newest` says whether that is the
    /// latest sent. It is then up to date unless a state was published after that revision's
    /// view was computed; otherwise it stays behind since it was.
    pub fn acked(&self, revision: u64, newest: bool) {
        let behind_since = self.observed_change;
        self.update(|record| {
            record.acked_revision = revision;
            record.last_ack_at = Some(SystemTime::now());
            if newest {
                record.behind_since = behind_since;
            }
        });
    }

    /// The node rejected a revision for `reason`; it keeps what it had, and stays behind.
    pub fn rejected(&self, reason: &str) {
        self.counters.rejected_revisions.inc();
        self.update(|record| {
            record.last_nack = Some((SystemTime::now(), reason.to_owned()));
        });
    }

    /// The stream ends: its agent left a revision unanswered past the fall-behind limit.
    pub fn fell_behind(&self) {
        self.counters.fallen_behind_streams.inc();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let mut table = self.agents.lock();
        if let Some(stream) = table.streams.remove(&self.id)
            && stream.ending.is_some()
        {
            table.shedding -= 1;
        }
    }
}

#[cfg(test)]
mod tests;
