//! A dataplane that records the states it is asked to apply instead of programming a kernel: for
//! in-process tests of the agent and the controller.

use crate::{Dataplane, ProxyState, SyncReport};
use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
};

/// Records every state it syncs; clones share the record.
#[derive(Debug, Clone, Default)]
pub struct RecordingDataplane {
    applied: Arc<Mutex<Vec<ProxyState>>>,
}

impl RecordingDataplane {
    /// The states synced so far, oldest first.
    #[must_use]
    pub fn applied(&self) -> Vec<ProxyState> {
        self.applied.lock().map(|a| a.clone()).unwrap_or_default()
    }
}

impl Dataplane for RecordingDataplane {
    type Error = Infallible;

    fn mode(&self) -> &'static str {
        "recording"
    }

    async fn sync(&mut self, state: &ProxyState) -> Result<SyncReport, Self::Error> {
        if let Ok(mut applied) = self.applied.lock() {
            applied.push(state.clone());
        }
        Ok(SyncReport::default())
    }
}
