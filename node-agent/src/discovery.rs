//! Finding the controller replicas through their Service's EndpointSlices, read straight from
//! the API server: no Service VIP (which only agents program) and no fixed node addresses, so
//! replicas may run on any node and move.
//!
//! The API server is reached as kube-proxy reaches it: the `clientConnection.kubeconfig` file
//! (`--kubeconfig`), its server replaced by `--master`, or the Pod's in-cluster credentials with
//! `--master` naming the real address. The list is read once per pass over the replicas, not
//! watched: a node costs the API server one list each time it has to reconnect.

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use rand::seq::SliceRandom;
use std::path::Path;

/// The label EndpointSlices carry naming their Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// The controller Service's port agents dial, by name; a Service with a single port may leave it
/// unnamed.
const PORT_NAME: &str = "grpc";

/// The controllers' Service, `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerService {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::str::FromStr for ControllerService {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{value:?} is not NAMESPACE/NAME")),
        }
    }
}

impl ControllerService {
    /// The name controllers' certificates are checked against: the Service's DNS name (never
    /// resolved: agents dial the replicas' addresses).
    #[must_use]
    pub fn server_name(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }
}

/// Why controllers could not be found.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig cannot be read or used.
    #[error("loading the kubeconfig {0}")]
    Kubeconfig(String, #[source] kube::config::KubeconfigError),
    /// No kubeconfig, and no in-cluster credentials.
    #[error("no --kubeconfig and no in-cluster credentials")]
    InCluster(#[source] kube::config::InClusterError),
    /// `--master` is not a URL.
    #[error("--master {0:?} is not a URL")]
    Master(String),
    /// The client cannot be built.
    #[error("creating the API client")]
    Client(#[source] kube::Error),
    /// The API server did not list the Service's EndpointSlices.
    #[error("listing the EndpointSlices of Service {0}")]
    List(String, #[source] kube::Error),
}

/// Lists a Service's ready endpoints as controller URLs.
#[derive(Clone)]
pub struct Discovery {
    client: kube::Client,
    api_server: String,
    service: ControllerService,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("api_server", &self.api_server)
            .field("service", &self.service)
            .finish_non_exhaustive()
    }
}

impl Discovery {
    /// A client for the API server as kube-proxy builds one: from `kubeconfig` if given, else
    /// in-cluster, with `master` replacing the server address.
    ///
    /// # Errors
    ///
    /// If no credentials can be found or `master` is not a URL.
    pub async fn new(
        kubeconfig: Option<&Path>,
        master: Option<&str>,
        service: ControllerService,
    ) -> Result<Self, Error> {
        let mut config = match kubeconfig {
            Some(path) => {
                let name = path.display().to_string();
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|err| Error::Kubeconfig(name.clone(), err))?;
                kube::Config::from_custom_kubeconfig(
                    file,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .map_err(|err| Error::Kubeconfig(name, err))?
            }
            None => kube::Config::incluster().map_err(Error::InCluster)?,
        };
        if let Some(master) = master {
            config.cluster_url = master
                .parse()
                .ok()
                .filter(|uri: &::http::Uri| uri.host().is_some())
                .ok_or_else(|| Error::Master(master.to_owned()))?;
        }
        let api_server = config.cluster_url.to_string();
        let client = kube::Client::try_from(config).map_err(Error::Client)?;
        Ok(Self {
            client,
            api_server,
            service,
        })
    }

    /// The API server's URL.
    #[must_use]
    pub fn api_server(&self) -> &str {
        &self.api_server
    }

    /// The Service looked up.
    #[must_use]
    pub fn service(&self) -> &ControllerService {
        &self.service
    }

    /// The ready replicas' URLs, in random order so nodes spread over the replicas.
    ///
    /// # Errors
    ///
    /// If the API server does not answer the list.
    pub async fn controllers(&self) -> Result<Vec<String>, Error> {
        let slices: Api<EndpointSlice> =
            Api::namespaced(self.client.clone(), &self.service.namespace);
        let params =
            ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={}", self.service.name));
        let list = slices.list(&params).await.map_err(|err| {
            Error::List(
                format!("{}/{}", self.service.namespace, self.service.name),
                err,
            )
        })?;
        let mut urls = controller_urls(&list.items);
        urls.shuffle(&mut rand::rng());
        Ok(urls)
    }
}

/// `https://ADDRESS:PORT` for every ready endpoint of `slices`, once each.
fn controller_urls(slices: &[EndpointSlice]) -> Vec<String> {
    let mut urls = Vec::new();
    for slice in slices {
        let ports = slice.ports.as_deref().unwrap_or_default();
        let port = ports
            .iter()
            .find(|port| port.name.as_deref() == Some(PORT_NAME))
            .or_else(|| ports.first().filter(|_| ports.len() == 1))
            .and_then(|port| port.port);
        let Some(port) = port else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            // Unset readiness counts as ready, as kube-proxy reads it.
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|conditions| conditions.ready)
                .unwrap_or(true);
            if !ready {
                continue;
            }
            for address in &endpoint.addresses {
                let host = if address.contains(':') {
                    format!("[{address}]")
                } else {
                    address.clone()
                };
                let url = format!("https://{host}:{port}");
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
        }
    }
    urls
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};

    fn endpoint(addresses: &[&str], ready: Option<bool>) -> Endpoint {
        Endpoint {
            addresses: addresses.iter().map(|a| (*a).to_owned()).collect(),
            conditions: Some(EndpointConditions {
                ready,
                ..EndpointConditions::default()
            }),
            ..Endpoint::default()
        }
    }

    fn slice(ports: &[(Option<&str>, i32)], endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            ports: Some(
                ports
                    .iter()
                    .map(|(name, port)| EndpointPort {
                        name: name.map(str::to_owned),
                        port: Some(*port),
                        ..EndpointPort::default()
                    })
                    .collect(),
            ),
            endpoints: Some(endpoints),
            ..EndpointSlice::default()
        }
    }

    #[test]
    fn ready_endpoints_on_the_grpc_port_become_urls() {
        let slices = [
            slice(
                &[(Some("metrics"), 9000), (Some("grpc"), 10660)],
                vec![
                    endpoint(&["10.0.0.1"], Some(true)),
                    endpoint(&["10.0.0.2"], Some(false)),
                    endpoint(&["10.0.0.3"], None),
                ],
            ),
            slice(
                &[(Some("grpc"), 10660)],
                vec![
                    endpoint(&["fd00::1"], Some(true)),
                    endpoint(&["10.0.0.1"], Some(true)),
                ],
            ),
        ];
        assert_eq!(
            controller_urls(&slices),
            [
                "https://10.0.0.1:10660",
                "https://10.0.0.3:10660",
                "https://[fd00::1]:10660"
            ]
        );
    }

    #[test]
    fn a_lone_unnamed_port_serves_but_an_ambiguous_slice_does_not() {
        let lone = slice(&[(None, 7000)], vec![endpoint(&["10.0.0.1"], None)]);
        let ambiguous = slice(
            &[(Some("a"), 1), (Some("b"), 2)],
            vec![endpoint(&["10.0.0.2"], None)],
        );
        assert_eq!(
            controller_urls(&[lone, ambiguous]),
            ["https://10.0.0.1:7000"]
        );
    }

    #[test]
    fn services_are_namespace_slash_name() {
        let service: ControllerService = "splitproxy-system/splitproxy-controller"
            .parse()
            .expect("valid");
        assert_eq!(
            service.server_name(),
            "splitproxy-controller.splitproxy-system.svc"
        );
        for bad in ["", "a", "/a", "a/", "a/b/c"] {
            assert!(bad.parse::<ControllerService>().is_err(), "{bad}");
        }
    }
}
