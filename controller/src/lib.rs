//! The splitproxy controller: reads the cluster once, computes each node's view and streams
//! deltas to the node agents.

pub mod admission;
pub mod agents;
pub mod api_client;
pub mod auth;
pub mod cause;
pub mod cli;
pub mod cluster;
pub mod digests;
pub mod eligibility;
pub mod fanout;
pub mod history;
pub mod inspection;
pub mod kubernetes;
pub mod manifests;
pub mod metrics;
pub mod nodes;
pub mod placement;
pub mod resources;
pub mod serving_ca;
pub mod serving_tls;
pub mod shares;
pub mod source;
pub mod topology;
pub mod view;
pub mod wire;
pub mod wiring;

#[cfg(test)]
mod testing;
