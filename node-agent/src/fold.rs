//! Complete revisions received while the agent waits for its next sync, folded into the one
//! state they bring the node to (protocol rule 12): a change that arrives during the wait is
//! synced with it, not one min-sync-period later.

use crate::node_state::{NodeState, Rejected, Revision};
use splitproxy_proto::v1alpha1 as pb;

/// Revisions received and not yet synced, folded.
#[derive(Debug, Clone, PartialEq)]
pub struct Fold {
    /// The state after the newest revision folded; its `revision` is the one to acknowledge.
    pub state: NodeState,
    /// Whether a revision folded replaced the whole state: the sync reconciles the kernel even
    /// when nothing else changed.
    pub reset: bool,
    /// How many revisions were folded.
    pub revisions: usize,
    /// The trace contexts of the revisions folded, oldest first.
    pub traces: Vec<pb::TraceContext>,
}

/// What became of a revision offered to the fold.
#[derive(Debug, PartialEq)]
pub enum Folded {
    /// It is part of the fold now.
    Taken,
    /// It builds on a state the agent dropped after a rejection; it goes unanswered.
    Stale,
}

impl Fold {
    /// Folds `revision` into `pending`, on top of what it builds on (protocol rule 12): the newest
    /// state folded, or `applied` (the state in the kernel) when that is its base, in which case
    /// what was folded before is dropped.
    ///
    /// # Errors
    ///
    /// Returns [`Rejected`] when the revision does not fit the state it builds on; `pending` is
    /// then left as it was, for the caller to drop with its answer.
    pub fn take(
        pending: &mut Option<Self>,
        applied: &NodeState,
        revision: &Revision,
    ) -> Result<Folded, Rejected> {
        let base = revision.base_revision();
        let of_stream = |state: &NodeState| {
            state.revision == base && state.epoch.as_deref() == Some(revision.epoch.as_str())
        };
        // A reset, a first revision on a presented state and a controller that keeps one
        // revision in flight send no base: the revision follows the newest state held.
        let on_pending = base == 0
            || revision.reset
            || pending.as_ref().is_some_and(|fold| of_stream(&fold.state));
        let earlier = match pending.take() {
            Some(fold) if on_pending => Some(fold),
            _ if on_pending || of_stream(applied) => None,
            kept => {
                *pending = kept;
                return Ok(Folded::Stale);
            }
        };
        let state = earlier
            .as_ref()
            .map_or(applied, |fold| &fold.state)
            .apply(revision);
        let state = match state {
            Ok(state) => state,
            Err(rejected) => {
                *pending = earlier;
                return Err(rejected);
            }
        };
        let (reset, revisions, mut traces) = earlier.map_or((false, 0, Vec::new()), |fold| {
            (fold.reset, fold.revisions, fold.traces)
        });
        traces.extend(revision.trace_context().cloned());
        *pending = Some(Self {
            state,
            reset: reset || revision.reset,
            revisions: revisions + 1,
            traces,
        });
        Ok(Folded::Taken)
    }

    /// Whether syncing the fold leaves the kernel as `applied` has it: only the node's status
    /// moved, which needs no sync slot (protocol rule 9).
    #[must_use]
    pub fn only_status_differs(&self, applied: &NodeState) -> bool {
        !self.reset
            && applied.same_rules(&self.state)
            && applied.pod_cidrs == self.state.pod_cidrs
            && applied.service_cidrs == self.state.service_cidrs
            && applied.node_ips == self.state.node_ips
    }

    /// The trace context of the newest revision folded, which the sync continues; the others'
    /// are linked.
    #[must_use]
    pub fn newest_trace(&self) -> Option<&pb::TraceContext> {
        self.traces.last()
    }
}

#[cfg(test)]
mod tests;
