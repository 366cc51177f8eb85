//! The `--config` file watched as kube-proxy watches it: written to or renamed, it makes the agent
//! stop with an error, so that its restart (the kubelet's, for a DaemonSet) reads the new
//! configuration. Rules stay in place meanwhile, as on any agent restart.

use notify::{EventKind, Watcher, event::ModifyKind};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc;

/// Why the agent stops.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file changed: a restart reads it again.
    #[error("the configuration file {0} was updated; exiting so that the restart reads it")]
    Updated(PathBuf),
    /// The file cannot be watched.
    #[error("watching the configuration file {0}")]
    Watch(PathBuf, #[source] notify::Error),
}

/// Whether `kind` is one kube-proxy exits on: a write (fsnotify's Write) or a rename (Rename).
/// Other events (attribute changes, a read, a removal) are let go, as upstream.
fn is_update(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Name(_) | ModifyKind::Any)
    )
}

/// Resolves with [`Error::Updated`] once `path` is written to or renamed, or with
/// [`Error::Watch`] at once when it cannot be watched.
pub async fn updated(path: &Path) -> Error {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // The receiver goes only when the agent stops.
        let _ = tx.send(event);
    })
    .and_then(|mut watcher| {
        watcher
            .watch(path, notify::RecursiveMode::NonRecursive)
            .map(|()| watcher)
    });
    // Kept alive while waiting: dropping it ends the watch.
    let _watcher = match watcher {
        Ok(watcher) => watcher,
        Err(err) => return Error::Watch(path.to_owned(), err),
    };
    while let Some(event) = rx.recv().await {
        match event {
            Ok(event) if is_update(&event.kind) => return Error::Updated(path.to_owned()),
            Ok(_) => {}
            Err(err) => return Error::Watch(path.to_owned(), err),
        }
    }
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_write_ends_the_wait_and_a_read_does_not() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("config.conf");
        std::fs::write(&path, "kind: KubeProxyConfiguration\n").expect("written");
        let watching = tokio::spawn({
            let path = path.clone();
            async move { updated(&path).await }
        });
        // Reads change nothing; the watch is set up by the time the read is done or soon after,
        // so the write comes later.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = std::fs::read(&path).expect("readable");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!watching.is_finished(), "a read stopped the agent");
        std::fs::write(&path, "kind: KubeProxyConfiguration\nmode: nftables\n").expect("written");
        let error = tokio::time::timeout(Duration::from_secs(30), watching)
            .await
            .expect("the write is noticed")
            .expect("the watch runs");
        assert!(matches!(error, Error::Updated(_)), "{error}");
    }

    #[tokio::test]
    async fn a_missing_file_cannot_be_watched() {
        let error = updated(Path::new("/nonexistent/config.conf")).await;
        assert!(matches!(error, Error::Watch(..)), "{error}");
    }
}
