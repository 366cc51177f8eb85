//! kube-proxy's nftables mode (`--proxy-mode nftables`): one `kube-proxy` table per IP family,
//! written with `nft -f -` transactions that change only what changed.
//!
//! This module holds the pure half, as the iptables backend splits its work:
//!
//! * [`render`] turns a [`ProxyState`](crate::ProxyState) into one family's table, kept per
//!   Service ([`Rendered`]), in kube-proxy v1.36's layout, names and hashes ([`names`]), so tools
//!   and operators that know upstream's table read ours unchanged;
//! * [`transaction()`] turns "what the kernel holds" and "what it should hold" into one `nft -f -`
//!   script: the whole table on the first sync and after a failure, otherwise only the changed
//!   Services' chains and the element-level differences of the shared sets and maps.
//!
//! Behaviour follows upstream's nftables proxier, which differs from its iptables mode on
//! purpose: no localhost node ports, every masquerade `fully-random`, no filter `ACCEPT` rules,
//! a reject for undefined ports of cluster IPs (and, given the service CIDRs, a drop for
//! unallocated cluster IPs), and the load-balancer source-range firewall applied before DNAT
//! whether or not the port has endpoints. Which endpoints a port uses, and drop versus reject,
//! come from the mode-neutral port plan (`port_plan.rs`), so both modes always agree on them.

pub mod backend;
pub mod names;
pub mod render;
mod script;
pub mod transaction;

pub use backend::NftablesBackend;
pub use render::{AffinitySet, Chain, Container, Element, Options, Rendered, ServiceRules, Slot};
pub use script::TABLE;
pub use transaction::{Counts, Leftovers, Transaction, delete_table, transaction};
