//! One Service's chains, affinity sets and elements, port by port, as kube-proxy's nftables
//! `syncProxyRules` writes them.
//!
//! Per port, from its `PortPlan`:
//!
//! * `service-…` (cluster policy) and `local-…` (local policy) pick an endpoint at random with one
//!   `numgen random mod N` lookup: without session affinity, a DNAT to the endpoint under
//!   `numgen random mod N offset K` in the port's shared endpoint map (its numbers `K … K+N-1`
//!   from [`Numbering`]); with it, a rule per endpoint sending clients found in its `affinity-…`
//!   set to its `endpoint-…` chain, then upstream's verdict map over those chains. An
//!   `endpoint-…` chain records the client in the set (which forgets it after the timeout) and
//!   DNATs.
//! * `external-…` handles node ports, external IPs and load-balancer IPs: masquerade and go on to
//!   `service-…`; under `externalTrafficPolicy: Local`, pod traffic (from the cluster CIDR) goes
//!   to `service-…` as if it had come back from a load balancer, the node's own traffic is
//!   masqueraded and goes there too, and the rest stays on this node (`local-…`) with its client
//!   IP.
//! * `firewall-…` drops load-balancer traffic from outside `loadBalancerSourceRanges` (and, when
//!   a range holds the node's IP, also accepts the load-balancer IPs themselves as sources).
//!   Unlike the iptables mode, it applies whether or not the port has endpoints, as upstream.
//! * Elements: the endpoints in the port's endpoint map; the cluster IP in `cluster-ips`; each
//!   destination in `service-ips` or `service-nodeports` when some endpoint can take it, and in
//!   `no-endpoint-services` or `no-endpoint-nodeports` (reject when the port has no endpoint at
//!   all, drop when only a `Local` policy finds none) when not; the load-balancer IPs with source
//!   ranges in `firewall-ips`; each endpoint on this node in `hairpin-connections`.
//!
//! Cluster-IP masquerading happens for every Service at once in the fixed `services` chain, and
//! hairpin masquerading in `masquerading`, so the per-port chains hold no masquerade rule but the
//! external one.

use super::{AffinitySet, Chain, Container, Element, Numbering, Options, ServiceRules, Slot};
use crate::nftables::names::{
    AFFINITY_PREFIX, ENDPOINT_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, LOCAL_PREFIX,
    SERVICE_PREFIX, endpoint_base, endpoint_map, port_base,
};
use crate::nftables::render::skeleton::REJECT_CHAIN;
use crate::nftables::script::family_keyword;
use crate::port_plan::PortPlan;
use crate::{Endpoint, Service, TrafficPolicy};
use std::fmt::Write as _;
use std::sync::Arc;

/// Renders `service` for `options`' family, its chains' endpoint ranges from `numbering`;
/// nothing without a cluster IP of the family.
pub(super) fn render(
    service: &Service,
    options: &Options,
    numbering: &mut Numbering<'_>,
) -> ServiceRules {
    let family = options.family();
    let mut rules = ServiceRules::default();
    if !service.cluster_ips.iter().any(|ip| family.contains(ip)) {
        return rules;
    }
    for port in &service.ports {
        let plan = PortPlan::new(service, port, family);
        Port::new(service, &plan, options).render(&mut rules, numbering);
    }
    rules
}

/// One port being rendered: its plan and the names it needs.
struct Port<'p, 'a> {
    service: &'a Service,
    plan: &'p PortPlan<'a>,
    options: &'p Options,
    /// `ip` or `ip6`.
    ip: &'static str,
    base: String,
}

impl<'p, 'a> Port<'p, 'a> {
    fn new(service: &'a Service, plan: &'p PortPlan<'a>, options: &'p Options) -> Self {
        Self {
            service,
            plan,
            options,
            ip: family_keyword(options.family()),
            base: port_base(&service.key, plan.port.protocol, &plan.port.name),
        }
    }

    fn chain(&self, prefix: &str) -> String {
        let mut name = String::with_capacity(prefix.len() + self.base.len());
        name.push_str(prefix);
        name.push_str(&self.base);
        name
    }

    /// The base of `endpoint`'s `endpoint-…` chain and `affinity-…` set.
    fn endpoint_base(&self, endpoint: &Endpoint) -> String {
        endpoint_base(
            &self.service.key,
            self.plan.port.protocol,
            &self.plan.port.name,
            endpoint.ip,
            endpoint.port,
        )
    }

    /// `{address} . {protocol} . {port}`, a `service-ips`-style key.
    fn address_key(&self, address: impl std::fmt::Display) -> Arc<str> {
        format!("{address} . {} . {}", self.plan.proto, self.plan.port.port).into()
    }

    fn render(&self, out: &mut ServiceRules, numbering: &mut Numbering<'_>) {
        let plan = self.plan;
        // Names within one port never repeat; only an earlier port of the same name can clash.
        let earlier_chains = out.chains.len();
        let earlier_sets = out.sets.len();
        let proto = plan.proto;
        let cluster_chain = self.chain(SERVICE_PREFIX);
        let local_chain = self.chain(LOCAL_PREFIX);
        let external_chain = self.chain(EXTERNAL_PREFIX);
        let firewall_chain = self.chain(FIREWALL_PREFIX);
        let internal_policy_local = self.service.internal_traffic_policy == TrafficPolicy::Local;
        let uses_firewall = !plan.load_balancer_ips.is_empty() && !plan.source_ranges.is_empty();

        // Verdicts for destinations no endpoint takes.
        let (internal_verdict, external_verdict) = if plan.has_endpoints {
            ("drop".to_owned(), "drop".to_owned())
        } else {
            let reject = format!("goto {REJECT_CHAIN}");
            (reject.clone(), reject)
        };
        let goto = |chain: &str| Some(format!("goto {chain}"));
        let no_endpoints = |verdict: &str| Some(verdict.to_owned());
        let comment = Some(plan.port_name.clone());

        // Chains, in a fixed order: service, local, external, firewall, then the endpoints'.
        let spreads = [
            (
                plan.uses_cluster_chain,
                &cluster_chain,
                &plan.cluster_endpoints,
            ),
            (plan.uses_local_chain, &local_chain, &plan.local_endpoints),
        ];
        for (used, chain, endpoints) in spreads {
            if used && !has_chain(out, earlier_chains, chain) {
                let rules = self.spread(chain, endpoints, out, numbering);
                out.chains.push(Chain {
                    name: chain.clone(),
                    rules,
                });
            }
        }
        if plan.uses_external_chain {
            let rules = self.external_rules(&cluster_chain, &local_chain);
            push_chain(out, earlier_chains, external_chain.clone(), rules);
        }
        if uses_firewall {
            push_chain(
                out,
                earlier_chains,
                firewall_chain.clone(),
                vec![self.firewall_rule()],
            );
        }
        if let Some(timeout_seconds) = plan.affinity_seconds {
            for endpoint in &plan.reachable {
                let base = self.endpoint_base(endpoint);
                let set = format!("{AFFINITY_PREFIX}{base}");
                let rules = vec![
                    format!("update @{set} {{ {} saddr }}", self.ip),
                    format!("meta l4proto {proto} dnat to {}", endpoint.socket_string()),
                ];
                push_chain(
                    out,
                    earlier_chains,
                    format!("{ENDPOINT_PREFIX}{base}"),
                    rules,
                );
                if !out.sets[..earlier_sets]
                    .iter()
                    .any(|existing| existing.name == set)
                {
                    out.sets.push(AffinitySet {
                        name: set,
                        timeout_seconds,
                    });
                }
            }
        }

        // Elements: cluster IPs, external IPs, load-balancer IPs, node port, hairpins.
        let internal_chain = if internal_policy_local {
            &local_chain
        } else {
            &cluster_chain
        };
        for ip in &plan.cluster_ips {
            push_element(
                out,
                Container::ClusterIps,
                ip.to_string().into(),
                None,
                None,
            );
            let key = self.address_key(ip);
            if plan.has_internal_endpoints {
                push_element(out, Container::ServiceIps, key, None, goto(internal_chain));
            } else {
                push_element(
                    out,
                    Container::NoEndpointServices,
                    key,
                    comment.clone(),
                    no_endpoints(&internal_verdict),
                );
            }
        }
        // External and load-balancer IPs alike; only the latter are behind the source-range
        // firewall.
        let external = plan.external_ips.iter().map(|ip| (ip, false));
        let load_balancers = plan.load_balancer_ips.iter().map(|ip| (ip, uses_firewall));
        for (ip, firewalled) in external.chain(load_balancers) {
            let key = self.address_key(ip);
            if plan.has_endpoints {
                push_element(
                    out,
                    Container::ServiceIps,
                    Arc::clone(&key),
                    None,
                    goto(&external_chain),
                );
            }
            if firewalled {
                push_element(
                    out,
                    Container::FirewallIps,
                    Arc::clone(&key),
                    None,
                    goto(&firewall_chain),
                );
            }
            if !plan.has_external_endpoints {
                push_element(
                    out,
                    Container::NoEndpointServices,
                    key,
                    comment.clone(),
                    no_endpoints(&external_verdict),
                );
            }
        }
        if let Some(node_port) = plan.port.node_port {
            let key: Arc<str> = format!("{proto} . {node_port}").into();
            if plan.has_endpoints {
                push_element(
                    out,
                    Container::ServiceNodePorts,
                    Arc::clone(&key),
                    None,
                    goto(&external_chain),
                );
            }
            if !plan.has_external_endpoints {
                push_element(
                    out,
                    Container::NoEndpointNodePorts,
                    key,
                    comment,
                    no_endpoints(&external_verdict),
                );
            }
        }
        for endpoint in plan.reachable.iter().filter(|endpoint| endpoint.is_local) {
            let key = format!(
                "{ip} . {ip} . {proto} . {port}",
                ip = endpoint.ip,
                port = endpoint.port
            );
            push_element(out, Container::HairpinConnections, key.into(), None, None);
        }
    }

    /// The rules of `chain` (a `service-…` or `local-…` one) spreading over `endpoints`; without
    /// affinity, the endpoints go into the port's endpoint map, at numbers from `numbering`.
    fn spread(
        &self,
        chain: &str,
        endpoints: &[&Endpoint],
        out: &mut ServiceRules,
        numbering: &mut Numbering<'_>,
    ) -> Vec<String> {
        let count = endpoints.len();
        let ip = self.ip;
        if self.plan.affinity_seconds.is_none() {
            let map = endpoint_map(self.plan.port.protocol, &self.base);
            // A port has at most a few thousand endpoints.
            let len = u32::try_from(count).unwrap_or(u32::MAX);
            let offset = numbering.offset(chain, map, len);
            for (number, endpoint) in (offset..).zip(endpoints) {
                // Distinct numbers: no other element of the Service has the key.
                out.elements.push(Element {
                    container: Container::Endpoints(map),
                    key: number.to_string().into(),
                    comment: None,
                    value: Some(format!("{} . {}", endpoint.ip, endpoint.port)),
                });
            }
            out.slots.push(Slot {
                chain: chain.to_owned(),
                map,
                offset,
                len,
            });
            return vec![format!(
                "meta l4proto {} dnat {ip} addr . port to numgen random mod {count} offset {offset} map @{map}",
                self.plan.proto
            )];
        }
        let mut rules = Vec::with_capacity(count + 1);
        let mut vmap = format!("numgen random mod {count} vmap {{ ");
        for (i, endpoint) in endpoints.iter().enumerate() {
            let base = self.endpoint_base(endpoint);
            rules.push(format!(
                "{ip} saddr @{AFFINITY_PREFIX}{base} goto {ENDPOINT_PREFIX}{base}"
            ));
            let separator = if i == 0 { "" } else { " , " };
            let _ = write!(vmap, "{separator}{i} : goto {ENDPOINT_PREFIX}{base}");
        }
        vmap.push_str(" }");
        rules.push(vmap);
        rules
    }

    /// The rules of the `external-…` chain.
    fn external_rules(&self, cluster_chain: &str, local_chain: &str) -> Vec<String> {
        let mut rules = Vec::with_capacity(4);
        let plan = self.plan;
        if plan.external_policy_local {
            if let Some(local) = &self.options.common().local {
                rules.push(format!(
                    "{} goto {cluster_chain} comment \"short-circuit pod traffic\"",
                    local.nft()
                ));
            }
            rules.push(format!(
                "fib saddr type local mark set mark or {} comment \"masquerade local traffic\"",
                self.options.common().masquerade_mark
            ));
            rules.push(format!(
                "fib saddr type local goto {cluster_chain} comment \"short-circuit local traffic\""
            ));
        } else {
            rules.push(format!(
                "mark set mark or {} comment \"masquerade\"",
                self.options.common().masquerade_mark
            ));
        }
        if plan.has_external_endpoints {
            let policy_chain = if plan.external_policy_local {
                local_chain
            } else {
                cluster_chain
            };
            rules.push(format!("goto {policy_chain}"));
        }
        rules
    }

    /// The `firewall-…` chain's rule: drop sources outside the ranges.
    fn firewall_rule(&self) -> String {
        let plan = self.plan;
        let node_ips = &self.options.common().node_ips;
        let allow_from_node = plan
            .source_ranges
            .iter()
            .any(|range| node_ips.iter().any(|ip| range.contains(*ip)));
        let mut rule = format!("{} saddr != {{ ", self.ip);
        let mut first = true;
        let mut push = |source: &dyn std::fmt::Display| {
            let separator = if first { "" } else { " , " };
            first = false;
            // Writing to a String cannot fail.
            let _ = write!(rule, "{separator}{source}");
        };
        for range in &plan.source_ranges {
            push(&range.network());
        }
        if allow_from_node {
            for ip in &plan.load_balancer_ips {
                push(ip);
            }
        }
        rule.push_str(" } drop");
        rule
    }
}

/// Whether one of the Service's first `earlier` chains is named `name` (ports sharing a name
/// share chains).
fn has_chain(out: &ServiceRules, earlier: usize, name: &str) -> bool {
    out.chains[..earlier].iter().any(|chain| chain.name == name)
}

/// Adds chain `name` unless one of the Service's first `earlier` chains has its name.
fn push_chain(out: &mut ServiceRules, earlier: usize, name: String, rules: Vec<String>) {
    if !has_chain(out, earlier, &name) {
        out.chains.push(Chain { name, rules });
    }
}

/// Adds an element unless the Service has one of that key in `container` already (a cluster IP
/// is in `cluster-ips` once however many ports it has).
fn push_element(
    out: &mut ServiceRules,
    container: Container,
    key: Arc<str>,
    comment: Option<String>,
    value: Option<String>,
) {
    if out
        .elements
        .iter()
        .any(|element| element.container == container && element.key == key)
    {
        return;
    }
    out.elements.push(Element {
        container,
        key,
        comment,
        value,
    });
}
