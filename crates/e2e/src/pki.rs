//! A throwaway CA and the scheduler extension's serving certificate, as an admin would make
//! with cert-manager or openssl (see docs/install.md).

use anyhow::Result;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

/// PEM: the CA, and a certificate with its key for the given DNS names.
#[derive(Debug, Clone)]
pub struct Pki {
    /// The CA certificate (what `caBundle` and the scheduler's `caFile` hold).
    pub ca: String,
    /// The server certificate.
    pub cert: String,
    /// Its key.
    pub key: String,
}

/// A fresh CA and a server certificate for `names`.
pub fn issue(names: &[&str]) -> Result<Pki> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = CertificateParams::new(names)?.signed_by(&key, &issuer)?;
    Ok(Pki {
        ca: ca_cert.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}
