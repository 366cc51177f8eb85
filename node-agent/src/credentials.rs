//! What the agent presents to controllers: the CA it trusts for `https://` controller URLs, and
//! the bearer token that tells a controller which node it is (see `docs/security.md`).

use std::path::PathBuf;
use tonic::{
    metadata::MetadataValue,
    transport::{Certificate, ClientTlsConfig, Endpoint},
};

/// The agent's credentials for controller streams.
#[derive(Clone, Default)]
pub struct Credentials {
    /// The file holding the token; read on every connection, as the kubelet rotates it.
    pub token_file: Option<PathBuf>,
    /// The file of CA certificates controllers' TLS certificates must chain to; without it,
    /// the system's trust roots are not used and `https://` controllers cannot be reached. Read
    /// on every connection: a controller-managed CA is published after the agent may start.
    pub ca_file: Option<PathBuf>,
    /// The name controllers' certificates must hold, when not the host of their URL (agents
    /// that find replicas by address check the Service's name).
    pub server_name: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token_file", &self.token_file)
            .field("ca_file", &self.ca_file)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// Why credentials could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    /// The token file cannot be read.
    #[error("reading the token file {0}")]
    Read(String, #[source] std::io::Error),
    /// The token is empty or not valid metadata text.
    #[error("the token file {0} holds no usable token")]
    Unusable(String),
    /// The CA file cannot be read.
    #[error("reading the controller CA file {0}")]
    ReadCa(String, #[source] std::io::Error),
    /// TLS could not be configured for the endpoint.
    #[error("configuring TLS")]
    Tls(#[source] tonic::transport::Error),
}

impl Credentials {
    /// `endpoint` with TLS when its URL is `https://`, trusting [`Self::ca_file`]'s CAs.
    ///
    /// # Errors
    ///
    /// If the CA file cannot be read or TLS cannot be configured.
    pub fn secure(&self, endpoint: Endpoint) -> Result<Endpoint, CredentialError> {
        if endpoint.uri().scheme_str() != Some("https") {
            return Ok(endpoint);
        }
        let mut tls = ClientTlsConfig::new();
        if let Some(file) = &self.ca_file {
            let pem = std::fs::read(file)
                .map_err(|err| CredentialError::ReadCa(file.display().to_string(), err))?;
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        if let Some(name) = &self.server_name {
            tls = tls.domain_name(name);
        }
        endpoint.tls_config(tls).map_err(CredentialError::Tls)
    }

    /// Adds `authorization: Bearer <token>` to `request` when a token file is configured.
    ///
    /// # Errors
    ///
    /// If the file cannot be read or holds no token; the error names the file, never the token.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) -> Result<(), CredentialError> {
        let Some(file) = &self.token_file else {
            return Ok(());
        };
        let name = file.display().to_string();
        let token =
            std::fs::read_to_string(file).map_err(|e| CredentialError::Read(name.clone(), e))?;
        let token = token.trim();
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .ok()
            .filter(|_| !token.is_empty())
            .ok_or(CredentialError::Unusable(name))?;
        request.metadata_mut().insert("authorization", value);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_is_read_fresh_for_each_request() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        let credentials = Credentials {
            token_file: Some(file.path().to_owned()),
            ..Credentials::default()
        };
        for token in ["first", "rotated"] {
            std::fs::write(file.path(), format!("{token}\n")).expect("write");
            let mut request = tonic::Request::new(());
            credentials.authorize(&mut request).expect("readable");
            assert_eq!(
                request
                    .metadata()
                    .get("authorization")
                    .map(|v| v.to_str().ok()),
                Some(Some(format!("Bearer {token}").as_str()))
            );
        }
    }

    #[test]
    fn unusable_token_files_are_named_without_content() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), "bad\ntoken\u{7f}").expect("write");
        let credentials = Credentials {
            token_file: Some(file.path().to_owned()),
            ..Credentials::default()
        };
        let err = credentials
            .authorize(&mut tonic::Request::new(()))
            .expect_err("control characters are not metadata");
        assert!(!err.to_string().contains("token\u{7f}"));
        std::fs::write(file.path(), "  \n").expect("write");
        assert!(matches!(
            credentials.authorize(&mut tonic::Request::new(())),
            Err(CredentialError::Unusable(_))
        ));
    }

    #[test]
    fn no_token_file_sends_no_authorization() {
        let mut request = tonic::Request::new(());
        Credentials::default()
            .authorize(&mut request)
            .expect("nothing to read");
        assert!(request.metadata().get("authorization").is_none());
    }
}
