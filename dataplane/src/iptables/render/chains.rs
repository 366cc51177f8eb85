//! One Service port's iptables chains, on top of the mode-neutral [`PortPlan`]: the names of its
//! `KUBE-SVC-…`, `KUBE-SVL-…`, `KUBE-EXT-…` and `KUBE-FW-…` chains, which of them each kind of
//! traffic goes to, and the filter verdict for traffic no endpoint takes.

use super::super::chain_names::{
    external_chain, firewall_chain, local_service_chain, service_chain,
};
use super::{comment, reject};
use crate::port_plan::PortPlan;
use std::ops::Deref;

/// A port's [`PortPlan`] and its iptables chain names.
pub(crate) struct PortChains<'a> {
    /// What every mode decides for the port.
    pub plan: PortPlan<'a>,
    /// `KUBE-SVC-…`.
    pub cluster_chain: String,
    /// `KUBE-SVL-…`.
    pub local_chain: String,
    /// `KUBE-EXT-…`.
    pub external_chain: String,
    /// `KUBE-FW-…`.
    pub firewall_chain: String,
}

impl<'a> PortChains<'a> {
    /// Names `plan`'s chains (hashed from `ns/name:port` and the protocol, as upstream's).
    pub fn new(plan: PortPlan<'a>) -> Self {
        let (name, protocol) = (&plan.port_name, plan.port.protocol);
        Self {
            cluster_chain: service_chain(name, protocol),
            local_chain: local_service_chain(name, protocol),
            external_chain: external_chain(name, protocol),
            firewall_chain: firewall_chain(name, protocol),
            plan,
        }
    }

    /// Where cluster-IP traffic goes (upstream's `internalTrafficChain`).
    pub fn internal_chain(&self) -> &str {
        if self.plan.internal_policy_local {
            &self.local_chain
        } else {
            &self.cluster_chain
        }
    }

    /// Where external traffic ends up after `KUBE-EXT-…` (upstream's `externalPolicyChain`).
    pub fn external_policy_chain(&self) -> &str {
        if self.plan.external_policy_local {
            &self.local_chain
        } else {
            &self.cluster_chain
        }
    }

    /// Where load-balancer IP traffic goes: through the source-range filter when there is one.
    pub fn load_balancer_chain(&self) -> &str {
        if self.plan.uses_firewall_chain {
            &self.firewall_chain
        } else {
            &self.external_chain
        }
    }

    /// The filter verdict and comment for traffic no endpoint takes: REJECT when the port has no
    /// endpoint at all (with the family's ICMP error), DROP when only a `Local` policy finds none.
    pub fn no_endpoint_verdict(&self) -> (&'static str, String) {
        if self.plan.has_endpoints {
            (
                "DROP",
                comment(&format!("{} has no local endpoints", self.plan.port_name)),
            )
        } else {
            (
                reject(self.plan.family),
                comment(&format!("{} has no endpoints", self.plan.port_name)),
            )
        }
    }
}

/// The renderers read a port's decisions through its chains: the chains add names to the plan,
/// they change none of its decisions.
impl<'a> Deref for PortChains<'a> {
    type Target = PortPlan<'a>;

    fn deref(&self) -> &PortPlan<'a> {
        &self.plan
    }
}
