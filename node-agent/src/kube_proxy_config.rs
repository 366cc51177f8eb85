//! kube-proxy's configuration: its `--config` file (`KubeProxyConfiguration`,
//! kubeproxy.config.k8s.io/v1alpha1) or, without one, its flags; kube-proxy's defaults and
//! checks; the typed [`Settings`] the agent runs with.
//!
//! As kube-proxy v1.36.3: a file replaces every kube-proxy flag except `--hostname-override`,
//! `-v` and `--logging-format`. Unlike it, a field the schema does not have is refused, by name,
//! rather than logged and dropped.

mod defaults;
mod flags;
mod resolve;
mod wire;

pub use resolve::{
    ConntrackSettings, Invalid, InvalidConfiguration, IpvsSettings, LocalDetector, Settings,
};
pub use wire::KubeProxyConfiguration;

use crate::cli::Cli;
use std::path::{Path, PathBuf};

/// Why no configuration could be read.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("reading {0}")]
    Read(PathBuf, #[source] std::io::Error),
    /// The file is not a `KubeProxyConfiguration`: malformed, a field unknown or of the wrong
    /// type. `field` is where (`conntrack.maxPerCore`; `.` for the top level).
    #[error("{path}: {field}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where in it.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range or of the wrong form.
    #[error(transparent)]
    Invalid(#[from] InvalidConfiguration),
    /// The configuration could not be written (`--write-config-to`).
    #[error("writing {0}")]
    Write(PathBuf, #[source] std::io::Error),
}

/// The configuration `cli` describes: its `--config` file, or its flags, with kube-proxy's
/// defaults and the flags that override a file applied.
///
/// # Errors
///
/// When the file cannot be read or parsed, or a flag is malformed.
pub fn configuration(cli: &Cli) -> Result<KubeProxyConfiguration, Error> {
    let mut config = match &cli.config {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|err| Error::Read(path.clone(), err))?;
            let mut config = parse(&text).map_err(|(field, message)| Error::Parse {
                path: path.clone(),
                field,
                message,
            })?;
            defaults::apply(&mut config);
            config
        }
        None => flags::configuration(cli)?,
    };
    flags::override_file(cli, &mut config)?;
    defaults::apply_platform(&mut config);
    Ok(config)
}

/// Reads a `KubeProxyConfiguration` from YAML (or JSON); on failure, where and why.
///
/// # Errors
///
/// The path of the offending field (`.` for the top level) and the reason.
pub fn parse(text: &str) -> Result<KubeProxyConfiguration, (String, String)> {
    let deserializer = serde_norway::Deserializer::from_str(text);
    serde_path_to_error::deserialize(deserializer).map_err(|err| {
        let field = err.path().to_string();
        let message = err.inner().to_string();
        // serde_norway starts with the part of the path it knows; the full one is in front.
        let message = match message.split_once(": ") {
            Some((known, rest)) if field.starts_with(known) => rest.to_owned(),
            _ => message,
        };
        (field, message)
    })
}

/// Checks the configuration and returns the settings it gives.
///
/// # Errors
///
/// Every invalid value, each naming its field and flag.
pub fn resolve(config: &KubeProxyConfiguration) -> Result<Settings, InvalidConfiguration> {
    resolve::resolve(config)
}

/// Writes `config` as kube-proxy's `--write-config-to` does: YAML, keys in order, one sync
/// period pair (the mode's).
///
/// # Errors
///
/// When the file cannot be written.
pub fn write(config: &KubeProxyConfiguration, path: &Path) -> Result<(), Error> {
    let written = defaults::as_written(config);
    // Through a JSON value, whose maps sort their keys as Go's YAML writer does.
    let value = serde_json::to_value(&written)
        .map_err(|err| Error::Write(path.to_owned(), std::io::Error::other(err.to_string())))?;
    let text = serde_norway::to_string(&value)
        .map_err(|err| Error::Write(path.to_owned(), std::io::Error::other(err.to_string())))?;
    std::fs::write(path, text).map_err(|err| Error::Write(path.to_owned(), err))
}

/// What the agent ignores of a configuration because the controller does it, for one log
/// line: the API-server client's tuning and the resync period.
pub const MOOT_FIELDS: &str = "configSyncPeriod and clientConnection's qps, burst and content \
     types are accepted and unused: the controller watches the API server and streams this \
     node's view (clientConnection.kubeconfig and --master serve only --controller-service)";

#[cfg(test)]
mod tests;
