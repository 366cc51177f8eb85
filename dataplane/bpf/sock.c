// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// splitproxy's socket-layer load balancer: cgroup programs that send a socket aimed at a
// Service's address to one of its endpoints before any packet leaves, so in-node traffic pays
// no per-packet translation and no rule walk.
//
//   connect4      TCP and UDP connect(): picks an endpoint (the client's last one, under
//                 session affinity), remembers the Service address for the socket, rewrites the
//                 destination. A Service without endpoints is refused
//                 with ECONNREFUSED, as kube-proxy's REJECT rule answers; one whose endpoints are
//                 all elsewhere under internalTrafficPolicy Local with EPERM, where kube-proxy
//                 drops the packets (a socket hook cannot leave connect() waiting).
//   sendmsg4      unconnected UDP sendto() to a Service: the same, per message.
//   recvmsg4      UDP recvfrom() of an endpoint's reply: the source reads as the Service.
//   getpeername4  getpeername() of a redirected socket: the peer reads as the Service.
//
// The maps' layout is the agent's (dataplane/src/ebpf/layout.rs): change both together, and the
// layout version with them.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>

#define ECONNREFUSED 111

// A Service port's entry: slot 0 holds the number of endpoints, slots 1..count the endpoints.
struct service_key {
	__be32 address;
	__be16 port;
	__u8 protocol;
	__u8 pad;
	__u32 slot;
};

// Slot 0 with no endpoints: connections are dropped (EPERM) rather than refused.
#define SP_DROP 1

struct service_value {
	union {
		__be32 address;    // slot > 0: the endpoint's address
		__u32 affinity;    // slot 0: sessionAffinity ClientIP's timeout in seconds, or 0
	};
	__be16 port;     // slot > 0: the endpoint's port
	__u16 flags;     // slot 0: SP_DROP
	__u32 count;     // slot 0: the endpoints in slots 1..count
};

// What a redirected socket was aimed at, per socket (cookie) and endpoint.
struct reverse_key {
	__u64 cookie;
	__be32 address;
	__be16 port;
	__u16 pad;
};

struct reverse_value {
	__be32 address;
	__be16 port;
	__u16 pad;
};

// Under session affinity, a client's endpoint for a Service port. The socket layer sees no
// source address at connect(): a client is a network namespace, as a pod is one, and the
// node's own processes share one.
struct affinity_key {
	__u64 netns;
	__be32 address;
	__be16 port;
	__u8 protocol;
	__u8 pad;
};

struct affinity_value {
	__u64 used_ns;   // when the client last connected
	__be32 address;  // the endpoint
	__be16 port;
	__u16 pad;
	__u32 slot;      // where the endpoint was
	__u32 pad2;
};

// How many slots an affinity's endpoint is looked for in when it left its slot (the Service's
// endpoints changed); past them the client gets a new endpoint.
#define SP_AFFINITY_SCAN 64

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct service_key);
	__type(value, struct service_value);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sp_services SEC(".maps");

// Least recently used entries go first: a socket long closed needs no reverse translation.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct reverse_key);
	__type(value, struct reverse_value);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sp_reverse SEC(".maps");

// Least recently used entries go first: an affinity long unused has expired anyway.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct affinity_key);
	__type(value, struct affinity_value);
	__uint(max_entries, 1 << 16);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sp_affinity SEC(".maps");

// The Service port the program's context is aimed at, or NULL.
static __always_inline struct service_value *service_of(struct bpf_sock_addr *ctx,
							 struct service_key *key)
{
	__u32 protocol = ctx->protocol;

	if (protocol != IPPROTO_TCP && protocol != IPPROTO_UDP && protocol != IPPROTO_SCTP)
		return NULL;
	key->address = ctx->user_ip4;
	key->port = (__be16)ctx->user_port;
	key->protocol = (__u8)protocol;
	key->slot = 0;
	return bpf_map_lookup_elem(&sp_services, key);
}

static __always_inline int is_endpoint(struct service_value *slot, struct affinity_value *affinity)
{
	return slot && slot->address == affinity->address && slot->port == affinity->port;
}

// The slot of the Service port `key` names that holds the affinity's endpoint, or NULL when
// none of the first SP_AFFINITY_SCAN does; `key` is left on the slot found.
static __always_inline struct service_value *affine(struct service_key *key, __u32 count,
						     struct affinity_value *affinity)
{
	struct service_value *slot;
	__u32 i;

	key->slot = affinity->slot;
	slot = bpf_map_lookup_elem(&sp_services, key);
	if (is_endpoint(slot, affinity))
		return slot;
	for (i = 1; i <= SP_AFFINITY_SCAN; i++) {
		if (i > count)
			break;
		key->slot = i;
		slot = bpf_map_lookup_elem(&sp_services, key);
		if (is_endpoint(slot, affinity))
			return slot;
	}
	return NULL;
}

// Sends the socket to one of the Service's endpoints; returns 0 (refused) when it has none.
static __always_inline int balance(struct bpf_sock_addr *ctx)
{
	struct service_key key = {};
	struct service_value *service = service_of(ctx, &key);
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
		if (affinity && now - affinity->used_ns <= (__u64)timeout * 1000000000ULL)
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
	original.address = ctx->user_ip4;
	original.port = (__be16)ctx->user_port;
	reverse.cookie = bpf_get_socket_cookie(ctx);
	reverse.address = endpoint->address;
	reverse.port = endpoint->port;
	bpf_map_update_elem(&sp_reverse, &reverse, &original, BPF_ANY);
	ctx->user_ip4 = endpoint->address;
	ctx->user_port = endpoint->port;
	return 1;
}

// Makes an endpoint's address read as the Service it was reached through.
static __always_inline int translate_back(struct bpf_sock_addr *ctx)
{
	struct reverse_key reverse = {};
	struct reverse_value *original;

	reverse.cookie = bpf_get_socket_cookie(ctx);
	reverse.address = ctx->user_ip4;
	reverse.port = (__be16)ctx->user_port;
	original = bpf_map_lookup_elem(&sp_reverse, &reverse);
	if (original) {
		ctx->user_ip4 = original->address;
		ctx->user_port = original->port;
	}
	return 1;
}

SEC("cgroup/connect4")
int sp_connect4(struct bpf_sock_addr *ctx)
{
	return balance(ctx);
}

SEC("cgroup/sendmsg4")
int sp_sendmsg4(struct bpf_sock_addr *ctx)
{
	return balance(ctx);
}

SEC("cgroup/recvmsg4")
int sp_recvmsg4(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx);
}

SEC("cgroup/getpeername4")
int sp_getpeername4(struct bpf_sock_addr *ctx)
{
	return translate_back(ctx);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
