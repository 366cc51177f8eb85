// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// splitproxy's socket-layer load balancer: cgroup programs that send a socket aimed at a
// Service's address to one of its endpoints before any packet leaves, so in-node traffic pays
// no per-packet translation and no rule walk. Each program comes in an IPv4 and an IPv6 form.
//
//   connect4/6      TCP and UDP connect(): picks an endpoint (the client's last one, under
//                   session affinity), remembers the Service address for the socket, rewrites
//                   the destination. A Service without endpoints is refused with ECONNREFUSED,
//                   as kube-proxy's REJECT rule answers; one whose endpoints are all elsewhere
//                   under internalTrafficPolicy Local with EPERM, where kube-proxy drops the
//                   packets (a socket hook cannot leave connect() waiting).
//   sendmsg4/6      unconnected UDP sendto() to a Service: the same, per message.
//   recvmsg4/6      UDP recvfrom() of an endpoint's reply: the source reads as the Service.
//   getpeername4/6  getpeername() of a redirected socket: the peer reads as the Service.
//
// Addresses are held as IPv6 ones, IPv4 addresses mapped (::ffff:a.b.c.d), so one map serves
// both families, and an IPv6 socket aimed at an IPv4 Service's mapped address (a dual-stack
// client) finds it too.
//
// The maps' layout is the agent's (dataplane/src/ebpf/layout.rs): change both together, and the
// layout version with them.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "services.h"

#define ECONNREFUSED 111

// What a redirected socket was aimed at, per socket (cookie) and endpoint.
struct reverse_key {
	__u64 cookie;
	struct address address;
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct reverse_value {
	struct address address;
	__be16 port;
	__u16 pad;
};

// Under session affinity, a client's endpoint for a Service port. The socket layer sees no
// source address at connect(): a client is a network namespace, as a pod is one, and the
// node's own processes share one.
struct affinity_key {
	__u64 netns;
	struct address address;
	__be16 port;
	__u8 protocol;
	__u8 pad;
	__u32 pad2;
};

// What each redirected socket was aimed at.
SP_LRU_MAP(sp_reverse, struct reverse_key, struct reverse_value);

// Each client namespace's endpoint per Service port, under session affinity.
SP_LRU_MAP(sp_affinity, struct affinity_key, struct affinity_value);

// The destination of the context: `ipv6` says which family's fields hold it.
static __always_inline void destination(struct bpf_sock_addr *ctx, int ipv6, struct address *to)
{
	if (ipv6) {
		to->word[0] = ctx->user_ip6[0];
		to->word[1] = ctx->user_ip6[1];
		to->word[2] = ctx->user_ip6[2];
		to->word[3] = ctx->user_ip6[3];
	} else {
		to->word[0] = 0;
		to->word[1] = 0;
		to->word[2] = bpf_htonl(0xffff);
		to->word[3] = ctx->user_ip4;
	}
}

// Rewrites the destination of the context. An IPv4 socket takes only a mapped address (the
// agent never gives an IPv4 frontend another); it keeps its destination otherwise.
static __always_inline void redirect(struct bpf_sock_addr *ctx, int ipv6, struct address *to,
				     __be16 port)
{
	if (ipv6) {
		ctx->user_ip6[0] = to->word[0];
		ctx->user_ip6[1] = to->word[1];
		ctx->user_ip6[2] = to->word[2];
		ctx->user_ip6[3] = to->word[3];
	} else if (to->word[0] == 0 && to->word[1] == 0 && to->word[2] == bpf_htonl(0xffff)) {
		ctx->user_ip4 = to->word[3];
	} else {
		return;
	}
	ctx->user_port = port;
}

// The Service port the program's context is aimed at, or NULL.
static __always_inline struct service_value *service_of(struct bpf_sock_addr *ctx, int ipv6,
							 struct service_key *key)
{
	__u32 protocol = ctx->protocol;

	if (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP && protocol != IPPROTO_SCTP)
		return NULL;
	destination(ctx, ipv6, &key->address);
	key->port = (__be16)ctx->user_port;
	key->protocol = (__u8)protocol;
	key->scope = SP_SCOPE_NODE;
	key->slot = 0;
	return bpf_map_lookup_elem(&sp_services, key);
}

// Sends the socket to one of the Service's endpoints; returns 0 (refused) when it has none.
static __always_inline int balance(struct bpf_sock_addr *ctx, int ipv6)
{
	struct service_key key = {};
	struct service_value *service = service_of(ctx, ipv6, &key);
	struct service_value *endpoint = NULL;
	struct affinity_key client = {};
	struct affinity_value *affinity;
	struct reverse_key reverse = {};
	struct reverse_value original = {};
	__u64 now = 0;
	__u32 count, timeout;

	if (!service)
		return 1;
	count = service->count;
	timeout = service->affinity;
	if (count == 0) {
		if (!(service->flags & SP_DROP))
			bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	if (timeout) {
		client.netns = bpf_get_netns_cookie(ctx);
		client.address = key.address;
		client.port = key.port;
		client.protocol = key.protocol;
		now = bpf_ktime_get_ns();
		affinity = bpf_map_lookup_elem(&sp_affinity, &client);
		if (affinity_holds(affinity, now, timeout))
			endpoint = affine(&key, count, affinity);
	}
	if (!endpoint) {
		key.slot = bpf_get_prandom_u32() % count + 1;
		endpoint = bpf_map_lookup_elem(&sp_services, &key);
	}
	// A slot can be missing only while the agent shrinks the Service (the count goes down
	// first): the connection then goes on to the Service address, as if unbalanced.
	if (!endpoint)
		return 1;
	if (timeout) {
		struct affinity_value chosen = {
			.used_ns = now,
			.address = endpoint->address,
			.port = endpoint->port,
			.slot = key.slot,
		};

		bpf_map_update_elem(&sp_affinity, &client, &chosen, BPF_ANY);
	}
	original.address = key.address;
	original.port = key.port;
	reverse.cookie = bpf_get_socket_cookie(ctx);
	reverse.address = endpoint->address;
	reverse.port = endpoint->port;
	bpf_map_update_elem(&sp_reverse, &reverse, &original, BPF_ANY);
	redirect(ctx, ipv6, &endpoint->address, endpoint->port);
	return 1;
}

// Makes an endpoint's address read as the Service it was reached through.
static __always_inline int translate_back(struct bpf_sock_addr *ctx, int ipv6)
{
	struct reverse_key reverse = {};
	struct reverse_value *original;

	reverse.cookie = bpf_get_socket_cookie(ctx);
	destination(ctx, ipv6, &reverse.address);
	reverse.port = (__be16)ctx->user_port;
	original = bpf_map_lookup_elem(&sp_reverse, &reverse);
	if (original)
		redirect(ctx, ipv6, &original->address, original->port);
	return 1;
}

SEC("cgroup/connect4")
int sp_connect4(struct bpf_sock_addr *ctx)
{
	return balance(ctx, 0);
}

SEC("cgroup/connect6")
int sp_connect6(struct bpf_sock_addr *ctx)
{
	return balance(ctx, 1);
}

SEC("cgroup/sendmsg4")
int sp_sendmsg4(struct bpf_sock_addr *ctx)
{
	return balance(ctx, 0);
}

SEC("cgroup/sendmsg6")
int sp_sendmsg6(struct bpf_sock_addr *ctx)
{
	return balance(ctx, 1);
}

SEC("cgroup/recvmsg4")
int sp_recvmsg4(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx, 0);
}

SEC("cgroup/recvmsg6")
int sp_recvmsg6(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx, 1);
}

SEC("cgroup/getpeername4")
int sp_getpeername4(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx, 0);
}

SEC("cgroup/getpeername6")
int sp_getpeername6(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx, 1);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
