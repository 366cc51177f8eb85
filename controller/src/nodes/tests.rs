use super::*;
use crate::{eligibility::TO_BE_DELETED_TAINT, testing::node};

#[test]
fn a_plain_node_is_sent_as_eligible() {
    assert_eq!(
        status(Some(&NodeInfo::of(&node(&[], false))), &[]),
        pb::NodeStatus {
            eligible: true,
            reason: String::new(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
            zone: String::new(),
        }
    );
}

#[test]
fn a_node_being_deleted_is_sent_as_ineligible_with_the_first_reason() {
    let deleting = node(&[(TO_BE_DELETED_TAINT, "NoSchedule")], true);
    assert_eq!(
        status(Some(&NodeInfo::of(&deleting)), &[]),
        pb::NodeStatus {
            eligible: false,
            reason: "the Node is being deleted".into(),
            pod_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            node_ips: Vec::new(),
            zone: String::new(),
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
            zone: String::new(),
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
