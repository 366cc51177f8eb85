//! Which entries two persistent maps differ in, found without looking at the parts they share:
//! states are `imbl` maps of `Arc`s, and a revision replaces only the entries it changes, so
//! comparing two states costs in proportion to the change, not to the state.

use imbl::{OrdMap, ordmap::DiffItem};
use std::sync::Arc;

/// Keys whose entry differs between `before` and `after` (added, changed or removed), in key
/// order. `OrdMap::diff` skips the subtrees both maps share; an entry equal in a new `Arc` is no
/// change. (It needs imbl 7.0.2: 6.1's missed changes that follow shared subtrees.)
pub fn changed_keys<'a, K: Ord + Clone, V: PartialEq>(
    before: &'a OrdMap<K, Arc<V>>,
    after: &'a OrdMap<K, Arc<V>>,
) -> impl Iterator<Item = &'a K> {
    before.diff(after).map(|change| match change {
        DiffItem::Add(key, _)
        | DiffItem::Remove(key, _)
        | DiffItem::Update { new: (key, _), .. } => key,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: impl IntoIterator<Item = (u32, &'static str)>) -> OrdMap<u32, Arc<String>> {
        entries
            .into_iter()
            .map(|(k, v)| (k, Arc::new(v.to_owned())))
            .collect()
    }

    #[test]
    fn added_changed_and_removed_keys_are_found_in_order() {
        let before = map([(1, "a"), (2, "b"), (3, "c"), (5, "e")]);
        let mut after = before.clone();
        after.remove(&1);
        after.insert(2, Arc::new("B".to_owned()));
        after.insert(4, Arc::new("d".to_owned()));
        // An equal value in a new Arc is no change.
        after.insert(5, Arc::new("e".to_owned()));
        assert_eq!(
            changed_keys(&before, &after).collect::<Vec<_>>(),
            [&1, &2, &4]
        );
        assert_eq!(
            changed_keys(&after, &before).collect::<Vec<_>>(),
            [&1, &2, &4]
        );
        assert_eq!(changed_keys(&before, &before.clone()).count(), 0);
    }

    #[test]
    fn one_changed_entry_among_thousands_is_found() {
        // imbl 6.1's OrdMap::diff missed some of these.
        let mut before: OrdMap<u32, Arc<u32>> = (0..2_000).map(|i| (i, Arc::new(i))).collect();
        for changed in 0..2_000 {
            let mut after = before.clone();
            after.insert(changed, Arc::new(changed + 1));
            assert_eq!(
                changed_keys(&before, &after).collect::<Vec<_>>(),
                [&changed]
            );
            before = after;
        }
    }
}
