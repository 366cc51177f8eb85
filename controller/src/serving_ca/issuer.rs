//! The certificate sidecar of each controller Pod: reads the CA from the Secret volume only it
//! mounts and keeps a serving certificate for its replica in files the controller serves. It
//! issues one at start, and a new one when the signing CA changes (a rollover) or the
//! certificate nears its end. It has no API access and no port: the CA key is not within reach of
//! anything that talks to the network.

use super::{Ca, Error, Issued, kept};
use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};
use time::OffsetDateTime;

/// How often the CA files are read for a change: a kubelet updates a Secret volume within about
/// a minute of the Secret.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long the sidecar waits for a first CA before it exits. On a new cluster the Pod may start
/// before the Job fills the Secret; the kubelet then updates the volume only at its next sync
/// of the Pod, up to a minute or more later, while a container that exits makes it sync the Pod
/// (and refresh the volume) when it restarts it, 10 s later.
pub const FIRST_CA_PATIENCE: Duration = Duration::from_secs(15);

/// Where the sidecar reads the CA and writes the certificate, and the names it is for.
#[derive(Debug, Clone)]
pub struct Issuer {
    /// The mounted CA Secret: `tls.crt` and `tls.key`.
    pub ca_dir: PathBuf,
    /// Where the certificate, followed by the CA's, is written.
    pub cert_file: PathBuf,
    /// Where its private key is written.
    pub key_file: PathBuf,
    /// The DNS names and IP addresses the certificate is for.
    pub names: Vec<String>,
}

/// Why a certificate could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// A file could not be written or moved into place.
    #[error("writing {0}")]
    Io(String, #[source] io::Error),
}

impl Issuer {
    /// Keeps the certificate current; returns only when the container's restart is the remedy:
    /// no usable CA within [`FIRST_CA_PATIENCE`] of the start, or a certificate that cannot be
    /// issued from a usable CA (the names are wrong).
    ///
    /// # Errors
    ///
    /// Why it returned.
    pub async fn run(self) -> Result<(), Error> {
        let mut current: Option<(String, OffsetDateTime)> = None;
        let mut waiting = false;
        let started = tokio::time::Instant::now();
        loop {
            match self.read_ca() {
                Err(err) if current.is_none() && started.elapsed() >= FIRST_CA_PATIENCE => {
                    return Err(err);
                }
                Err(err) => {
                    if !std::mem::replace(&mut waiting, true) {
                        tracing::info!(
                            dir = %self.ca_dir.display(),
                            error = %splitproxy_telemetry::error_chain(&err),
                            "waiting for a usable CA"
                        );
                    }
                }
                Ok(ca) => {
                    waiting = false;
                    let now = OffsetDateTime::now_utc();
                    let due = current.as_ref().is_none_or(|(signer, renew_at)| {
                        signer != ca.cert_pem() || now >= *renew_at
                    });
                    if due {
                        let issued = ca.issue(&self.names, now)?;
                        match self.write(&issued) {
                            Ok(()) => {
                                tracing::info!(
                                    cert = %self.cert_file.display(),
                                    not_after = %issued.not_after,
                                    new_ca = current.is_some_and(|(signer, _)| signer != ca.cert_pem()),
                                    "issued the serving certificate"
                                );
                                current = Some((ca.cert_pem().to_owned(), issued.renew_at()));
                            }
                            Err(err) => tracing::warn!(
                                error = %splitproxy_telemetry::error_chain(&err),
                                "cannot write the serving certificate; trying again"
                            ),
                        }
                    }
                }
            }
            tokio::time::sleep(CHECK_INTERVAL).await;
        }
    }

    fn read_ca(&self) -> Result<Ca, Error> {
        let read = |key: &str| {
            let path = self.ca_dir.join(key);
            std::fs::read_to_string(&path).map_err(|err| {
                Error::Unusable(self.ca_dir.display().to_string(), format!("{key}: {err}"))
            })
        };
        Ca::from_pem(
            read(kept::CERT_KEY)?,
            read(kept::PRIVATE_KEY_KEY)?,
            &format!("the CA in {}", self.ca_dir.display()),
        )
    }

    /// Writes the key, then the certificate, each whole (written aside and renamed): the
    /// controller, reading them between the two, sees a pair that does not match and keeps the
    /// certificate before until the next read.
    fn write(&self, issued: &Issued) -> Result<(), WriteError> {
        replace_file(&self.key_file, issued.key_pem.as_bytes())?;
        replace_file(&self.cert_file, issued.chain_pem.as_bytes())
    }
}

fn replace_file(path: &Path, contents: &[u8]) -> Result<(), WriteError> {
    let error = |err| WriteError::Io(path.display().to_string(), err);
    let mut aside = path.as_os_str().to_owned();
    aside.push(".new");
    std::fs::write(&aside, contents).map_err(error)?;
    std::fs::rename(&aside, path).map_err(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving_ca::Kept;

    fn write_ca(dir: &Path, ca: &Ca) {
        for (key, value) in Kept::new(ca.clone()).to_data() {
            std::fs::write(dir.join(key), value.0).expect("write");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_ca_the_sidecar_exits_for_its_restart_to_refresh_the_volume() {
        let ca_dir = tempfile::tempdir().expect("temp dir");
        let issuer = Issuer {
            ca_dir: ca_dir.path().to_owned(),
            cert_file: ca_dir.path().join("out.crt"),
            key_file: ca_dir.path().join("out.key"),
            names: vec!["a".to_owned()],
        };
        let started = tokio::time::Instant::now();
        let err = issuer.run().await.expect_err("no CA");
        assert!(started.elapsed() >= FIRST_CA_PATIENCE);
        assert!(err.to_string().contains("tls.crt"), "{err}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_certificate_is_issued_from_the_mounted_ca_and_again_when_the_ca_changes() {
        let ca_dir = tempfile::tempdir().expect("temp dir");
        let out = tempfile::tempdir().expect("temp dir");
        let issuer = Issuer {
            ca_dir: ca_dir.path().to_owned(),
            cert_file: out.path().join("tls.crt"),
            key_file: out.path().join("tls.key"),
            names: vec!["controller.ns.svc".to_owned()],
        };
        tokio::spawn(issuer.clone().run());
        // No CA yet: nothing is written, and the sidecar waits.
        tokio::time::sleep(CHECK_INTERVAL * 2).await;
        assert!(!issuer.cert_file.exists());

        let first = Ca::generate(OffsetDateTime::now_utc()).expect("a CA");
        write_ca(ca_dir.path(), &first);
        tokio::time::sleep(CHECK_INTERVAL * 2).await;
        let served = || std::fs::read_to_string(&issuer.cert_file).expect("a certificate");
        let key = || std::fs::read(&issuer.key_file).expect("a key");
        let issued = served();
        assert!(issued.ends_with(first.cert_pem()));
        crate::serving_tls::check_pair(issued.as_bytes(), &key()).expect("a matching pair");
        // Nothing changed: the same certificate.
        tokio::time::sleep(CHECK_INTERVAL * 3).await;
        assert_eq!(served(), issued);

        let second = Ca::generate(OffsetDateTime::now_utc()).expect("a CA");
        write_ca(ca_dir.path(), &second);
        tokio::time::sleep(CHECK_INTERVAL * 2).await;
        assert!(served().ends_with(second.cert_pem()));
        crate::serving_tls::check_pair(served().as_bytes(), &key()).expect("a matching pair");
    }
}
