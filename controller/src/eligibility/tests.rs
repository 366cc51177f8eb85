use super::*;
use k8s_openapi::{
    api::core::v1::{NodeSpec, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};

fn node(taints: &[(&str, &str)], deleting: bool) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some("node-1".into()),
            deletion_timestamp: deleting.then_some(Time(Timestamp::UNIX_EPOCH)),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(key, effect)| Taint {
                        key: (*key).into(),
                        effect: (*effect).into(),
                        ..Taint::default()
                    })
                    .collect(),
            ),
            ..NodeSpec::default()
        }),
        status: None,
    }
}

#[test]
fn a_plain_node_is_eligible() {
    assert_eq!(Ineligible::of(&node(&[], false)), None);
    assert_eq!(
        status(Some(&NodeInfo::of(&node(&[], false))), &[]),
        pb::NodeStatus {
            eligible: true,
            reason: String::new(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
        }
    );
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
    assert_eq!(
        status(Some(&NodeInfo::of(&deleting)), &[]),
        pb::NodeStatus {
            eligible: false,
            reason: "the Node is being deleted".into(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
        }
    );
}

#[test]
fn an_unknown_node_is_ineligible() {
    assert_eq!(
        status(None, &[]),
        pb::NodeStatus {
            eligible: false,
            reason: "no Node object of this name is known".into(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
        }
    );
}

#[test]
fn the_status_passes_the_pod_cidrs_on_from_either_field() {
    let mut dual = node(&[], false);
    if let Some(spec) = dual.spec.as_mut() {
        spec.pod_cidr = Some("10.244.1.0/24".into());
        spec.pod_cidrs = Some(vec!["10.244.1.0/24".into(), "fd00:1::/64".into()]);
    }
    assert_eq!(
        status(Some(&NodeInfo::of(&dual)), &[]).pod_cidrs,
        ["10.244.1.0/24", "fd00:1::/64"]
    );
    let mut old = node(&[], false);
    if let Some(spec) = old.spec.as_mut() {
        spec.pod_cidr = Some("10.244.2.0/24".into());
    }
    assert_eq!(
        status(Some(&NodeInfo::of(&old)), &[]).pod_cidrs,
        ["10.244.2.0/24"]
    );
}
