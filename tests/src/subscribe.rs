//! Subscribing to a controller's node view with the real grpcurl (over TLS, with the `.proto`
//! files, since the view port serves no reflection), as a rogue or misconfigured agent would.

use crate::lab::{HasNamespace, Lab};
use anyhow::Result;
use std::path::Path;

/// How the controller answered a subscription.
#[derive(Debug)]
pub struct Answer {
    /// Whether grpcurl exited successfully (the stream was served).
    pub served: bool,
    /// What grpcurl printed, stdout then stderr.
    pub output: String,
}

/// Subscribes as `node` to the controller at `address` (`host:port`), trusting `ca`,
/// presenting `token` as the bearer token when given, and returns the answer. grpcurl closes
/// its side after the subscribe, so an accepted stream ends after the first revision.
///
/// # Errors
///
/// If grpcurl cannot be run.
pub fn subscribe(
    lab: &Lab,
    from: &(impl HasNamespace + ?Sized),
    address: &str,
    ca: &Path,
    token: Option<&str>,
    node: &str,
) -> Result<Answer> {
    let proto = Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto");
    let request = format!(
        r#"{{"subscribe":{{"nodeName":"{node}","capabilities":{{"proxyMode":"PROXY_MODE_IPTABLES","ipFamilies":["IP_FAMILY_IPV4"]}}}}}}"#
    );
    let header = token.map(|token| format!("authorization: Bearer {token}"));
    let ca = ca.to_string_lossy();
    let proto = proto.to_string_lossy();
    let mut args = vec![
        "-cacert",
        &ca,
        "-import-path",
        &proto,
        "-proto",
        "splitproxy/v1alpha1/view.proto",
        "-max-time",
        "30",
        "-d",
        &request,
    ];
    if let Some(header) = &header {
        args.extend(["-H", header]);
    }
    args.extend([address, "splitproxy.v1alpha1.NodeViewService/Sync"]);
    let output = lab.exec(from, "grpcurl", &args)?;
    Ok(Answer {
        served: output.status.success(),
        output: format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    })
}
