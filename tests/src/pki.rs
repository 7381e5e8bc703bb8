//! Throwaway TLS material for tests: a fresh CA with one certificate it signed (for a server or
//! a client), and a rustls client configuration that trusts a given CA.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A CA and a certificate and key it signed, PEM.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA's certificate.
    pub ca: String,
    /// The certificate it signed.
    pub cert: String,
    /// The certificate's private key.
    pub key: String,
}

/// A fresh CA and a serving certificate it signed for the DNS names `names` and 127.0.0.1.
pub fn serving(names: &[&str]) -> Pki {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("params");
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    signed(params)
}

/// A fresh CA and a client certificate it signed for the common name `name` (as kube-apiserver
/// or kube-scheduler present to a webhook).
pub fn client(name: &str) -> Pki {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    signed(params)
}

fn signed(params: CertificateParams) -> Pki {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).expect("CA");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let cert = params.signed_by(&key, &issuer).expect("certificate");
    Pki {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

/// A TLS client configuration (ring) that trusts only the certificates in `ca` (PEM) and
/// presents `client` (certificate and key, PEM) when given.
pub fn client_config(ca: &[u8], client: Option<(&[u8], &[u8])>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a CA certificate");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert)
                    .map(|c| c.expect("a PEM certificate"))
                    .collect(),
                PrivateKeyDer::from_pem_slice(key).expect("a PEM key"),
            )
            .expect("a client certificate"),
    }
}
