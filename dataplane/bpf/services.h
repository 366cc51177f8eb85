// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
//
// The services map, which the socket programs (sock.c) and the packet programs (tc.c) both
// read: each object declares it, and the loader pins it once by name, so both see one map.
// Its layout is the agent's (dataplane/src/ebpf/layout.rs): change both together, and the
// layout version with them.

#ifndef SP_SERVICES_H
#define SP_SERVICES_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// An address in network order, an IPv4 one mapped.
struct address {
	__be32 word[4];
};

// Whose traffic an entry serves: the node's own sockets (sock.c), or packets arriving on the
// node's devices from outside (tc.c), which externalTrafficPolicy Local keeps on local endpoints.
#define SP_SCOPE_NODE 0
#define SP_SCOPE_OUTSIDE 1

// A Service port's entry: slot 0 holds the number of endpoints, slots 1..count the endpoints.
struct service_key {
	struct address address;
	__be16 port;
	__u8 protocol;
	__u8 scope;
	__u32 slot;
};

// Slot 0 with no endpoints: connections are dropped rather than refused.
#define SP_DROP 1
// Slot 0 of an outside entry: the client's address is masqueraded (externalTrafficPolicy
// Cluster), as kube-proxy's masquerade mark does.
#define SP_MASQUERADE 2

struct service_value {
	struct address address;  // slot > 0: the endpoint's address
	__be16 port;             // slot > 0: the endpoint's port
	__u16 flags;             // slot 0: SP_DROP, SP_MASQUERADE
	__u32 count;             // slot 0: the endpoints in slots 1..count
	__u32 affinity;          // slot 0: sessionAffinity ClientIP's timeout in seconds, or 0
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct service_key);
	__type(value, struct service_value);
	__uint(max_entries, 1 << 20);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} sp_services SEC(".maps");

// A map of per-connection or per-client state, pinned by name: 65,536 entries, the least
// recently used going first when it is full (a connection or client long idle needs it least).
#define SP_LRU_MAP(name, key_type, value_type)                                                \
	struct {                                                                              \
		__uint(type, BPF_MAP_TYPE_LRU_HASH);                                          \
		__type(key, key_type);                                                        \
		__type(value, value_type);                                                    \
		__uint(max_entries, 1 << 16);                                                 \
		__uint(pinning, LIBBPF_PIN_BY_NAME);                                          \
	} name SEC(".maps")

static __always_inline int same_address(struct address *a, struct address *b)
{
	return a->word[0] == b->word[0] && a->word[1] == b->word[1] && a->word[2] == b->word[2] &&
	       a->word[3] == b->word[3];
}

// Under session affinity, the endpoint a client last reached through a Service port. Each
// program keeps its own clients' (sock.c by network namespace, tc.c by address).
struct affinity_value {
	__u64 used_ns;           // when the client last connected
	struct address address;  // the endpoint
	__be16 port;
	__u16 pad;
	__u32 slot;              // where the endpoint was
};

// How many slots an affinity's endpoint is looked for in when it left its slot (the Service's
// endpoints changed); past them the client gets a new endpoint.
#define SP_AFFINITY_SCAN 64

static __always_inline int is_endpoint(struct service_value *slot, struct affinity_value *affinity)
{
	return slot && same_address(&slot->address, &affinity->address) &&
	       slot->port == affinity->port;
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

// Whether `affinity` still holds `now` under a `timeout` in seconds.
static __always_inline int affinity_holds(struct affinity_value *affinity, __u64 now, __u32 timeout)
{
	return affinity && now - affinity->used_ns <= (__u64)timeout * 1000000000ULL;
}

#endif
