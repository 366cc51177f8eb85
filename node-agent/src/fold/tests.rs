use super::*;

const EPOCH: &str = "e1";

/// A complete revision of `number` building on `base`, upserting a Service `demo/<name>` per
/// name (or with no key at all for `None`, which no state takes).
fn revision(number: u64, base: u64, reset: bool, names: &[Option<&str>]) -> Revision {
    let upserted_services = names
        .iter()
        .map(|name| pb::Service {
            key: name.map(|name| pb::ObjectKey {
                namespace: "demo".into(),
                name: name.into(),
            }),
            ..Default::default()
        })
        .collect();
    Revision {
        epoch: EPOCH.into(),
        number,
        reset,
        on_presented_state: false,
        parts: vec![pb::SyncResponse {
            controller_epoch: EPOCH.into(),
            revision: number,
            base_revision: base,
            reset,
            complete: true,
            upserted_services,
            trace_context: Some(pb::TraceContext {
                traceparent: format!("trace of {number}"),
                tracestate: String::new(),
            }),
            ..Default::default()
        }],
    }
}

/// The state applied after revision 1, a reset holding `demo/a`.
fn applied() -> NodeState {
    NodeState::default()
        .apply(&revision(1, 0, true, &[Some("a")]))
        .expect("a reset fits any state")
}

/// Folds `revision`, which must be taken.
fn taken(pending: &mut Option<Fold>, applied: &NodeState, revision: &Revision) {
    assert_eq!(
        Fold::take(pending, applied, revision),
        Ok(Folded::Taken),
        "revision {}",
        revision.number
    );
}

fn names(fold: &Option<Fold>) -> Vec<&str> {
    let fold = fold.as_ref().expect("something folded");
    fold.state
        .services
        .keys()
        .map(|(_, name)| name.as_str())
        .collect()
}

#[test]
fn deltas_on_the_newest_revision_folded_build_on_it_and_the_newest_is_answered() {
    let applied = applied();
    let mut pending = None;
    for (number, name) in [(2, "b"), (3, "c"), (4, "d")] {
        let delta = revision(number, number - 1, false, &[Some(name)]);
        taken(&mut pending, &applied, &delta);
    }
    assert_eq!(names(&pending), ["a", "b", "c", "d"]);
    let fold = pending.expect("folded");
    assert_eq!(
        (fold.state.revision, fold.revisions, fold.reset),
        (4, 3, false)
    );
    let newest = fold.newest_trace().map(|t| t.traceparent.as_str());
    assert_eq!(newest, Some("trace of 4"));
    assert_eq!(fold.traces.len(), 3, "the older traces are kept for links");
}

#[test]
fn a_delta_on_the_applied_revision_replaces_what_was_folded() {
    let applied = applied();
    let mut pending = None;
    let dropped = revision(2, 1, false, &[Some("b")]);
    taken(&mut pending, &applied, &dropped);
    // After a NACK the controller sends the next delta from the view acknowledged.
    let rebased = revision(4, 1, false, &[Some("c")]);
    taken(&mut pending, &applied, &rebased);
    assert_eq!(names(&pending), ["a", "c"]);
    assert_eq!(
        pending.map(|f| (f.state.revision, f.revisions)),
        Some((4, 1))
    );
}

#[test]
fn a_delta_on_a_dropped_state_is_stale_and_changes_nothing() {
    let applied = applied();
    let mut pending = None;
    // Revision 2 was rejected and dropped; 3 was built on it before the controller knew.
    let stale = revision(3, 2, false, &[Some("c")]);
    assert_eq!(
        Fold::take(&mut pending, &applied, &stale),
        Ok(Folded::Stale)
    );
    assert_eq!(pending, None);

    let kept = revision(4, 1, false, &[Some("d")]);
    taken(&mut pending, &applied, &kept);
    let before = pending.clone();
    assert_eq!(
        Fold::take(&mut pending, &applied, &stale),
        Ok(Folded::Stale)
    );
    assert_eq!(pending, before);
}

#[test]
fn a_delta_of_another_epoch_with_the_same_base_number_is_stale() {
    let applied = applied();
    let mut pending = None;
    let mut other = revision(2, 1, false, &[Some("b")]);
    other.epoch = "e2".into();
    assert_eq!(
        Fold::take(&mut pending, &applied, &other),
        Ok(Folded::Stale)
    );
}

#[test]
fn without_a_base_a_revision_follows_the_newest_state_as_under_one_in_flight() {
    let applied = applied();
    let mut pending = None;
    for (number, name) in [(2, "b"), (3, "c")] {
        let delta = revision(number, 0, false, &[Some(name)]);
        taken(&mut pending, &applied, &delta);
    }
    assert_eq!(names(&pending), ["a", "b", "c"]);
}

#[test]
fn a_reset_folded_replaces_everything_and_the_sync_reconciles() {
    let applied = applied();
    let mut pending = None;
    let delta = revision(2, 1, false, &[Some("b")]);
    taken(&mut pending, &applied, &delta);
    let reset = revision(3, 0, true, &[Some("z")]);
    taken(&mut pending, &applied, &reset);
    assert_eq!(names(&pending), ["z"]);
    let after = revision(4, 3, false, &[Some("y")]);
    taken(&mut pending, &applied, &after);
    assert!(pending.is_some_and(|fold| fold.reset && fold.revisions == 3));
}

#[test]
fn a_revision_that_does_not_fit_is_refused_and_leaves_the_fold_as_it_was() {
    let applied = applied();
    let mut pending = None;
    let delta = revision(2, 1, false, &[Some("b")]);
    taken(&mut pending, &applied, &delta);
    let before = pending.clone();
    let keyless = revision(3, 2, false, &[None]);
    assert_eq!(
        Fold::take(&mut pending, &applied, &keyless),
        Err(Rejected::MissingKey)
    );
    assert_eq!(pending, before);
}

#[test]
fn a_fold_that_changes_only_the_status_leaves_the_kernel_alone() {
    let applied = applied();
    let mut pending = None;
    let mut status = revision(2, 1, false, &[]);
    status.parts[0].node_status = Some(pb::NodeStatus {
        eligible: true,
        ..Default::default()
    });
    taken(&mut pending, &applied, &status);
    assert!(
        pending
            .as_ref()
            .is_some_and(|f| f.only_status_differs(&applied))
    );

    let service = revision(3, 2, false, &[Some("b")]);
    taken(&mut pending, &applied, &service);
    assert!(pending.is_some_and(|f| !f.only_status_differs(&applied)));
}
