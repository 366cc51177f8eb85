//! Which entries two persistent maps differ in, found without looking inside the entries they
//! share: states are `imbl` maps of `Arc`s, and a revision replaces only the entries it changes,
//! so comparing two states costs a pointer comparison per unchanged entry.

use imbl::OrdMap;
use std::{cmp::Ordering, sync::Arc};

/// Keys whose entry differs between `before` and `after` (added, changed or removed), in key
/// order: a walk of both maps in step, where entries the two share are equal without a look
/// inside. (Not `OrdMap::diff`: imbl 6.1's misses some changed entries.)
pub fn changed_keys<'a, K: Ord + Clone, V: PartialEq>(
    before: &'a OrdMap<K, Arc<V>>,
    after: &'a OrdMap<K, Arc<V>>,
) -> impl Iterator<Item = &'a K> {
    let same_map = before.ptr_eq(after);
    let mut before = before.iter().peekable();
    let mut after = after.iter().peekable();
    std::iter::from_fn(move || {
        if same_map {
            return None;
        }
        loop {
            match (before.peek().copied(), after.peek().copied()) {
                (None, None) => return None,
                (Some((key, _)), None) => {
                    before.next();
                    return Some(key);
                }
                (None, Some((key, _))) => {
                    after.next();
                    return Some(key);
                }
                (Some((old_key, old)), Some((new_key, new))) => match old_key.cmp(new_key) {
                    Ordering::Less => {
                        before.next();
                        return Some(old_key);
                    }
                    Ordering::Greater => {
                        after.next();
                        return Some(new_key);
                    }
                    Ordering::Equal => {
                        before.next();
                        after.next();
                        if !(Arc::ptr_eq(old, new) || old == new) {
                            return Some(new_key);
                        }
                    }
                },
            }
        }
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
        // imbl 6.1's OrdMap::diff misses some of these; the walk must not.
        let before: OrdMap<u32, Arc<u32>> = (0..2_000).map(|i| (i, Arc::new(i))).collect();
        for changed in (0..2_000).step_by(7) {
            let mut after = before.clone();
            after.insert(changed, Arc::new(changed + 1));
            assert_eq!(
                changed_keys(&before, &after).collect::<Vec<_>>(),
                [&changed]
            );
        }
    }
}
