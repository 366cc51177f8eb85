//! Writes fuzzing seeds from real inputs: for each manifests file given, the revision the
//! controller would send `node-1` first (a reset with the file's valid Services), as the
//! length-delimited `SyncResponse` messages the agent fuzz target decodes. Files that do not
//! parse are skipped.
//!
//! `cargo run -p splitproxy-controller --example fuzz_seeds -- OUT_DIR MANIFEST...`

use anyhow::{Context, Result};
use prost::Message;
use splitproxy_controller::{
    cluster::{ClusterState, Objects, ServiceSelector},
    fanout::{EndpointSets, split},
    manifests::parse_documents,
    view::{Delta, EndpointForm, NodeView},
};
use std::path::{Path, PathBuf};

fn main() -> Result<()> {
    let mut args = std::env::args_os().skip(1).map(PathBuf::from);
    let out = args
        .next()
        .context("usage: fuzz_seeds OUT_DIR MANIFEST...")?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut written = 0;
    for manifest in args {
        let Some(seed) = seed(&manifest) else {
            continue;
        };
        let name = manifest.file_stem().context("manifest without a name")?;
        let path = out.join(name).with_extension("bin");
        std::fs::write(&path, seed).with_context(|| format!("writing {}", path.display()))?;
        written += 1;
    }
    println!("{written} seeds in {}", out.display());
    Ok(())
}

/// The encoded first revision for `node-1` of the manifests in `path`; `None` when the file
/// does not parse.
fn seed(path: &Path) -> Option<Vec<u8>> {
    let text = std::fs::read_to_string(path).ok()?;
    let objects = Objects::from_manifests(&parse_documents(&text).ok()?);
    let cluster = ClusterState::build(&objects, &ServiceSelector::default());
    let view = NodeView::for_node(&cluster, "node-1", EndpointForm::Cluster);
    let delta = Delta::between(&NodeView::default(), &view);
    let mut bytes = Vec::new();
    for message in split(
        delta,
        "seed",
        1,
        true,
        &cluster.encodings,
        EndpointSets::InPieces,
    ) {
        // Writing into a Vec cannot run out of space.
        message.encode_length_delimited(&mut bytes).ok()?;
    }
    Some(bytes)
}
