//! What every source of cluster objects provides: the whole cluster, published after the first
//! complete read and again after every change.

use crate::cluster::Objects;
use std::future::Future;

/// A source of Services, EndpointSlices and Nodes.
pub trait Source: Send + 'static {
    /// Why the source stopped.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Calls `publish` with every object once the source has read the whole cluster, then again
    /// after each change. Runs until the source fails.
    fn run(
        self,
        publish: impl FnMut(Objects) + Send + 'static,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
