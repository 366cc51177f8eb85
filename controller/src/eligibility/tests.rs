use super::*;
use crate::testing::node;

#[test]
fn a_plain_node_is_eligible() {
    assert_eq!(Ineligible::of(&node(&[], false)), None);
}

#[test]
fn the_autoscaler_taint_makes_a_node_ineligible_whatever_its_effect() {
    for effect in ["NoSchedule", "PreferNoSchedule", "NoExecute"] {
        assert_eq!(
            Ineligible::of(&node(&[(TO_BE_DELETED_TAINT, effect)], false)),
            Some(Ineligible::ToBeDeleted),
            "{effect}"
        );
    }
}

#[test]
fn other_taints_leave_a_node_eligible() {
    let cordoned = node(
        &[
            ("node.kubernetes.io/unschedulable", "NoSchedule"),
            ("DeletionCandidateOfClusterAutoscaler", "PreferNoSchedule"),
            ("tobedeletedbyclusterautoscaler", "NoSchedule"),
        ],
        false,
    );
    assert_eq!(Ineligible::of(&cordoned), None);
}

#[test]
fn a_node_being_deleted_is_ineligible_and_says_so_first() {
    let deleting = node(&[(TO_BE_DELETED_TAINT, "NoSchedule")], true);
    assert_eq!(Ineligible::of(&deleting), Some(Ineligible::Deleting));
}
