//! What the CA Secret holds, and the steps of a rollover.
//!
//! A rollover replaces the CA without a moment in which a controller serves a certificate an
//! agent does not trust: first the new CA is added to what agents trust ([`Step::Staged`]), then,
//! once every agent has the bundle, it signs the serving certificates ([`Step::Switched`]), and
//! once every replica serves one of those, the old CA is dropped ([`Step::Finished`]). Each step
//! is written to the Secret, so a rollover cut short resumes where it stopped.

use super::{Ca, Error};
use k8s_openapi::ByteString;
use std::collections::BTreeMap;
use time::OffsetDateTime;

/// The signing CA's certificate and key in the Secret (the layout of a `kubernetes.io/tls`
/// Secret, which cert-manager's CA issuer also reads); what the certificate sidecar mounts.
pub const CERT_KEY: &str = "tls.crt";
/// See [`CERT_KEY`].
pub const PRIVATE_KEY_KEY: &str = "tls.key";
/// The CA a rollover brings in, before it signs.
const STAGED_CERT_KEY: &str = "staged.crt";
const STAGED_PRIVATE_KEY_KEY: &str = "staged.key";
/// The CA a rollover retires, still trusted until the rollover finishes (no key is kept).
const RETIRING_CERT_KEY: &str = "retiring.crt";

/// The CA Secret's contents.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The CA that signs serving certificates.
    pub signing: Ca,
    /// The CA a rollover added to the trust bundle and that signs next.
    pub staged: Option<Ca>,
    /// The certificate of the CA a rollover replaced, trusted until it finishes.
    pub retiring: Option<String>,
}

/// A step of a rollover, as [`Kept::next_step`] took it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// A new CA is trusted beside the signing one; it does not sign yet.
    Staged,
    /// The new CA signs; the old one is still trusted.
    Switched,
    /// Only the new CA is trusted: the rollover is over.
    Finished,
}

impl Kept {
    /// A Secret's contents with `ca` signing and trusted alone.
    #[must_use]
    pub fn new(ca: Ca) -> Self {
        Self {
            signing: ca,
            staged: None,
            retiring: None,
        }
    }

    /// The CA certificates agents are to trust, PEM: the signing one, then the staged or
    /// retiring one during a rollover.
    #[must_use]
    pub fn trust_bundle(&self) -> String {
        let mut bundle = self.signing.cert_pem().trim_end().to_owned();
        let other = (self.staged.as_ref().map(Ca::cert_pem)).or(self.retiring.as_deref());
        if let Some(other) = other {
            bundle.push('\n');
            bundle.push_str(other.trim_end());
        }
        bundle.push('\n');
        bundle
    }

    /// The rollover's step after this one, and the contents it leaves; a rollover starts when
    /// none is under way, with a CA made at `now`.
    ///
    /// # Errors
    ///
    /// If a new CA cannot be made.
    pub fn next_step(&self, now: OffsetDateTime) -> Result<(Self, Step), Error> {
        Ok(match (&self.staged, &self.retiring) {
            (Some(staged), _) => (
                Self {
                    signing: staged.clone(),
                    staged: None,
                    retiring: Some(self.signing.cert_pem().to_owned()),
                },
                Step::Switched,
            ),
            (None, Some(_)) => (Self::new(self.signing.clone()), Step::Finished),
            (None, None) => (
                Self {
                    signing: self.signing.clone(),
                    staged: Some(Ca::generate(now)?),
                    retiring: None,
                },
                Step::Staged,
            ),
        })
    }

    /// Whether a rollover is under way.
    #[must_use]
    pub fn rolling_over(&self) -> bool {
        self.staged.is_some() || self.retiring.is_some()
    }

    /// The contents of a Secret's `data` (`secret` names it in errors).
    ///
    /// # Errors
    ///
    /// If the signing or staged CA is missing or unusable.
    pub fn from_data(data: &BTreeMap<String, ByteString>, secret: &str) -> Result<Self, Error> {
        let text = |key: &str| -> Result<Option<String>, Error> {
            data.get(key)
                .map(|bytes| {
                    String::from_utf8(bytes.0.clone()).map_err(|_| {
                        Error::Unusable(secret.to_owned(), format!("{key} is not PEM"))
                    })
                })
                .transpose()
        };
        let ca = |cert: &str, key: &str| -> Result<Option<Ca>, Error> {
            match (text(cert)?, text(key)?) {
                (Some(cert_pem), Some(key_pem)) => Ca::from_pem(
                    cert_pem,
                    key_pem,
                    &format!("Secret {secret} ({cert}, {key})"),
                )
                .map(Some),
                (None, None) => Ok(None),
                (None, Some(_)) => Err(Error::Unusable(secret.to_owned(), format!("no {cert}"))),
                (Some(_), None) => Err(Error::Unusable(secret.to_owned(), format!("no {key}"))),
            }
        };
        let signing = ca(CERT_KEY, PRIVATE_KEY_KEY)?
            .ok_or_else(|| Error::Unusable(secret.to_owned(), format!("no {CERT_KEY}")))?;
        Ok(Self {
            signing,
            staged: ca(STAGED_CERT_KEY, STAGED_PRIVATE_KEY_KEY)?,
            retiring: text(RETIRING_CERT_KEY)?,
        })
    }

    /// The contents as a Secret's `data`.
    #[must_use]
    pub fn to_data(&self) -> BTreeMap<String, ByteString> {
        let bytes = |text: &str| ByteString(text.as_bytes().to_vec());
        let mut data = BTreeMap::from([
            (CERT_KEY.to_owned(), bytes(self.signing.cert_pem())),
            (PRIVATE_KEY_KEY.to_owned(), bytes(self.signing.key_pem())),
        ]);
        if let Some(staged) = &self.staged {
            data.insert(STAGED_CERT_KEY.to_owned(), bytes(staged.cert_pem()));
            data.insert(STAGED_PRIVATE_KEY_KEY.to_owned(), bytes(staged.key_pem()));
        }
        if let Some(retiring) = &self.retiring {
            data.insert(RETIRING_CERT_KEY.to_owned(), bytes(retiring));
        }
        data
    }
}

#[cfg(test)]
mod tests;
