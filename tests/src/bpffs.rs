//! A BPF filesystem for one lab node's ebpf-mode pins, mounted in the test's own mount namespace
//! and unmounted (which drops every pin) when dropped.
//!
//! The agent would mount one itself, but under `ip netns exec` (as in a container) that mount
//! lives in the agent's own mount namespace and goes, with every pin, when the agent does: the
//! pins must outlive it, so the lab mounts the filesystem where the agent only finds it.

use anyhow::{Context, Result, ensure};
use std::path::Path;
use std::process::Command;

/// A mounted BPF filesystem in a temporary folder.
#[derive(Debug)]
pub struct BpfFs(tempfile::TempDir);

impl BpfFs {
    /// Mounts a fresh BPF filesystem.
    ///
    /// # Errors
    ///
    /// If the folder cannot be made or `mount` fails.
    pub fn mount() -> Result<Self> {
        let folder = tempfile::Builder::new()
            .prefix("splitproxy-bpffs-")
            .tempdir()
            .context("creating the BPF filesystem's folder")?;
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpffs"])
            .arg(folder.path())
            .status()
            .context("running mount")?;
        ensure!(status.success(), "cannot mount a BPF filesystem");
        Ok(Self(folder))
    }

    /// Where it is mounted.
    #[must_use]
    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for BpfFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}
