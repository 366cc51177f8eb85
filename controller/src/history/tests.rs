use super::*;

fn changes(service: &str) -> ChangeSet {
    ChangeSet {
        services: BTreeSet::from([("demo".to_owned(), service.to_owned())]),
        ..ChangeSet::default()
    }
}

fn names(changes: &ChangeSet) -> Vec<&str> {
    changes.services.iter().map(|(_, n)| n.as_str()).collect()
}

#[test]
fn the_changes_since_a_generation_are_the_union_of_the_later_ones() {
    let history = History::default()
        .next(changes("a"))
        .next(changes("b"))
        .next(changes("c"));
    assert_eq!(history.generation(), 3);
    assert_eq!(names(&history.since(1).expect("within reach")), ["b", "c"]);
    assert_eq!(
        names(&history.since(0).expect("within reach")),
        ["a", "b", "c"]
    );
    assert!(history.since(3).expect("the same generation").is_empty());
    // One generation back is the latest change set itself, not a copy.
    let latest = history.since(2).expect("within reach");
    assert!(std::ptr::eq(
        &*latest,
        history.latest().expect("a change set")
    ));
    assert_eq!(history.since(4), None, "a generation after this one");
}

#[test]
fn a_generation_older_than_the_history_is_out_of_reach() {
    let mut history = History::default();
    for i in 0..HISTORY_LENGTH + 10 {
        history = history.next(changes(&format!("s{i}")));
    }
    let newest = history.generation();
    let oldest_reachable = newest - HISTORY_LENGTH as u64;
    assert_eq!(
        history.since(oldest_reachable).map(|c| c.services.len()),
        Some(HISTORY_LENGTH)
    );
    assert_eq!(history.since(oldest_reachable - 1), None);
}

#[test]
fn changed_keys_are_those_added_removed_or_with_entries_that_differ() {
    let a: OrdMap<i32, &str> =
        OrdMap::from_iter([(1, "kept"), (2, "removed"), (3, "before"), (5, "kept")]);
    let b: OrdMap<i32, &str> = OrdMap::from_iter([
        (0, "added"),
        (1, "kept"),
        (3, "after"),
        (5, "kept"),
        (9, "added"),
    ]);
    let changed = changed_keys(&a, &b);
    assert_eq!(changed, BTreeSet::from([0, 2, 3, 9]));
    assert!(changed_keys(&a, &a).is_empty());
}

#[test]
fn changed_keys_between_maps_sharing_most_of_their_parts_are_exactly_those_patched() {
    // Each state patches the one before, as the builder does: every key in turn. (imbl 6.1's
    // diff missed some of these; 7.0.2 fixed it.)
    let mut before: OrdMap<u32, u32> = (0..2_000_u32).map(|i| (i, i)).collect();
    for key in 0..2_000_u32 {
        let mut after = before.clone();
        after.insert(key, key + 1);
        if key % 3 == 0 {
            after.remove(&(key / 2));
        }
        let mut expected = BTreeSet::from([key]);
        if key % 3 == 0 && before.contains_key(&(key / 2)) {
            expected.insert(key / 2);
        }
        assert_eq!(changed_keys(&before, &after), expected, "key {key}");
        before = after;
    }
}
