//! B3's objects in the real API server: the Services and EndpointSlices of a [`Shape`] created in
//! bulk, Nodes registered as a kubelet would, and the churn: one endpoint's `ready` flipped per
//! change, each in a different Service's slice.

use crate::cluster::{NAMESPACE, Shape};
use anyhow::{Context as _, Result};
use splitproxy_e2e::{control_plane::ControlPlane, lab::Lab};
use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// Creates the namespace, every Service and every EndpointSlice with one `kubectl create`
/// (create, not apply: apply would add a last-applied annotation to every object and so to
/// every watch event). Returns how long it took.
///
/// # Errors
///
/// If the file cannot be written or kubectl fails.
pub fn create(
    control_plane: &ControlPlane,
    lab: &Lab,
    shape: &Shape,
    dir: &Path,
) -> Result<Duration> {
    let mut yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n");
    for index in 0..shape.services {
        // Writing to a String cannot fail.
        let _ = write!(yaml, "---\n{}", shape.service_yaml(index, true));
    }
    let file = dir.join("objects.yaml");
    std::fs::write(&file, yaml).context("writing the objects to create")?;
    let start = Instant::now();
    control_plane.kubectl(lab, &["create", "-f", &file.to_string_lossy()])?;
    Ok(start.elapsed())
}

/// Sets the first endpoint of Services `0..changes` to `ready`, one JSON patch each, `interval`
/// apart. Returns when the last patch was accepted.
///
/// # Errors
///
/// If kubectl fails.
pub fn flip(
    control_plane: &ControlPlane,
    lab: &Lab,
    changes: usize,
    ready: bool,
    interval: Duration,
) -> Result<()> {
    for index in 0..changes {
        if index > 0 {
            std::thread::sleep(interval);
        }
        Shape::set_first_endpoint_ready(control_plane, lab, index, ready)?;
    }
    Ok(())
}

/// Registers `node` (Ready, with its address) and issues the token its splitproxy agent will
/// present, so that starting agents later costs the API server nothing extra. Returns the
/// token's path.
///
/// # Errors
///
/// If kubectl fails.
pub fn register_node(
    control_plane: &ControlPlane,
    lab: &Lab,
    node: &splitproxy_e2e::lab::Node,
) -> Result<PathBuf> {
    control_plane.register_node(lab, node)?;
    control_plane.agent_token(lab, node.name())
}
