//! Credentials the tests give splitproxy: a CA and the controller's TLS certificate (made with
//! the openssl CLI), and random bearer tokens for the manifests source's static tokens file.

use anyhow::{Context, Result, bail};
use std::{
    io::Read,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

/// Runs `openssl` with `args`, failing with its stderr.
///
/// # Errors
///
/// If openssl cannot run or fails.
pub fn openssl(args: &[&str]) -> Result<()> {
    let output = std::process::Command::new("openssl")
        .args(args)
        .output()
        .context("running openssl")?;
    if !output.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

fn path(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A self-signed CA (`<name>-ca.{crt,key}`) in `dir`, valid for two days.
///
/// # Errors
///
/// If openssl fails.
pub fn write_ca(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    openssl(&["genrsa", "-out", &path(&key), "2048"])?;
    openssl(&[
        "req",
        "-x509",
        "-new",
        "-key",
        &path(&key),
        "-days",
        "2",
        "-subj",
        &format!("/CN=splitproxy-e2e-{name}"),
        "-out",
        &path(&cert),
    ])?;
    Ok((cert, key))
}

/// A key and a certificate for `subject_alt_names` (e.g. `IP:10.0.0.1,DNS:x`) signed by the CA
/// `ca`: `<name>.{crt,key}` in `dir`.
///
/// # Errors
///
/// If openssl fails.
pub fn write_signed(
    dir: &Path,
    name: &str,
    ca: &(PathBuf, PathBuf),
    subject_alt_names: &str,
) -> Result<(PathBuf, PathBuf)> {
    let f = |suffix: &str| dir.join(format!("{name}.{suffix}"));
    openssl(&["genrsa", "-out", &path(&f("key")), "2048"])?;
    openssl(&[
        "req",
        "-new",
        "-key",
        &path(&f("key")),
        "-subj",
        &format!("/CN={name}"),
        "-out",
        &path(&f("csr")),
    ])?;
    std::fs::write(f("ext"), format!("subjectAltName={subject_alt_names}\n"))
        .context("writing the SAN extension")?;
    openssl(&[
        "x509",
        "-req",
        "-in",
        &path(&f("csr")),
        "-CA",
        &path(&ca.0),
        "-CAkey",
        &path(&ca.1),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &path(&f("ext")),
        "-out",
        &path(&f("crt")),
    ])?;
    Ok((f("crt"), f("key")))
}

/// The controller's TLS: the CA agents trust and the certificate the controller serves.
#[derive(Debug, Clone)]
pub struct ControllerTls {
    /// The CA certificate (`--controller-ca-file`).
    pub ca: PathBuf,
    /// The serving certificate (`--tls-cert-file`).
    pub cert: PathBuf,
    /// Its key (`--tls-private-key-file`).
    pub key: PathBuf,
}

impl ControllerTls {
    /// A new CA and a certificate for the controller at `ip`, in `dir`.
    ///
    /// # Errors
    ///
    /// If openssl fails.
    pub fn generate(dir: &Path, ip: Ipv4Addr) -> Result<Self> {
        let ca = write_ca(dir, "controller-ca")?;
        let (cert, key) = write_signed(dir, "controller", &ca, &format!("IP:{ip}"))?;
        Ok(Self {
            ca: ca.0,
            cert,
            key,
        })
    }

    /// The controller's flags serving with this certificate.
    #[must_use]
    pub fn controller_flags(&self) -> Vec<String> {
        vec![
            "--tls-cert-file".to_owned(),
            path(&self.cert),
            "--tls-private-key-file".to_owned(),
            path(&self.key),
        ]
    }

    /// The agent's flag trusting this CA.
    #[must_use]
    pub fn agent_flags(&self) -> Vec<String> {
        vec!["--controller-ca-file".to_owned(), path(&self.ca)]
    }
}

/// A random token: 32 hex digits from the kernel's random source.
///
/// # Errors
///
/// If `/dev/urandom` cannot be read.
pub fn random_token() -> Result<String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
