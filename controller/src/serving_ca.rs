//! The controllers' own CA: TLS between agents and controllers without a script a person runs or
//! a certificate manager the cluster may not have, and with the CA's key out of the controller.
//!
//! The key lives in the Secret `deploy/` ships empty, which a one-shot Job fills ([`store::keep`])
//! and which nothing else may read: no ServiceAccount but the Job's has a right to it, and only
//! each controller Pod's certificate sidecar mounts it ([`issuer`]), a process with no API access
//! and no open port that issues its replica a short-lived serving certificate into a memory
//! volume, and a new one when the CA changes or the certificate nears its end. The controller
//! serves those files and reads them again when they change (`serving_tls`). The CA certificates
//! agents trust are published as `ca.crt` in a ConfigMap of the same name, which agents mount.
//! A rollover ([`store::advance`], [`Kept::next_step`]) goes through a trust bundle holding both
//! CAs, so that no agent ever meets a certificate it does not trust.

pub mod issuer;
mod kept;
pub mod store;

pub use kept::{Kept, Step};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

/// How long the CA is valid. Agents trust it for as long; a rollover replaces it sooner.
const CA_VALIDITY: Duration = Duration::days(10 * 365);
/// How long a serving certificate is valid: short, as a leaked serving key is good until then,
/// and renewal costs nothing (the sidecar writes a new one; the controller reads it).
const SERVING_VALIDITY: Duration = Duration::days(30);
/// How long before its end a serving certificate is replaced.
const RENEW_BEFORE: Duration = Duration::days(10);
/// Clock skew tolerated between the controller and agents.
const BACKDATE: Duration = Duration::hours(1);

/// Why the CA or a certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed a request (`what`: "creating Secret NAMESPACE/NAME").
    #[error("{0}")]
    Api(String, #[source] kube::Error),
    /// The Secret (`NAMESPACE/NAME`) exists but does not hold a usable CA.
    #[error("Secret {0} does not hold a CA certificate and key: {1}")]
    Unusable(String, String),
    /// A CA certificate or key is not usable PEM, or the key is not the certificate's (`what`
    /// says where they were read).
    #[error("{0} is not a usable CA: {1}")]
    Pem(String, String),
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

impl Issued {
    /// When the certificate is to be replaced: well before it lapses.
    #[must_use]
    pub fn renew_at(&self) -> OffsetDateTime {
        self.not_after - RENEW_BEFORE
    }
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

    /// The CA of `cert_pem` and `key_pem`, checked to sign with that key (`what` names them in
    /// the error).
    ///
    /// # Errors
    ///
    /// If either is not usable PEM, or the key is not the certificate's.
    pub fn from_pem(cert_pem: String, key_pem: String, what: &str) -> Result<Self, Error> {
        let unusable = |reason: String| Error::Pem(what.to_owned(), reason);
        KeyPair::from_pem(&key_pem)
            .and_then(|key| Issuer::from_ca_cert_pem(&cert_pem, key).map(drop))
            .map_err(|err| unusable(err.to_string()))?;
        crate::serving_tls::check_pair(cert_pem.as_bytes(), key_pem.as_bytes())
            .map_err(|err| unusable(splitproxy_telemetry::error_chain(&err)))?;
        Ok(Self { cert_pem, key_pem })
    }

    /// The CA certificate, PEM: what agents trust.
    #[must_use]
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's private key, PEM.
    #[must_use]
    pub fn key_pem(&self) -> &str {
        &self.key_pem
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    #[test]
    fn a_ca_read_back_from_its_pem_issues_certificates_renewed_well_before_their_end() {
        let ca = Ca::generate(now()).expect("a CA");
        let read = Ca::from_pem(ca.cert_pem.clone(), ca.key_pem.clone(), "the CA").expect("read");
        let issued = read
            .issue(
                &["controller.ns.svc".to_owned(), "10.0.0.1".to_owned()],
                now(),
            )
            .expect("issued");
        assert!(issued.chain_pem.ends_with(ca.cert_pem()));
        assert_eq!(issued.not_after, now() + SERVING_VALIDITY);
        assert!(issued.renew_at() > now() && issued.renew_at() < issued.not_after);
    }

    #[test]
    fn a_key_that_is_not_the_cas_is_refused_by_name() {
        let (ca, other) = (
            Ca::generate(now()).expect("a CA"),
            Ca::generate(now()).expect("a CA"),
        );
        for key in ["junk".to_owned(), other.key_pem] {
            let err = Ca::from_pem(ca.cert_pem.clone(), key, "Secret ns/ca").expect_err("unusable");
            assert!(err.to_string().starts_with("Secret ns/ca is not"), "{err}");
        }
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
}
