//! Protocol → model: bytes decoded as the length-delimited `SyncResponse` parts of one revision,
//! taken by the agent's state as it takes a revision from the stream, converted into the
//! dataplane model as the agent converts it, and rendered. Nothing may panic, and whatever the
//! conversion lets through must render to valid `iptables-restore` input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use splitproxy_agent::node_state::{Conversion, NodeState, Revision};
use splitproxy_dataplane::{NodeOptions, ProxyState};
use splitproxy_fuzz::check_render;
use splitproxy_proto::v1alpha1 as pb;

/// More parts than any input worth the time has.
const MAX_PARTS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data;
    let mut parts = Vec::new();
    while !bytes.is_empty() && parts.len() < MAX_PARTS {
        match pb::SyncResponse::decode_length_delimited(&mut bytes) {
            Ok(part) => parts.push(part),
            Err(_) => break,
        }
    }
    let Some(first) = parts.first() else {
        return;
    };
    let revision = Revision {
        epoch: first.controller_epoch.clone(),
        number: first.revision,
        reset: first.reset,
        on_presented_state: false,
        parts,
    };
    let Ok(state) = NodeState::default().apply(&revision) else {
        return;
    };
    // The node the seeds are written for (controller/examples/fuzz_seeds.rs).
    let model = Conversion::of(&state, "node-1").model;
    check_render(&ProxyState::default(), &model, &NodeOptions::default());
});
