// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// splitproxy's load balancer for packets from outside the node: tc programs on the devices
// that take its node ports. The socket programs (sock.c) serve the node's own processes at
// connect(); a client elsewhere has no socket here, so its packets are translated instead.
//
//   sp_from_outside (ingress)  a TCP or UDP packet to a Service address and port of the outside
//                              scope (node ports, external and load-balancer IPs) goes to one
//                              endpoint: its connection's, else (under session affinity)
//                              the client's last one, else one chosen at random. The
//                              destination is rewritten and, under externalTrafficPolicy
//                              Cluster, the packet carries the masquerade mark, which the
//                              node's one masquerade rule acts on, as kube-proxy's do. A port
//                              whose endpoints are all elsewhere under externalTrafficPolicy
//                              Local drops; one without endpoints is left to the node, which
//                              refuses it (nothing listens there), as kube-proxy's REJECT does.
//   sp_to_outside (egress)     an endpoint's reply leaving for such a client reads as the
//                              Service address and port again.
//
// The kernel's connection tracking sees the translated packets, so it carries the masquerade
// and its reversal; these programs keep only which endpoint each connection went to, how to
// translate its replies back and, under session affinity, each client's last endpoint, in LRU
// maps (a connection long gone leaves first).
//
// Frames with an Ethernet header only; SCTP (its checksum covers the ports) and IPv4 fragments
// after the first (no ports) pass untouched. The maps' layout is the agent's
// (dataplane/src/ebpf/layout.rs).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <stddef.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "services.h"

// The mark the node's masquerade rule matches; the agent sets it at load
// (--iptables-masquerade-bit).
volatile const __u32 masquerade_mark = 0x4000;

// A packet's addresses, ports and protocol: keys of the connections' maps as packets show them.
struct tuple {
	struct address source;
	struct address destination;
	__be16 source_port;
	__be16 destination_port;
	__u8 protocol;
	__u8 pad[3];
};

// A connection from outside, keyed as its packets arrive (the client, then the Service address
// and port it is aimed at): the endpoint it goes to.
struct flow_value {
	struct address endpoint;
	__be16 port;
	__u16 flags;  // SP_MASQUERADE
};

// The same connection's replies, keyed as they leave the node (the endpoint, then the client):
// the Service address and port they must come from.
struct reply_value {
	struct address frontend;
	__be16 port;
	__u16 pad;
};

// Under session affinity, an outside client's endpoint for a Service address and port.
struct affinity_key {
	struct address client;
	struct address frontend;
	__be16 port;
	__u8 protocol;
	__u8 pad;
};

SP_LRU_MAP(sp_flows, struct tuple, struct flow_value);

SP_LRU_MAP(sp_replies, struct tuple, struct reply_value);

// Each outside client's endpoint per Service address and port, under session affinity.
SP_LRU_MAP(sp_outside_affinity, struct affinity_key, struct affinity_value);

// A packet's tuple, its family and where its transport header starts.
struct packet {
	struct tuple tuple;
	__u8 ipv6;
	__u32 l4;
};

#define L3 ETH_HLEN

// Reads the packet's addresses and ports; 0 for one these programs leave alone.
static __always_inline int parse(struct __sk_buff *skb, struct packet *p)
{
	__be16 ports[2];

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;

		if (bpf_skb_load_bytes(skb, L3, &ip, sizeof(ip)) || ip.ihl < 5)
			return 0;
		if (ip.frag_off & bpf_htons(0x1fff))
			return 0;
		p->ipv6 = 0;
		p->tuple.protocol = ip.protocol;
		p->tuple.source.word[2] = bpf_htonl(0xffff);
		p->tuple.source.word[3] = ip.saddr;
		p->tuple.destination.word[2] = bpf_htonl(0xffff);
		p->tuple.destination.word[3] = ip.daddr;
		p->l4 = L3 + ip.ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip;

		if (bpf_skb_load_bytes(skb, L3, &ip, sizeof(ip)))
			return 0;
		p->ipv6 = 1;
		p->tuple.protocol = ip.nexthdr;
		__builtin_memcpy(&p->tuple.source, &ip.saddr, sizeof(p->tuple.source));
		__builtin_memcpy(&p->tuple.destination, &ip.daddr, sizeof(p->tuple.destination));
		p->l4 = L3 + sizeof(ip);
	} else {
		return 0;
	}
	if (p->tuple.protocol != IPPROTO_TCP && p->tuple.protocol != IPPROTO_UDP)
		return 0;
	if (bpf_skb_load_bytes(skb, p->l4, ports, sizeof(ports)))
		return 0;
	p->tuple.source_port = ports[0];
	p->tuple.destination_port = ports[1];
	return 1;
}

static __always_inline int is_mapped(struct address *a)
{
	return a->word[0] == 0 && a->word[1] == 0 && a->word[2] == bpf_htonl(0xffff);
}

// Rewrites the packet's destination (else its source) to `to` and `port`, checksums with it.
static __always_inline int rewrite(struct __sk_buff *skb, struct packet *p, int destination,
				   struct address to, __be16 port)
{
	struct tuple *t = &p->tuple;
	struct address from = destination ? t->destination : t->source;
	__be16 from_port = destination ? t->destination_port : t->source_port;
	__u32 check = p->l4 + (t->protocol == IPPROTO_TCP ? offsetof(struct tcphdr, check)
							  : offsetof(struct udphdr, check));
	// An IPv4 UDP checksum of 0 means none: it stays 0.
	__u64 mangled = (!p->ipv6 && t->protocol == IPPROTO_UDP) ? BPF_F_MARK_MANGLED_0 : 0;

	if (p->ipv6) {
		__u32 at = L3 + (destination ? offsetof(struct ipv6hdr, daddr)
					     : offsetof(struct ipv6hdr, saddr));
		__s64 diff = bpf_csum_diff(from.word, sizeof(from), to.word, sizeof(to), 0);

		if (diff < 0 || bpf_l4_csum_replace(skb, check, 0, diff, BPF_F_PSEUDO_HDR) ||
		    bpf_skb_store_bytes(skb, at, &to, sizeof(to), 0))
			return 0;
	} else {
		__u32 at = L3 + (destination ? offsetof(struct iphdr, daddr)
					     : offsetof(struct iphdr, saddr));

		if (bpf_l4_csum_replace(skb, check, from.word[3], to.word[3],
					BPF_F_PSEUDO_HDR | mangled | sizeof(__be32)) ||
		    bpf_l3_csum_replace(skb, L3 + offsetof(struct iphdr, check), from.word[3],
					to.word[3], sizeof(__be32)) ||
		    bpf_skb_store_bytes(skb, at, &to.word[3], sizeof(__be32), 0))
			return 0;
	}
	if (port != from_port &&
	    (bpf_l4_csum_replace(skb, check, from_port, port, mangled | sizeof(port)) ||
	     bpf_skb_store_bytes(skb, p->l4 + (destination ? 2 : 0), &port, sizeof(port), 0)))
		return 0;
	return 1;
}

// The endpoint for a new connection from `client` to the outside entry `key` names (under
// session affinity, the client's last one while it holds), or 0 with the verdict.
static __always_inline int choose(struct service_key *key, struct address *client,
				  struct flow_value *chosen, int *verdict)
{
	struct service_value *service = bpf_map_lookup_elem(&sp_services, key);
	struct service_value *endpoint = NULL;
	struct affinity_key affinity_key = {};
	struct affinity_value *affinity;
	__u64 now = 0;
	__u32 count, timeout;

	*verdict = TC_ACT_OK;
	if (!service)
		return 0;
	count = service->count;
	timeout = service->affinity;
	if (count == 0) {
		if (service->flags & SP_DROP)
			*verdict = TC_ACT_SHOT;
		return 0;
	}
	chosen->flags = service->flags & SP_MASQUERADE;
	if (timeout) {
		affinity_key.client = *client;
		affinity_key.frontend = key->address;
		affinity_key.port = key->port;
		affinity_key.protocol = key->protocol;
		now = bpf_ktime_get_ns();
		affinity = bpf_map_lookup_elem(&sp_outside_affinity, &affinity_key);
		if (affinity_holds(affinity, now, timeout))
			endpoint = affine(key, count, affinity);
	}
	if (!endpoint) {
		key->slot = bpf_get_prandom_u32() % count + 1;
		endpoint = bpf_map_lookup_elem(&sp_services, key);
	}
	// A slot can be missing only while the agent shrinks the Service: the packet goes on
	// untranslated, as if unbalanced.
	if (!endpoint)
		return 0;
	if (timeout) {
		struct affinity_value last = {
			.used_ns = now,
			.address = endpoint->address,
			.port = endpoint->port,
			.slot = key->slot,
		};

		bpf_map_update_elem(&sp_outside_affinity, &affinity_key, &last, BPF_ANY);
	}
	chosen->endpoint = endpoint->address;
	chosen->port = endpoint->port;
	return 1;
}

// Makes sure the connection's replies are translated back to its Service address. The two maps
// drop their least recently used entries apart, so a known flow may have lost its reply entry;
// and a client port used again for another Service address on the same endpoint finds the
// earlier connection's. Either is written over, or the replies would leave with the wrong
// address.
static __always_inline void remember_reply(struct tuple *flow, struct flow_value *chosen)
{
	struct tuple reply = {
		.source = chosen->endpoint,
		.destination = flow->source,
		.source_port = chosen->port,
		.destination_port = flow->source_port,
		.protocol = flow->protocol,
	};
	struct reply_value original = {
		.frontend = flow->destination,
		.port = flow->destination_port,
	};

	struct reply_value *held = bpf_map_lookup_elem(&sp_replies, &reply);

	if (!held || !same_address(&held->frontend, &original.frontend) ||
	    held->port != original.port)
		bpf_map_update_elem(&sp_replies, &reply, &original, BPF_ANY);
}

SEC("classifier")
int sp_from_outside(struct __sk_buff *skb)
{
	struct packet p = {};
	struct flow_value chosen = {};
	struct flow_value *known;
	int verdict;

	if (!parse(skb, &p))
		return TC_ACT_OK;
	known = bpf_map_lookup_elem(&sp_flows, &p.tuple);
	// A connection keeps its endpoint, a client port used again included, while its entry
	// lasts, as a conntrack entry keeps its translation.
	if (known) {
		chosen = *known;
	} else {
		struct service_key key = {
			.address = p.tuple.destination,
			.port = p.tuple.destination_port,
			.protocol = p.tuple.protocol,
			.scope = SP_SCOPE_OUTSIDE,
		};

		if (!choose(&key, &p.tuple.source, &chosen, &verdict))
			return verdict;
		bpf_map_update_elem(&sp_flows, &p.tuple, &chosen, BPF_ANY);
	}
	remember_reply(&p.tuple, &chosen);
	// Each family's entries hold that family's endpoints; anything else is left alone.
	if (is_mapped(&chosen.endpoint) == p.ipv6)
		return TC_ACT_OK;
	if (chosen.flags & SP_MASQUERADE)
		skb->mark |= masquerade_mark;
	if (!rewrite(skb, &p, 1, chosen.endpoint, chosen.port))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

SEC("classifier")
int sp_to_outside(struct __sk_buff *skb)
{
	struct packet p = {};
	struct reply_value *original;

	if (!parse(skb, &p))
		return TC_ACT_OK;
	original = bpf_map_lookup_elem(&sp_replies, &p.tuple);
	if (!original)
		return TC_ACT_OK;
	if (!rewrite(skb, &p, 0, original->frontend, original->port))
		return TC_ACT_SHOT;
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
