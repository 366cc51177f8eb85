//! The change a published cluster state came from, as W3C trace context, so every revision it
//! leads to can be followed as one trace from the source's change to each node's kernel.
//!
//! What a trace of a merged revision is: the controller keeps a bounded number of revisions in
//! flight per agent (one, or eight when it pipelines) and folds the changes that arrive meanwhile into the next one. That revision's `send revision`
//! span is a child of the **newest** change it carries (the state it brings the node to), and
//! holds span links to the older changes folded into it that this agent's stream saw, so each of
//! those traces can still be reached from the revision that applied it.

use splitproxy_proto::v1alpha1 as pb;

/// Most older changes linked from one revision; more are dropped (oldest first), so a flood of
/// changes to a slow agent cannot grow a span without bound.
pub const MAX_LINKED_CHANGES: usize = 16;

/// The trace context of the change that produced a cluster state; empty when not traced.
///
/// Two states are equal whatever their causes: the cause says where a state came from, not what
/// it is, so a change that leads back to the state already published publishes nothing.
#[derive(Debug, Clone, Default)]
pub struct Cause(pub Option<pb::TraceContext>);

impl PartialEq for Cause {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Cause {
    /// The cause of whatever happens inside `span`.
    #[must_use]
    pub fn of(span: &tracing::Span) -> Self {
        Self(splitproxy_telemetry::trace::context_of(span))
    }
}

/// The causes seen by one agent's stream since its last revision was sent: the newest becomes
/// the next revision's parent, the others its links.
#[derive(Debug, Default)]
pub struct Pending {
    seen: Vec<pb::TraceContext>,
}

impl Pending {
    /// Notes a published state's cause (ignored when untraced or already noted).
    pub fn note(&mut self, cause: &Cause) {
        let Some(trace) = &cause.0 else { return };
        if self.seen.iter().any(|t| t.traceparent == trace.traceparent) {
            return;
        }
        if self.seen.len() > MAX_LINKED_CHANGES {
            self.seen.remove(0);
        }
        self.seen.push(trace.clone());
    }

    /// Takes the older causes to link from a revision whose parent is `newest`.
    pub fn take_links(&mut self, newest: &Cause) -> Vec<pb::TraceContext> {
        let mut links = std::mem::take(&mut self.seen);
        if let Some(newest) = &newest.0 {
            links.retain(|t| t.traceparent != newest.traceparent);
        }
        links.truncate(MAX_LINKED_CHANGES);
        links
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traced(span_id: u8) -> Cause {
        Cause(Some(pb::TraceContext {
            traceparent: format!(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902{span_id:02x}-01"
            ),
            tracestate: String::new(),
        }))
    }

    #[test]
    fn states_with_different_causes_are_equal() {
        assert_eq!(traced(1), Cause::default());
    }

    #[test]
    fn a_merged_revision_links_the_older_changes_but_not_its_parent() {
        let mut pending = Pending::default();
        for cause in [traced(1), traced(2), traced(2), Cause::default(), traced(3)] {
            pending.note(&cause);
        }
        let links = pending.take_links(&traced(3));
        let ids: Vec<&str> = links.iter().map(|t| &t.traceparent[36..52]).collect();
        assert_eq!(ids, ["00f067aa0ba90201", "00f067aa0ba90202"]);
        assert!(pending.take_links(&traced(4)).is_empty());
    }

    #[test]
    fn links_are_bounded() {
        let mut pending = Pending::default();
        for id in 0..40 {
            pending.note(&traced(id));
        }
        assert_eq!(
            pending.take_links(&Cause::default()).len(),
            MAX_LINKED_CHANGES
        );
    }
}
