use super::*;
use crate::serving_ca::Ca;
use rustls::{ClientConfig, RootCertStore, pki_types::ServerName};
use time::OffsetDateTime;
use tokio_rustls::TlsConnector;

const NAME: &str = "controller.example";

fn issued(ca: &Ca) -> (Vec<u8>, Vec<u8>) {
    let issued = ca
        .issue(&[NAME.to_owned()], OffsetDateTime::now_utc())
        .expect("issued");
    (issued.chain_pem.into_bytes(), issued.key_pem.into_bytes())
}

/// A client trusting the CAs of `cas`, with no session of its own to resume (as each of an
/// agent's connections).
fn trusting(cas: &[&Ca]) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        let der = CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).expect("a CA PEM");
        roots.add(der).expect("a CA certificate");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_root_certificates(roots)
        .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// Whether a client trusting `cas` completes a handshake with `acceptor` and can exchange data
/// over it.
async fn handshake_succeeds(acceptor: &TlsAcceptor, cas: &[&Ca]) -> bool {
    let client = trusting(cas);
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server = {
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let mut tls = acceptor.accept(server_io).await.ok()?;
            let mut byte = [0];
            tls.read_exact(&mut byte).await.ok()?;
            tls.write_all(&byte).await.ok()
        })
    };
    let name = ServerName::try_from(NAME).expect("a name");
    let Ok(mut tls) = client.connect(name, client_io).await else {
        server.abort();
        return false;
    };
    let mut echoed = [0];
    let ok = tls.write_all(b"x").await.is_ok() && tls.read_exact(&mut echoed).await.is_ok();
    ok && server.await.ok().flatten().is_some()
}

#[tokio::test]
async fn new_connections_get_the_replaced_certificate_and_a_bundle_trusts_both() {
    let new_ca = || Ca::generate(OffsetDateTime::now_utc()).expect("CA");
    let (old_ca, new_ca) = (new_ca(), new_ca());
    let (chain, key) = issued(&old_ca);
    let certificate = ServingCertificate::from_pem(&chain, &key).expect("usable");
    let acceptor = certificate.acceptor().expect("acceptor");
    let (old_only, new_only, bundle) = ([&old_ca], [&new_ca], [&old_ca, &new_ca]);
    assert!(handshake_succeeds(&acceptor, &old_only).await);
    assert!(!handshake_succeeds(&acceptor, &new_only).await);
    assert!(handshake_succeeds(&acceptor, &bundle).await);

    let (chain, key) = issued(&new_ca);
    certificate.replace(&chain, &key).expect("replaced");
    assert!(!handshake_succeeds(&acceptor, &old_only).await);
    assert!(handshake_succeeds(&acceptor, &new_only).await);
    assert!(handshake_succeeds(&acceptor, &bundle).await);
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused_and_the_old_one_kept() {
    let ca = Ca::generate(OffsetDateTime::now_utc()).expect("CA");
    let (chain, key) = issued(&ca);
    let (_, other_key) = issued(&ca);
    let certificate = ServingCertificate::from_pem(&chain, &key).expect("usable");
    let before = certificate.resolve_current();
    let err = certificate
        .replace(&chain, &other_key)
        .expect_err("mismatched");
    assert!(matches!(err, Error::Key(_)), "{err:?}");
    assert!(Arc::ptr_eq(&before, &certificate.resolve_current()));
    assert!(matches!(
        ServingCertificate::from_pem(b"", &key),
        Err(Error::NoCertificate)
    ));
    assert!(matches!(
        ServingCertificate::from_pem(&chain, b"not a key"),
        Err(Error::NoKey(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn changed_files_are_served_and_a_half_written_pair_is_not() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = CertificateFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    let ca = Ca::generate(OffsetDateTime::now_utc()).expect("CA");
    let write = |(chain, key): &(Vec<u8>, Vec<u8>)| {
        std::fs::write(&files.cert, chain).expect("write");
        std::fs::write(&files.key, key).expect("write");
    };
    let first = issued(&ca);
    write(&first);
    let certificate = ServingCertificate::wait_for(&files).await.expect("read");
    tokio::spawn(Arc::clone(&certificate).follow(files.clone()));
    let served = |certificate: &ServingCertificate| certificate.resolve_current().cert[0].to_vec();
    let pem_der = |pem: &[u8]| CertificateDer::from_pem_slice(pem).expect("PEM").to_vec();
    assert_eq!(served(&certificate), pem_der(&first.0));

    // The certificate written, its key not yet: the pair does not match, the old one stays.
    let second = issued(&ca);
    std::fs::write(&files.cert, &second.0).expect("write");
    tokio::time::sleep(RELOAD_INTERVAL * 2).await;
    assert_eq!(served(&certificate), pem_der(&first.0));

    std::fs::write(&files.key, &second.1).expect("write");
    tokio::time::sleep(RELOAD_INTERVAL * 2).await;
    assert_eq!(served(&certificate), pem_der(&second.0));
}
