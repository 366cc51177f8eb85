//! The controller's own CA, kept in a Secret, from which each replica issues its serving
//! certificate at start: TLS between agents and controllers without a script a person runs or a
//! certificate manager the cluster may not have.
//!
//! The first replica to start makes the CA and writes it, as `tls.crt` and `tls.key` (the layout
//! cert-manager's CA issuer also reads), into the empty Secret `deploy/` ships, or into a new
//! `kubernetes.io/tls` Secret where there is none; replicas racing it take the one that won. The CA
//! certificate, public, is published as `ca.crt` in a ConfigMap of the same name, which agents
//! mount. Each replica's serving certificate lives only in its memory and lasts a year; the
//! replica exits well before it lapses so its restart issues a fresh one.

use k8s_openapi::{
    ByteString,
    api::core::v1::{ConfigMap, Secret},
};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::collections::BTreeMap;
use time::{Duration, OffsetDateTime};

/// How long the CA is valid. Agents trust it for as long; replacing it means deleting the Secret
/// and restarting the controllers.
const CA_VALIDITY: Duration = Duration::days(10 * 365);
/// How long a serving certificate is valid.
const SERVING_VALIDITY: Duration = Duration::days(365);
/// How long before its certificate lapses a replica exits to renew it, at the latest; a random
/// part of [`RENEWAL_SPREAD`] earlier still, so replicas started together do not restart
/// together.
const RENEWAL_MARGIN: Duration = Duration::days(30);
const RENEWAL_SPREAD: Duration = Duration::days(7);
/// Clock skew tolerated between the controller and agents.
const BACKDATE: Duration = Duration::hours(1);
/// The CA certificate's key in the Secret and the ConfigMap, and the key's in the Secret.
const CERT_KEY: &str = "tls.crt";
const PRIVATE_KEY_KEY: &str = "tls.key";
const PUBLISHED_KEY: &str = "ca.crt";
/// The field manager of the published ConfigMap.
const FIELD_MANAGER: &str = "splitproxy-controller";

/// Why the CA or a certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request (`what`: "creating Secret NAMESPACE/NAME").
    #[error("{0}")]
    Api(String, #[source] kube::Error),
    /// The Secret (`NAMESPACE/NAME`) exists but does not hold a usable CA.
    #[error("Secret {0} does not hold a CA certificate and key: {1}")]
    Unusable(String, String),
    /// A certificate could not be made.
    #[error("issuing a certificate")]
    Issue(#[from] rcgen::Error),
}

/// A CA: its certificate and private key, PEM.
#[derive(Clone)]
pub struct Ca {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

/// A serving certificate and its key, PEM, and when the certificate lapses.
pub struct Issued {
    /// The certificate followed by the CA's.
    pub chain_pem: String,
    /// The certificate's private key.
    pub key_pem: String,
    /// When the certificate lapses.
    pub not_after: OffsetDateTime,
}

impl Ca {
    /// A new CA valid from `now`.
    ///
    /// # Errors
    ///
    /// If the key or certificate cannot be made.
    pub fn generate(now: OffsetDateTime) -> Result<Self, Error> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "splitproxy-controller-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - BACKDATE;
        params.not_after = now + CA_VALIDITY;
        let cert = params.self_signed(&key)?;
        Ok(Self {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA certificate, PEM: what agents trust.
    #[must_use]
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A serving certificate for `names` (DNS names and IP addresses) valid from `now`.
    ///
    /// # Errors
    ///
    /// If a name is not a valid DNS name or IP address, or signing fails.
    pub fn issue(&self, names: &[String], now: OffsetDateTime) -> Result<Issued, Error> {
        let ca_key = KeyPair::from_pem(&self.key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params
            .distinguished_name
            .push(DnType::CommonName, "splitproxy-controller");
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = now - BACKDATE;
        params.not_after = now + SERVING_VALIDITY;
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Issued {
            chain_pem: format!("{}{}", cert.pem(), self.cert_pem),
            key_pem: key.serialize_pem(),
            not_after: params.not_after,
        })
    }

    fn from_secret(secret: &Secret, namespace: &str, name: &str) -> Result<Self, Error> {
        let unusable = |reason: String| Error::Unusable(format!("{namespace}/{name}"), reason);
        let text = |key: &str| {
            let bytes = secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .ok_or_else(|| unusable(format!("no {key}")))?;
            String::from_utf8(bytes.0.clone()).map_err(|_| unusable(format!("{key} is not PEM")))
        };
        let ca = Self {
            cert_pem: text(CERT_KEY)?,
            key_pem: text(PRIVATE_KEY_KEY)?,
        };
        // Fail here, naming the Secret, rather than at the first certificate.
        KeyPair::from_pem(&ca.key_pem)
            .and_then(|key| Issuer::from_ca_cert_pem(&ca.cert_pem, key).map(drop))
            .map_err(|err| unusable(err.to_string()))?;
        Ok(ca)
    }

    fn to_secret(&self, name: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/tls".to_owned()),
            data: Some(self.secret_data()),
            ..Secret::default()
        }
    }

    /// The certificate and key, as a Secret holds them.
    fn secret_data(&self) -> BTreeMap<String, ByteString> {
        BTreeMap::from([
            (
                CERT_KEY.to_owned(),
                ByteString(self.cert_pem.clone().into_bytes()),
            ),
            (
                PRIVATE_KEY_KEY.to_owned(),
                ByteString(self.key_pem.clone().into_bytes()),
            ),
        ])
    }
}

/// Checks that `name` may be in a serving certificate: an IP address or a DNS name.
///
/// # Errors
///
/// Says why it may not.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let label_ok = |label: &str| {
        (1..=63).contains(&label.len())
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() <= 253 && name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err(format!("{name:?} is neither an IP address nor a DNS name"))
    }
}

/// When a replica holding a certificate that lapses at `not_after` exits to renew it: between
/// [`RENEWAL_MARGIN`] and [`RENEWAL_MARGIN`] + [`RENEWAL_SPREAD`] before, by `spread` (0 to 1).
#[must_use]
pub fn renewal_time(not_after: OffsetDateTime, spread: f64) -> OffsetDateTime {
    not_after - RENEWAL_MARGIN - RENEWAL_SPREAD * spread.clamp(0.0, 1.0)
}

/// The CA in Secret `namespace/name`: the one there, or a new one written into it when it is
/// empty (`deploy/` ships it so, and the controllers need no right to create Secrets) or created
/// when there is none; then its certificate published as `ca.crt` in ConfigMap
/// `namespace/name`. Replicas racing to write it take the one that was written first.
///
/// # Errors
///
/// If the API server refuses, or the Secret holds no usable CA.
pub async fn load_or_create(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Ca, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let api_error = |action: &str, kind: &str, source| {
        Error::Api(format!("{action} {kind} {namespace}/{name}"), source)
    };
    let written_first = || async {
        let secret = secrets
            .get(name)
            .await
            .map_err(|err| api_error("reading", "Secret", err))?;
        Ca::from_secret(&secret, namespace, name)
    };
    let existing = secrets
        .get_opt(name)
        .await
        .map_err(|err| api_error("reading", "Secret", err))?;
    let (ca, written) = match existing {
        Some(secret) if !secret.data.as_ref().is_none_or(BTreeMap::is_empty) => {
            (Ca::from_secret(&secret, namespace, name)?, None)
        }
        // The empty Secret deploy/ ships: written with the resourceVersion read, so a replica
        // that wrote it meanwhile makes this write fail.
        Some(mut empty) => {
            let ca = Ca::generate(OffsetDateTime::now_utc())?;
            empty.data = Some(ca.secret_data());
            let replaced = secrets.replace(name, &PostParams::default(), &empty).await;
            (ca, Some(replaced.map(drop).map_err(|err| ("writing", err))))
        }
        None => {
            let ca = Ca::generate(OffsetDateTime::now_utc())?;
            let created = secrets
                .create(&PostParams::default(), &ca.to_secret(name))
                .await;
            (ca, Some(created.map(drop).map_err(|err| ("creating", err))))
        }
    };
    let ca = match written {
        None => ca,
        Some(Ok(())) => {
            tracing::info!(secret = %format!("{namespace}/{name}"), "wrote the controllers' CA");
            ca
        }
        Some(Err((_, kube::Error::Api(status)))) if status.code == 409 => written_first().await?,
        Some(Err((action, err))) => return Err(api_error(action, "Secret", err)),
    };
    let config_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": name },
        "data": { PUBLISHED_KEY: ca.cert_pem },
    });
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&config_map),
        )
        .await
        .map_err(|err| api_error("publishing", "ConfigMap", err))?;
    Ok(ca)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    #[test]
    fn a_ca_read_back_from_its_secret_issues_certificates() {
        let ca = Ca::generate(now()).expect("a CA");
        let read = Ca::from_secret(&ca.to_secret("ca"), "ns", "ca").expect("read back");
        let issued = read
            .issue(
                &["controller.ns.svc".to_owned(), "10.0.0.1".to_owned()],
                now(),
            )
            .expect("issued");
        assert!(issued.chain_pem.ends_with(ca.cert_pem()));
        assert_eq!(issued.not_after, now() + SERVING_VALIDITY);
    }

    #[test]
    fn a_secret_without_a_usable_ca_is_refused_by_name() {
        let mut secret = Ca::generate(now()).expect("a CA").to_secret("ca");
        if let Some(data) = secret.data.as_mut() {
            data.insert(PRIVATE_KEY_KEY.to_owned(), ByteString(b"junk".to_vec()));
        }
        let err = Ca::from_secret(&secret, "ns", "ca")
            .expect_err("unusable")
            .to_string();
        assert!(err.starts_with("Secret ns/ca does not hold"), "{err}");
        secret.data = None;
        let err = Ca::from_secret(&secret, "ns", "ca")
            .expect_err("unusable")
            .to_string();
        assert!(err.ends_with("no tls.crt"), "{err}");
    }

    #[test]
    fn names_are_ip_addresses_or_dns_names() {
        for good in [
            "splitproxy-controller.splitproxy-system.svc",
            "10.0.0.1",
            "fd00::1",
            "a",
        ] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        for bad in ["not a name", "", "a..b", "-a.b", "a_b.c", "https://a"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renewal_comes_a_month_or_more_before_the_end() {
        let end = now() + SERVING_VALIDITY;
        assert_eq!(renewal_time(end, 0.0), end - RENEWAL_MARGIN);
        assert_eq!(
            renewal_time(end, 1.0),
            end - RENEWAL_MARGIN - RENEWAL_SPREAD
        );
        assert_eq!(renewal_time(end, 7.0), renewal_time(end, 1.0));
    }
}
