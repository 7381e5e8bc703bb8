//! `--client-ca`: the CA that client certificates must chain to on the webhook and extender
//! port, reloaded when its file changes. kube-apiserver presents a client certificate to a
//! webhook when its `AdmissionConfiguration` names a kubeconfig with one for the webhook's
//! host, and kube-scheduler to an extender with `tlsConfig.certFile`/`keyFile`
//! (`docs/install.md`, "Client certificates"). A client without one, or with another CA's, is
//! refused during the TLS handshake, before it can send a byte of HTTP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use super::{TlsError, certificates, read};

/// The client CA in use, and the file's contents it came from.
#[derive(Debug)]
pub struct ReloadingClientCa {
    path: PathBuf,
    current: RwLock<(Vec<u8>, Arc<dyn ClientCertVerifier>)>,
}

impl ReloadingClientCa {
    /// Loads the CA file (one or more PEM certificates); fails if it cannot be used now.
    pub fn load(path: PathBuf) -> Result<Self, TlsError> {
        let pem = read(&path)?;
        let verifier = verifier(&path, &pem)?;
        Ok(Self {
            path,
            current: RwLock::new((pem, verifier)),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The verifier for the CA in use.
    pub fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// Reloads when the file's contents differ from what is in use. Returns `Ok(true)` when
    /// a new CA is now in use.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let pem = read(&self.path)?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == pem {
            return Ok(false);
        }
        let verifier = verifier(&self.path, &pem)?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (pem, verifier);
        Ok(true)
    }
}

/// A verifier requiring a client certificate that chains to one of the CAs in `pem`.
fn verifier(path: &Path, pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let bad = |reason: String| TlsError::BadClientCa {
        path: path.to_path_buf(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in certificates(path, pem)? {
        roots.add(cert).map_err(|e| bad(e.to_string()))?;
    }
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .map_err(|e| bad(e.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ca() -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.self_signed(&key).unwrap().pem()
    }

    #[test]
    fn reloads_a_changed_ca_and_keeps_the_old_one_through_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("client-ca.crt");
        std::fs::write(&path, ca()).unwrap();
        let loaded = ReloadingClientCa::load(path.clone()).unwrap();
        let first = loaded.verifier();
        assert!(first.client_auth_mandatory());
        assert!(!loaded.reload_if_changed().unwrap());
        std::fs::write(&path, "garbage").unwrap();
        let err = loaded.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("holds no PEM certificate"), "{err}");
        assert!(Arc::ptr_eq(&first, &loaded.verifier()), "the old CA stays");
        std::fs::write(&path, ca()).unwrap();
        assert!(loaded.reload_if_changed().unwrap());
        assert!(!Arc::ptr_eq(&first, &loaded.verifier()));
        std::fs::remove_file(&path).unwrap();
        assert!(ReloadingClientCa::load(path).is_err());
    }
}
