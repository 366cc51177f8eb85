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

static __always_inline int same_address(struct address *a, struct address *b)
{
	return a->word[0] == b->word[0] && a->word[1] == b->word[1] && a->word[2] == b->word[2] &&
	       a->word[3] == b->word[3];
}

#endif
