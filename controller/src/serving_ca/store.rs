//! The CA Secret and its published trust bundle in the API server: what `splitproxy-ca keep` and
//! `splitproxy-ca rollover` run as their own ServiceAccount, the only one with rights on them.

use super::{Ca, Error, Kept, Step};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use time::OffsetDateTime;

/// The trust bundle's key in the published ConfigMap, which agents mount.
pub const PUBLISHED_KEY: &str = "ca.crt";
/// The field manager of the published ConfigMap.
const FIELD_MANAGER: &str = "splitproxy-ca";

/// The CA Secret `namespace/name` and the ConfigMap of the same name that publishes its trust
/// bundle.
pub struct Store {
    secrets: Api<Secret>,
    config_maps: Api<ConfigMap>,
    namespace: String,
    name: String,
}

impl Store {
    /// The objects named `name` in `namespace`.
    #[must_use]
    pub fn new(client: &kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            secrets: Api::namespaced(client.clone(), namespace),
            config_maps: Api::namespaced(client.clone(), namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }
    }

    fn secret_name(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn api_error(&self, action: &str, kind: &str) -> impl FnOnce(kube::Error) -> Error + '_ {
        let what = format!("{action} {kind} {}", self.secret_name());
        move |err| Error::Api(what, err)
    }

    /// The CA in the Secret: the one there, or a new one written into it when it is empty
    /// (`deploy/` ships it so, and nothing needs a right to create Secrets) or created when there
    /// is none; then its trust bundle published. Runs racing it take the one written first.
    ///
    /// # Errors
    ///
    /// If the API server refuses, or the Secret holds no usable CA.
    pub async fn keep(&self) -> Result<Kept, Error> {
        let existing = self
            .secrets
            .get_opt(&self.name)
            .await
            .map_err(self.api_error("reading", "Secret"))?;
        let kept = match existing {
            Some(secret) if secret.data.as_ref().is_some_and(|data| !data.is_empty()) => {
                self.read(&secret)?
            }
            existing => {
                let kept = Kept::new(Ca::generate(OffsetDateTime::now_utc())?);
                match self.write(existing, &kept).await {
                    Ok(()) => {
                        tracing::info!(secret = %self.secret_name(), "wrote a new CA");
                        kept
                    }
                    Err(Error::Api(_, kube::Error::Api(status))) if status.code == 409 => {
                        self.read(&self.get().await?)?
                    }
                    Err(err) => return Err(err),
                }
            }
        };
        self.publish(&kept).await?;
        Ok(kept)
    }

    /// Takes the next step of a rollover (starting one when none is under way) and publishes the
    /// trust bundle it leaves.
    ///
    /// # Errors
    ///
    /// If the API server refuses, the Secret holds no usable CA, or another run wrote it since it
    /// was read.
    pub async fn advance(&self) -> Result<Step, Error> {
        let secret = self.get().await?;
        let (kept, step) = self.read(&secret)?.next_step(OffsetDateTime::now_utc())?;
        self.write(Some(secret), &kept).await?;
        self.publish(&kept).await?;
        Ok(step)
    }

    async fn get(&self) -> Result<Secret, Error> {
        self.secrets
            .get(&self.name)
            .await
            .map_err(self.api_error("reading", "Secret"))
    }

    fn read(&self, secret: &Secret) -> Result<Kept, Error> {
        let empty = std::collections::BTreeMap::new();
        Kept::from_data(secret.data.as_ref().unwrap_or(&empty), &self.secret_name())
    }

    /// Writes `kept` into `existing` (with the resourceVersion it was read at, so a concurrent
    /// write makes this one fail), or into a new Secret when there is none.
    async fn write(&self, existing: Option<Secret>, kept: &Kept) -> Result<(), Error> {
        match existing {
            Some(mut secret) => {
                secret.data = Some(kept.to_data());
                self.secrets
                    .replace(&self.name, &PostParams::default(), &secret)
                    .await
                    .map(drop)
                    .map_err(self.api_error("writing", "Secret"))
            }
            None => {
                let secret = Secret {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    type_: Some("kubernetes.io/tls".to_owned()),
                    data: Some(kept.to_data()),
                    ..Secret::default()
                };
                self.secrets
                    .create(&PostParams::default(), &secret)
                    .await
                    .map(drop)
                    .map_err(self.api_error("creating", "Secret"))
            }
        }
    }

    async fn publish(&self, kept: &Kept) -> Result<(), Error> {
        let config_map = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": { "name": self.name },
            "data": { PUBLISHED_KEY: kept.trust_bundle() },
        });
        self.config_maps
            .patch(
                &self.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&config_map),
            )
            .await
            .map(drop)
            .map_err(self.api_error("publishing", "ConfigMap"))
    }
}
