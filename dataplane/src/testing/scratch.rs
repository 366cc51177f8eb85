//! Scratch folders for the fake tools executor tests run.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

/// A scratch folder for fake tools, removed on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("sp-dp-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(crate) fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).unwrap_or_default()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
