//! Test support, compiled only for tests and behind the `testing` feature: never into the agent.
//!
//! - [`flow_table`]: the packet-flow table every backend is checked against, with its own address
//!   plan (one block for every row);
//! - [`tracer`]: a packet tracer over an `iptables-restore` payload, the iptables mode's oracle for
//!   that table;
//! - [`recording`]: a dataplane that records the states it is asked to apply, for in-process tests
//!   of the agent and the controller;
//! - for the crate's own unit tests: a model of the nftables kernel and its fixtures
//!   (`nftables`), a rule-text diff (`rules`), scratch folders for fake tools (`scratch`) and a
//!   replayable random sequence (`steps`).

#[cfg(test)]
pub(crate) mod fixtures;
pub mod flow_table;
#[cfg(test)]
pub(crate) mod nftables;
pub mod recording;
#[cfg(test)]
pub(crate) mod rules;
#[cfg(test)]
pub(crate) mod scratch;
#[cfg(test)]
pub(crate) mod steps;
pub mod tracer;
