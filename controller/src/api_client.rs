//! The API server client both binaries start with.

/// A client from `--kubeconfig`, or else from the environment (`KUBECONFIG`, in-cluster, default
/// kubeconfig), sent to `master` when set.
///
/// # Errors
///
/// If no configuration is found or it is unusable.
pub async fn connect(
    kubeconfig: Option<&std::path::Path>,
    master: Option<http::Uri>,
) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let mut config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .context("loading kubeconfig")?
        }
        None => kube::Config::infer()
            .await
            .context("finding API server credentials (in-cluster or kubeconfig)")?,
    };
    if let Some(master) = master {
        config.cluster_url = master;
    }
    tracing::info!(api_server = %config.cluster_url, "reading the cluster from the API server");
    kube::Client::try_from(config).context("creating the API client")
}
